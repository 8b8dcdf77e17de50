//! A task's inbox: user messages and human decisions sent from outside the runner (the
//! service's messages, approve, reject and reply routes; `skillstate say`). Posting one queues
//! the task, so a worker picks it up; the runner delivers them at a step boundary — a message
//! becomes part of the next step's observation, a decision settles the action it decides —
//! and marks each delivered in the same transaction that records what it became. Nothing
//! posted is lost: a queue claim settled while a message still waits leaves the task queued.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;

/// What an inbox entry asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// A user message: the next observation (a paused task takes it as its answer).
    Message,
    /// Run the action waiting for approval.
    Approve,
    /// Refuse the action waiting for approval; the text is the reason.
    Reject,
    /// Answer the question (or report on the action of unknown outcome) the task waits on.
    Reply,
}

impl MessageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageKind::Message => "message",
            MessageKind::Approve => "approve",
            MessageKind::Reject => "reject",
            MessageKind::Reply => "reply",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "message" => MessageKind::Message,
            "approve" => MessageKind::Approve,
            "reject" => MessageKind::Reject,
            "reply" => MessageKind::Reply,
            _ => return None,
        })
    }

    /// Whether this entry decides a pause (rather than adding to the conversation).
    pub fn is_decision(self) -> bool {
        !matches!(self, MessageKind::Message)
    }
}

/// An entry to post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    pub kind: MessageKind,
    pub text: String,
    /// Who sent it: an API key id, or a local user (`cli`).
    pub author: String,
}

/// A posted entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MessageRecord {
    /// Increasing per store; delivery order.
    pub id: i64,
    pub task_id: String,
    pub kind: MessageKind,
    pub text: String,
    pub author: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The step whose observation carried it (or whose action it decided); `None` while it
    /// waits.
    pub delivered_step: Option<u64>,
}

#[async_trait]
pub trait Inbox: Send + Sync {
    /// Appends `message` to `task`'s inbox with a `message` event and queues the task (claimable
    /// at once; a worker that holds it keeps it, and its claim stays queued while anything
    /// waits). One transaction. `NotFound` for an unknown task (full id).
    async fn post_message(&self, task: &str, message: &NewMessage) -> Result<MessageRecord>;
    /// The entries not delivered yet, oldest first.
    async fn pending_messages(&self, task: &str) -> Result<Vec<MessageRecord>>;
    /// Every entry, delivered or not, oldest first.
    async fn messages(&self, task: &str) -> Result<Vec<MessageRecord>>;
    /// Marks `ids` delivered at `step`, and when `observation` is given makes it the text of
    /// step `step`'s observation; a completed or failed task is reopened (running, outcome
    /// cleared) by it. One transaction: an id already delivered (or another task's) fails it with
    /// `StoreError::Corrupt` and nothing changes.
    async fn deliver_messages(
        &self,
        task: &str,
        step: u64,
        observation: Option<&str>,
        ids: &[i64],
    ) -> Result<()>;
}

/// The columns [`message_from_row`] reads.
pub(crate) const MESSAGE_COLUMNS: &str =
    "id, task_id, kind, text, author, created_at, delivered_step";

/// A `message` event's data: `{"id", "kind", "author"}` (the text is read through the task's
/// messages, which the same keys may read).
pub(crate) fn message_event_data(id: i64, message: &NewMessage) -> String {
    serde_json::json!({"id": id, "kind": message.kind.as_str(), "author": message.author})
        .to_string()
}

pub(crate) fn message_from_row<R: sqlx::Row>(row: &R) -> Result<MessageRecord>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let kind: String = row.try_get("kind")?;
    let delivered: Option<i64> = row.try_get("delivered_step")?;
    Ok(MessageRecord {
        id: row.try_get("id")?,
        task_id: row.try_get("task_id")?,
        kind: MessageKind::parse(&kind).ok_or_else(|| crate::StoreError::Decode {
            what: "inbox kind".into(),
            message: format!("`{kind}` is not message, approve, reject or reply"),
        })?,
        text: row.try_get("text")?,
        author: row.try_get("author")?,
        created_at: row.try_get("created_at")?,
        delivered_step: delivered.and_then(|step| u64::try_from(step).ok()),
    })
}

/// The error of delivering ids that are not all waiting entries of the task.
pub(crate) fn not_waiting(task: &str, step: u64) -> crate::StoreError {
    crate::StoreError::Corrupt {
        task: task.to_owned(),
        step,
        message: "a message to deliver is not waiting in the task's inbox (delivered already, or another task's)".into(),
    }
}
