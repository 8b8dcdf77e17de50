//! The work queue: batches of tasks claimed by workers under execution leases, whole-task
//! retries with backoff, and rate limits shared by every worker of a database.
//!
//! A task is claimable when it is queued (`queue = queued`), its `not_before` has passed, its
//! batch is open, and nobody holds its lease (or the lease expired). A claim takes the lease in
//! the same statement (PostgreSQL `FOR UPDATE SKIP LOCKED`; SQLite one `BEGIN IMMEDIATE`
//! transaction), so two workers never get the same task. The worker renews the lease while it
//! runs the task and settles the claim when the task completes, fails or pauses.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Result;
use crate::model::{LeaseClaim, LeaseInfo, NewTask, TaskStatus};

/// Where `Queue::submit_batch` reads a batch's tasks from, one at a time; an `Err` (a message
/// naming the input at fault) ends the submit with nothing stored.
pub type TaskFeed<'a> =
    &'a mut (dyn Iterator<Item = std::result::Result<QueuedTask, String>> + Send);

/// Tasks `submit_batch` takes from its feed at a time (and at most this many, twice, wait
/// serialised for the database: the memory a submit holds).
pub const SUBMIT_CHUNK: usize = 256;

/// What happens to the rest of a batch when one of its tasks fails for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Record the failure and go on with the other tasks.
    #[default]
    SkipAndLog,
    /// Stop the batch: workers claim none of its tasks until `batch reopen` or `batch retry`
    /// reopens it.
    Stop,
}

/// A rolling 60-second quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

impl RateLimit {
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none() && self.tokens_per_minute.is_none()
    }
}

/// A batch about to be submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    /// For people: the batch file's name, say.
    pub name: String,
    /// The batch settings as submitted (the parsed batch file), kept for status and reports.
    pub spec: Value,
    pub on_error: OnError,
    /// Whole-task retries after a failure (0 = none).
    pub max_retry: u32,
    /// Shared by every worker running this batch's tasks.
    pub rate_limit: RateLimit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Workers claim its queued tasks.
    Open,
    /// `on_error: stop` fired (or an operator stopped it): nothing more is claimed.
    Stopped,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    pub id: String,
    pub name: String,
    pub spec: Value,
    pub on_error: OnError,
    pub max_retry: u32,
    pub rate_limit: RateLimit,
    pub state: BatchState,
    pub stop_reason: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// One task to create and queue.
#[derive(Debug, Clone)]
pub struct QueuedTask {
    pub task: NewTask,
    pub initial_state: Value,
    /// A JSON object of labels (`{"file": "order-7.txt"}`), shown in reports.
    pub labels: Value,
    /// The tenant that owns the task, as the service's creates set it (`Tenancy`): its API
    /// keys see the task, and the batch once every task of it is the tenant's. `None`: a task
    /// of no tenant, which only the CLI (and `skillstate view`) sees.
    pub tenant: Option<String>,
}

/// Where a task stands in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Waiting to be claimed, or claimed and running under a lease.
    Queued,
    /// The queue is done with it: completed, failed for good, or paused for a human.
    Done,
}

/// A task a worker claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub task_id: String,
    pub batch_id: Option<String>,
    /// Whole-task retries already spent (0 on the first run).
    pub tries: u32,
    pub lease: LeaseInfo,
    /// The claim replaced a lease that had expired without being released (its holder died
    /// or stalled): a takeover.
    pub took_over: bool,
}

/// How a worker settles a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// The queue is done with the task.
    Done,
    /// Queue it again, claimable from `not_before` (unix ms), with one more try spent.
    RetryAt { not_before: i64 },
}

/// One task of a batch, with the figures reports are made of (summed from its journal).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchTask {
    pub id: String,
    /// `None` when the stored status is unreadable (`problem` is in `failure`).
    pub status: Option<TaskStatus>,
    pub queue: Option<QueueState>,
    pub tries: u32,
    pub labels: Value,
    /// Accepted steps.
    pub version: u64,
    pub outcome: Option<Value>,
    /// The last failure's reason, kept across retries.
    pub failure: Option<String>,
    /// Journal rows by verdict.
    pub accepted: u64,
    pub rejected: u64,
    /// Rejected answers that named an unknown tool or gave invalid tool arguments.
    pub tool_call_rejections: u64,
    /// Tool calls that returned an error (`ok = false`).
    pub tool_errors: u64,
    /// Actions whose outcome is unknown after a crash (`ok` NULL): not tool errors.
    pub outcome_unknown: u64,
    /// Sum of counted prompt tokens.
    pub prompt_tokens: u64,
    /// Sums of provider-reported usage (`input_tokens`, `output_tokens`), 0 when unreported.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub created_at: i64,
    /// First journal row, unix ms; `None` before the first answer.
    pub started_at: Option<i64>,
    pub updated_at: i64,
    /// Whether someone holds an unexpired lease on it now.
    pub leased: bool,
}

/// Queued tasks (`queue = queued`) by where they stand at one instant (`Queue::queue_depth`).
/// Each task counts once, in the first state that fits, in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Held under a live lease: a worker runs it (or the service holds it for a moment).
    pub running: u64,
    /// In a stopped batch: claimed no more until the batch is retried.
    pub stopped: u64,
    /// Waiting for a retry's backoff to end.
    pub backoff: u64,
    /// Claimable now.
    pub ready: u64,
}

impl QueueDepth {
    /// `(state, tasks)` for every state, zeros included.
    pub fn by_state(&self) -> [(&'static str, u64); 4] {
        [
            ("ready", self.ready),
            ("running", self.running),
            ("backoff", self.backoff),
            ("stopped", self.stopped),
        ]
    }

    /// Adds `tasks` to `state` (as the backends' query names it); an unknown name is ignored.
    pub(crate) fn add(&mut self, state: &str, tasks: i64) {
        let tasks = u64::try_from(tasks).unwrap_or(0);
        match state {
            "running" => self.running += tasks,
            "stopped" => self.stopped += tasks,
            "backoff" => self.backoff += tasks,
            "ready" => self.ready += tasks,
            _ => {}
        }
    }
}

/// The state of a queued task `t` at `{now}` for `queue_depth`, in `QueueDepth`'s order; one
/// query text for both backends (`{now}` is a parameter or the server's clock).
pub(crate) fn depth_query(now: &str) -> String {
    format!(
        "SELECT CASE \
             WHEN t.lease_token IS NOT NULL AND t.lease_expires_at > {now} THEN 'running' \
             WHEN EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open') THEN 'stopped' \
             WHEN t.not_before > {now} THEN 'backoff' \
             ELSE 'ready' END AS state, COUNT(*) AS tasks \
         FROM tasks t WHERE t.queue = 'queued' GROUP BY 1"
    )
}

/// The answer of `rate_acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Recorded in the window; go ahead.
    Granted,
    /// The window is full; ask again after this many milliseconds.
    Wait { ms: u64 },
}

#[async_trait]
pub trait Queue: Send + Sync {
    async fn create_batch(&self, batch: &NewBatch) -> Result<BatchRecord>;
    /// Creates the tasks and queues them in `batch`, in order; returns their ids in order. A
    /// failure leaves none of them behind (one transaction, or chunks rolled back together).
    async fn enqueue_tasks(&self, batch: &str, tasks: Vec<QueuedTask>) -> Result<Vec<String>>;
    /// Creates the batch and queues every task `tasks` yields, in order, in ONE transaction:
    /// when the feed yields an error (`StoreError::Feed`, its message as is), a statement
    /// fails or the process dies half-way, neither the batch nor any of its tasks is stored.
    /// The feed is read a chunk at a time while the transaction is open, so memory stays
    /// bounded whatever the number of tasks. Returns the batch and its tasks' ids, in order.
    async fn submit_batch(
        &self,
        batch: &NewBatch,
        tasks: TaskFeed<'_>,
    ) -> Result<(BatchRecord, Vec<String>)>;
    /// Finds a batch by full id or unique id prefix.
    async fn batch(&self, id_or_prefix: &str) -> Result<BatchRecord>;
    /// Newest first.
    async fn list_batches(&self) -> Result<Vec<BatchRecord>>;
    /// Claims the oldest claimable task (of `batch` only, when given), taking its lease for
    /// `ttl_ms` in the same atomic operation. `None` when nothing is claimable now.
    async fn claim_task(
        &self,
        claim: &LeaseClaim,
        ttl_ms: u64,
        batch: Option<&str>,
    ) -> Result<Option<Claimed>>;
    /// Ends the claim `token` holds on `task` and releases the lease, recording `failure` (the
    /// reason of the last failure) when given. `StoreError::LeaseLost` when `token` no longer
    /// holds the lease (another worker took over): nothing changes then.
    async fn settle_claim(
        &self,
        task: &str,
        token: &str,
        settle: &Settle,
        failure: Option<&str>,
    ) -> Result<()>;
    /// Stops a batch (full id): its queued tasks are claimed no more (running ones go on).
    /// Stopping a stopped batch keeps its first reason. `NoSuchBatch` for an unknown id.
    async fn stop_batch(&self, batch: &str, reason: &str) -> Result<()>;
    /// Reopens a batch (full id): open again, its stop reason cleared, its queued tasks
    /// claimable; no task is requeued (`requeue_failed` does that). An open batch stays open.
    /// Returns the batch as it now stands; `NoSuchBatch` for an unknown id.
    async fn reopen_batch(&self, batch: &str) -> Result<BatchRecord>;
    /// Queues again every task of `batch` that failed (status `failed`), claimable now, and
    /// reopens the batch. Returns how many were queued.
    async fn requeue_failed(&self, batch: &str) -> Result<u64>;
    /// Queues one task (full id) for workers, claimable at once (a waiting backoff is
    /// dropped); a worker holding it keeps it. `NotFound` for an unknown task.
    async fn queue_task(&self, task: &str) -> Result<()>;
    /// Every task of the batch, in creation order.
    async fn batch_tasks(&self, batch: &str) -> Result<Vec<BatchTask>>;
    /// When the next queued task (of `batch`, when given) becomes claimable: the end of its
    /// backoff or of the lease someone holds on it, so an idle worker knows how long to sleep.
    /// A time already past when one became claimable since the caller's claim; `None` when
    /// no queued task is left.
    async fn next_wakeup(&self, batch: Option<&str>) -> Result<Option<i64>>;
    /// A signal for idle workers to wait on instead of polling: its value changes whenever
    /// work may have become claimable (tasks queued, a message or an approval posted, a lease
    /// given back, a batch reopened), in any process. A change carries nothing to trust — the
    /// waiter claims, which reads the rows — and a missed one only delays work until the
    /// waiter's fallback poll. `None` (the default) when this store cannot tell: workers poll.
    async fn work_signal(&self) -> Result<Option<tokio::sync::watch::Receiver<u64>>> {
        Ok(None)
    }
    /// How many queued tasks are running, stopped, waiting on a backoff and ready, now: one
    /// counting query over the queued tasks (the service's `/metrics` asks at each scrape).
    async fn queue_depth(&self) -> Result<QueueDepth>;
    /// Records one request of `tokens` tokens in `scope`'s rolling 60-second window when it
    /// fits `limit`, in one transaction that serialises every caller of the scope (so many
    /// workers on many machines share one quota). Otherwise says how long to wait.
    async fn rate_acquire(
        &self,
        scope: &str,
        limit: &RateLimit,
        tokens: u64,
    ) -> Result<RateDecision>;
    /// Adds tokens learnt after the request (the answer's) to `scope`'s window.
    async fn rate_add_tokens(&self, scope: &str, tokens: u64) -> Result<()>;
}
