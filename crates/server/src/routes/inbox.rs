//! Talking to a task: messages, decisions on its pauses (approve, reject, reply), and resuming
//! it. Each is posted to the task's inbox (the store's `Inbox`) and queues the task; a worker
//! delivers it at the task's next step boundary (see docs/service.md, "Running as a service"). So the
//! routes answer 202 Accepted with the posted entry, and `GET …/messages` shows when each was
//! delivered.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use skillstate_runtime::{is_canceled, is_retryable};
use skillstate_store::{MessageKind, MessageRecord, NewMessage, TaskRecord, TaskStatus};
use utoipa::ToSchema;

use super::owned_task;
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiJson;
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{Redaction, TaskView, rfc3339};

/// Longest message, reason or reply, in bytes.
pub const MAX_TEXT: usize = 64 * 1024;

/// A message for the task.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    /// What the user says (1 to 65,536 bytes).
    pub text: String,
}

/// A refusal of the action waiting for approval.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// Why, shown to the model (may be empty).
    #[serde(default)]
    pub reason: String,
}

/// An approval; it carries nothing.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {}

/// What an inbox entry asks for.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MessageKindName {
    Message,
    Approve,
    Reject,
    Reply,
}

/// A message or decision sent to a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageView {
    /// Increasing; the order of delivery.
    pub id: i64,
    pub task: String,
    pub kind: MessageKindName,
    /// The message, reason or reply (write-only values of the state replaced by `[redacted]`).
    pub text: String,
    /// The API key id (or `cli`) that sent it.
    pub author: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The step whose observation carries it (a decision: the observation its action's result
    /// opens); null while it waits for a worker. A step the task has not taken yet when the
    /// task finished first: see `delivery`.
    pub delivered_step: Option<u64>,
    /// What became of it, read with the task as it is now.
    pub delivery: DeliveryName,
    /// The step the task finished at, when it is finished and never took `delivered_step`
    /// (`unshown`), or when the entry waits and the task is finished (a message reopens it).
    pub finished_at_step: Option<u64>,
    /// The same, in a sentence for people: `delivered at step 12`, `stored for step 31, but the
    /// task finished at step 30 without taking that step`, …
    pub summary: String,
}

/// What became of an inbox entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryName {
    /// No worker has taken it yet.
    Waiting,
    /// Step `delivered_step` exists and its observation shows it.
    Shown,
    /// It opens the observation of the step the task takes next (`delivered_step`).
    NextStep,
    /// Stored with the observation of step `delivered_step`, but the task finished (at
    /// `finished_at_step`) without taking that step: no model saw it. A message that reopens
    /// the task is shown with it, if the task takes that step.
    Unshown,
}

/// A task's messages and decisions, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageList {
    pub messages: Vec<MessageView>,
}

/// Whether `task` has finished: completed, failed or cancelled (nothing runs it until a
/// message reopens it).
fn finished(task: &TaskRecord) -> bool {
    matches!(task.status, TaskStatus::Completed | TaskStatus::Failed)
}

/// What became of `record`, given its task as it is now; the step the task finished at when
/// that matters; and a sentence saying so.
fn delivery_of(record: &MessageRecord, task: &TaskRecord) -> (DeliveryName, Option<u64>, String) {
    let last = task.version;
    let ended = if is_canceled(task) {
        "was cancelled"
    } else {
        "finished"
    };
    match record.delivered_step {
        None if finished(task) && !is_canceled(task) && record.kind == MessageKind::Message => (
            DeliveryName::Waiting,
            Some(last),
            format!(
                "waiting for a worker; the task finished at step {last}, and the worker reopens it with this message as the observation of step {} (a task whose environment's episode is over finishes again at once, without that step)",
                last + 1
            ),
        ),
        None if finished(task) => (
            DeliveryName::Waiting,
            Some(last),
            format!("waiting for a worker; the task {ended} at step {last}, so this has no effect"),
        ),
        None => (
            DeliveryName::Waiting,
            None,
            "waiting for a worker".to_owned(),
        ),
        Some(step) if step <= last => (
            DeliveryName::Shown,
            None,
            format!("delivered at step {step}"),
        ),
        Some(step) if finished(task) => (
            DeliveryName::Unshown,
            Some(last),
            format!(
                "stored for step {step}, but the task {ended} at step {last} without taking that step; no model saw it"
            ),
        ),
        Some(step) => (
            DeliveryName::NextStep,
            None,
            format!("delivered for step {step}, the task's next step"),
        ),
    }
}

impl MessageView {
    fn of(record: &MessageRecord, redaction: &Redaction, task: &TaskRecord) -> Self {
        let (delivery, finished_at_step, summary) = delivery_of(record, task);
        Self {
            id: record.id,
            task: record.task_id.clone(),
            kind: match record.kind {
                MessageKind::Message => MessageKindName::Message,
                MessageKind::Approve => MessageKindName::Approve,
                MessageKind::Reject => MessageKindName::Reject,
                MessageKind::Reply => MessageKindName::Reply,
            },
            text: redaction.text(record.text.clone()),
            author: record.author.clone(),
            created_at: rfc3339(record.created_at),
            delivered_step: record.delivered_step,
            delivery,
            finished_at_step,
            summary,
        }
    }
}

/// Sends the task a message.
///
/// A running task sees it in the observation of its next step; a task waiting for a reply
/// takes it as the reply; a task waiting for approval takes it as a refusal that shows the
/// message (the person wrote instead of approving); a completed or failed task is reopened
/// with it as its next observation. A cancelled task takes no messages (409).
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/messages",
    operation_id = "sendMessage",
    summary = "Send a task a message",
    tag = "inbox",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = MessageRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Posted; a worker delivers it at the task's next step", body = MessageView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task was cancelled", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Empty or too long text", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn send_message(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<MessageRequest>,
) -> Result<(StatusCode, axum::Json<MessageView>), ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    check_text(&request.text, "/text", false)?;
    if is_canceled(&task) {
        return Err(ApiError::conflict(
            "the task was cancelled; it takes no messages (fork it to continue from a step)",
        ));
    }
    post(&state, &caller, &task, MessageKind::Message, request.text).await
}

/// Lists a task's messages and decisions.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/messages",
    operation_id = "listMessages",
    summary = "List a task's messages and decisions",
    tag = "inbox",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "Oldest first, each with the step it was delivered for and what became of it (`delivery`, `summary`): a step a finished task never took is `unshown`, never `delivered at`", body = MessageList),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_messages(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<MessageList>, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    let redaction = Redaction::of_task(&task);
    let messages = state
        .store
        .messages(&task.id)
        .await?
        .iter()
        .map(|m| MessageView::of(m, &redaction, &task))
        .collect();
    Ok(axum::Json(MessageList { messages }))
}

/// Approves the action the task waits on.
///
/// A worker runs the action exactly once and the task continues. 409 unless the task is
/// waiting for approval, or when a decision on this pause is already waiting.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/approve",
    operation_id = "approveAction",
    summary = "Approve the action a task waits on",
    tag = "inbox",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = ApproveRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Posted; a worker runs the action and the task continues", body = MessageView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task is not waiting for approval, or a decision is already waiting", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body has members this route does not take (it takes `{}`)", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn approve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(_request): ApiJson<ApproveRequest>,
) -> Result<(StatusCode, axum::Json<MessageView>), ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    decide(&state, &task, TaskStatus::AwaitingApproval).await?;
    post(&state, &caller, &task, MessageKind::Approve, String::new()).await
}

/// Refuses the action the task waits on.
///
/// The action never runs; the refusal and its reason become the next observation and the
/// task continues. 409 unless the task is waiting for approval, or when a decision on this
/// pause is already waiting.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/reject",
    operation_id = "rejectAction",
    summary = "Refuse the action a task waits on",
    tag = "inbox",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = RejectRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Posted; the task continues from the refusal", body = MessageView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task is not waiting for approval, or a decision is already waiting", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Reason too long", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn reject(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<RejectRequest>,
) -> Result<(StatusCode, axum::Json<MessageView>), ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    check_text(&request.reason, "/reason", true)?;
    decide(&state, &task, TaskStatus::AwaitingApproval).await?;
    post(&state, &caller, &task, MessageKind::Reject, request.reason).await
}

/// Answers the question the task asked (or reports on an action of unknown outcome).
///
/// The answer becomes the next observation and the task continues. 409 unless the task is
/// waiting for a reply, or when a reply is already waiting.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/reply",
    operation_id = "replyToTask",
    summary = "Answer the question a task asked",
    tag = "inbox",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = MessageRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Posted; the task continues from the answer", body = MessageView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task is not waiting for a reply, or a reply is already waiting", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Empty or too long text", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn reply(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<MessageRequest>,
) -> Result<(StatusCode, axum::Json<MessageView>), ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    check_text(&request.text, "/text", false)?;
    decide(&state, &task, TaskStatus::AwaitingInput).await?;
    post(&state, &caller, &task, MessageKind::Reply, request.text).await
}

/// Resumes a task that stopped without finishing.
///
/// Queues a task a worker should continue: one that failed for a reason a retry can fix (the
/// model's server was down, every answer of a step was rejected; it gets a fresh retry
/// budget), or one left running by a runner that died. A task running now is left as it is
/// (202, nothing changes). 409 for a task that completed (send it a message to continue it),
/// waits for a human (approve, reject or reply), was cancelled, or failed for a reason a retry
/// cannot change (fork it from an earlier step).
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/resume",
    operation_id = "resumeTask",
    summary = "Resume a task that stopped",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 202, description = "Queued for a worker (or already running)", body = TaskView),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task cannot be resumed; the detail says what to do instead", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<(StatusCode, axum::Json<TaskView>), ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    match task.status {
        TaskStatus::Running => {}
        TaskStatus::Failed if is_canceled(&task) => {
            return Err(ApiError::conflict(
                "the task was cancelled; fork it to continue from a step",
            ));
        }
        TaskStatus::Failed if is_retryable(task.outcome.as_ref()) => {}
        TaskStatus::Failed => {
            return Err(ApiError::conflict(format!(
                "the task failed for `{}`, which a retry cannot change; fork it from an earlier step (POST /v1/tasks/{}/fork)",
                reason(&task).unwrap_or("unknown"),
                task.id
            )));
        }
        TaskStatus::Completed => {
            return Err(ApiError::conflict(format!(
                "the task completed; send it a message (POST /v1/tasks/{}/messages) to continue it",
                task.id
            )));
        }
        TaskStatus::AwaitingApproval | TaskStatus::AwaitingInput => {
            return Err(ApiError::conflict(format!(
                "the task is {}; decide its pause with approve, reject or reply",
                task.status.as_str()
            )));
        }
    }
    state.store.queue_task(&task.id).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(super::tasks::task_view(&state, &state.store.task(&task.id).await?).await?),
    ))
}

/// 422 for text that is empty (unless `may_be_empty`) or longer than [`MAX_TEXT`].
fn check_text(text: &str, pointer: &str, may_be_empty: bool) -> Result<(), ApiError> {
    let problem = if text.len() > MAX_TEXT {
        format!("is {} bytes; at most {MAX_TEXT} are accepted", text.len())
    } else if text.trim().is_empty() && !may_be_empty {
        "is empty; say something".to_owned()
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        "the request is not valid",
        vec![FieldError::new("invalid", pointer, problem)],
    ))
}

/// 409 unless the task waits in `status` with no decision on this pause waiting yet.
async fn decide(state: &AppState, task: &TaskRecord, status: TaskStatus) -> Result<(), ApiError> {
    if task.status != status {
        return Err(ApiError::conflict(format!(
            "the task is {}, not {}; there is nothing to decide",
            task.status.as_str(),
            status.as_str()
        )));
    }
    let waiting = state.store.pending_messages(&task.id).await?;
    if let Some(decision) = waiting.iter().find(|m| m.kind.is_decision()) {
        return Err(ApiError::conflict(format!(
            "a decision on this pause ({}, entry {}) is already waiting for a worker; see GET /v1/tasks/{}/messages",
            decision.kind.as_str(),
            decision.id,
            task.id
        )));
    }
    Ok(())
}

async fn post(
    state: &AppState,
    caller: &Caller,
    task: &TaskRecord,
    kind: MessageKind,
    text: String,
) -> Result<(StatusCode, axum::Json<MessageView>), ApiError> {
    let record = state
        .store
        .post_message(
            &task.id,
            &NewMessage {
                kind,
                text,
                author: caller.key_id.clone(),
            },
        )
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(MessageView::of(&record, &Redaction::of_task(task), task)),
    ))
}

fn reason(task: &TaskRecord) -> Option<&str> {
    task.outcome
        .as_ref()
        .and_then(|o| o.get("reason"))
        .and_then(serde_json::Value::as_str)
}
