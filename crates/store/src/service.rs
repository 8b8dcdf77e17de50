//! What the HTTP service needs from the store: API keys per tenant, tasks owned by tenants
//! (with idempotent creation and paged listing), and durable events.
//!
//! Tenancy: a task created through the service belongs to the tenant of the key that created
//! it; tasks created by the CLI belong to no tenant (`None`) and are not visible through
//! tenant keys. A tenant never learns whether another tenant's task exists.
//!
//! Events: every write that changes what a watcher would see (a task created, a step
//! committed, an answer rejected, an action's result, a status change, a message) appends one
//! event row in the SAME transaction as the write. Events have durable, opaque positions in
//! commit order: a reader that resumes after position `p` gets every later event exactly once
//! (no gap, no duplicate), across restarts, for as long as the task exists.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::collections::HashMap;

use crate::Result;
use crate::model::{NewTask, TaskRecord, TaskState, TaskStatus, TaskSummary};
use crate::queue::BatchRecord;

/// An API key about to be stored. Only a hash of its secret is ever stored; the secret is
/// shown to its creator once.
#[derive(Debug, Clone, PartialEq)]
pub struct NewKey {
    pub tenant: String,
    /// For people: who or what uses the key.
    pub label: String,
    /// Lower-case hex SHA-256 of the key's secret.
    pub secret_hash: String,
    /// Optional limits (for example JSON pointers the key may read or write); `None` = the
    /// tenant's full access.
    pub scopes: Option<Value>,
}

/// An API key as stored (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyRecord {
    pub id: String,
    pub tenant: String,
    pub label: String,
    pub scopes: Option<Value>,
    pub created_at: i64,
    /// Set once the key is revoked; a revoked key authenticates nothing.
    pub revoked_at: Option<i64>,
}

#[async_trait]
pub trait Keys: Send + Sync {
    /// Stores a new key; a second key with the same `secret_hash` is refused.
    async fn create_key(&self, key: &NewKey) -> Result<KeyRecord>;
    /// The key whose secret hashes to `secret_hash`, revoked or not; `None` when there is
    /// none.
    async fn key_by_hash(&self, secret_hash: &str) -> Result<Option<KeyRecord>>;
    /// [`Keys::key_by_hash`] of `secret_hash` and `Tasks::task_state` of `task`, read
    /// together where the backend can (SQLite: in one read transaction) — what the service's
    /// state routes read on every request. The task is read whatever the key, so the caller
    /// must check the key before it uses or reveals anything of the task.
    async fn key_and_task_state(
        &self,
        secret_hash: &str,
        task: &str,
    ) -> (Result<Option<KeyRecord>>, Result<TaskState>);
    /// Every key (of `tenant` when given), oldest first.
    async fn list_keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>>;
    /// Revokes the key named by full id or unique id prefix and returns it. Revoking a revoked
    /// key keeps its first revocation time. An unknown or ambiguous prefix is an error naming
    /// it.
    async fn revoke_key(&self, id_or_prefix: &str) -> Result<KeyRecord>;
}

/// Who owns a task created through the service.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOwner {
    pub tenant: String,
    /// A retried create with the same key (per tenant) returns the first task.
    pub idempotency_key: Option<String>,
    /// A JSON object of string labels (`{"team": "ops"}`), filterable in listings.
    pub labels: Value,
    /// The batch (full id) the task is queued in, when it is created as part of one.
    pub batch: Option<String>,
    /// The W3C `traceparent` of the request that created the task (already parsed and
    /// re-formatted by the caller), stored with it so that the worker that runs it continues
    /// the trace (`Tasks::trace_context`). `None` for an untraced request.
    pub trace_context: Option<String>,
}

/// One page of a task listing. Newest first; `after` is the id of the last task of the
/// previous page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskQuery {
    /// Only this tenant's tasks; `None` = every task (local tools only, never a tenant key).
    pub tenant: Option<String>,
    pub status: Option<TaskStatus>,
    /// The skill's name.
    pub skill: Option<String>,
    /// A label that must be present with this value.
    pub label: Option<(String, String)>,
    /// Only tasks of this batch (full id).
    pub batch: Option<String>,
    pub after: Option<String>,
    pub limit: u32,
}

/// One page of a tenant's batches. Newest first; `after` is the id of the last batch of the
/// previous page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchQuery {
    pub tenant: String,
    pub after: Option<String>,
    pub limit: u32,
}

/// A task's token figures, summed from every answer in its journal (rejected ones too: they
/// were paid for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskTotals {
    /// Journal rows: every answer, accepted or rejected.
    pub answers: u64,
    /// Prompt tokens counted locally (o200k_base).
    pub prompt_tokens: u64,
    /// Answer tokens counted locally; rows from before answers were counted add nothing.
    pub output_tokens: u64,
    /// Answers whose provider reported its usage.
    pub reported_answers: u64,
    /// Sums of the provider-reported `input_tokens` and `output_tokens` (0 when unreported).
    pub input_tokens_reported: u64,
    pub output_tokens_reported: u64,
}

#[async_trait]
pub trait Tenancy: Send + Sync {
    /// Creates a task owned by `owner.tenant`, with its labels. When this tenant already used
    /// `owner.idempotency_key`, nothing is created: the earlier task is returned with `false`.
    /// One transaction; two racing creates with one key make one task.
    async fn create_owned_task(
        &self,
        task: NewTask,
        initial_state: &Value,
        owner: &TaskOwner,
    ) -> Result<(TaskRecord, bool)>;
    /// The tenant that owns `task` (full id), `None` for tasks created outside the service.
    async fn task_tenant(&self, task: &str) -> Result<Option<String>>;
    async fn list_tasks_page(&self, query: &TaskQuery) -> Result<Vec<TaskSummary>>;
    /// The token totals of `tasks` (full ids) from their journals: one grouped query, however
    /// many tasks. A task without a journal row (or unknown) is absent from the answer.
    async fn task_totals(&self, tasks: &[String]) -> Result<HashMap<String, TaskTotals>>;
    /// The batches visible to `query.tenant`: those with at least one task and whose every
    /// task belongs to the tenant. Newest first.
    async fn list_batches_page(&self, query: &BatchQuery) -> Result<Vec<BatchRecord>>;
    /// The tenant a batch (full id) is visible to: `Some` when it has tasks and they all
    /// belong to one tenant, `None` otherwise (no task, a task of no tenant, or tasks of
    /// several). `StoreError::NoSuchBatch` for an unknown batch.
    async fn batch_tenant(&self, batch: &str) -> Result<Option<String>>;
}

/// What an event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// `data`: `{"skill", "model"}`.
    Created,
    /// An accepted step: `{"step", "patch", "action", "author"}` (`author` null for the model).
    Step,
    /// A rejected answer: `{"step", "attempt", "errors"}`.
    Rejected,
    /// An action's result: `{"step", "ok"}`.
    Action,
    /// The task's status changed: `{"status", "outcome"}`.
    Status,
    /// A user message was added: `{"author"}`.
    Message,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Step => "step",
            EventKind::Rejected => "rejected",
            EventKind::Action => "action",
            EventKind::Status => "status",
            EventKind::Message => "message",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "created" => EventKind::Created,
            "step" => EventKind::Step,
            "rejected" => EventKind::Rejected,
            "action" => EventKind::Action,
            "status" => EventKind::Status,
            "message" => EventKind::Message,
            _ => return None,
        })
    }
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRecord {
    /// Durable and opaque: pass it back as `EventQuery::after` (the SSE `id`).
    pub position: String,
    pub task: String,
    pub tenant: Option<String>,
    pub kind: EventKind,
    /// The task's version when the event was written.
    pub step: u64,
    pub data: Value,
    pub created_at: i64,
}

/// Which events to read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventQuery {
    /// Only events of this tenant's tasks.
    pub tenant: Option<String>,
    /// Only events of this task (full id).
    pub task: Option<String>,
    /// Only events after this position (`None`: from the first).
    pub after: Option<String>,
    pub limit: u32,
}

#[async_trait]
pub trait Events: Send + Sync {
    /// Events after `query.after` in commit order, at most `query.limit`. An event is returned
    /// only when no event before it can still become visible, so resuming from the last
    /// returned position never skips or repeats one. A malformed position is an error naming
    /// it.
    async fn events_after(&self, query: &EventQuery) -> Result<Vec<EventRecord>>;
    /// The position of the last event readable now among those `query` selects (its `after`
    /// and `limit` are ignored): resuming after it yields only events that become readable
    /// later, none missed. `None` when there is none yet (resume from the first then).
    async fn latest_event_position(&self, query: &EventQuery) -> Result<Option<String>>;
}
