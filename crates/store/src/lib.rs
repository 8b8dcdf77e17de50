//! Durable task state and the step journal, behind one trait (README, "Storage and durable
//! execution").
//!
//! Invariants every backend keeps:
//! - an accepted step (journal row, new state and version, action intent) is ONE transaction;
//! - a state write names the version it replaces; a stale writer gets `Conflict`, never a lost
//!   update;
//! - the journal is append-only; time travel rebuilds states from patches and checks each
//!   recorded hash.

mod history;
mod migrate;
mod model;
mod postgres;
mod queue;
mod rows;
mod sqlite;
pub mod time;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

pub use history::state_at;
pub use model::*;
pub use postgres::PostgresStore;
pub use queue::*;
pub use sqlite::{SqliteStore, Synchronous};

pub const DEFAULT_DB: &str = "skillstate.db";
/// Full state snapshots are written every this many steps (plus step 0).
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 100;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {location}: {message}")]
    Open { location: String, message: String },
    #[error("no task matches `{0}`; list tasks with `skillstate tasks`")]
    NotFound(String),
    #[error("`{prefix}` matches {count} tasks; give more characters of the id")]
    Ambiguous { prefix: String, count: usize },
    #[error(
        "task {task} is at version {actual}, not {expected}: another writer committed first; reload the task and retry"
    )]
    Conflict {
        task: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "the database schema is version {found}, newer than this skillstate supports ({supported}); upgrade skillstate"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("task {task}: the journal is inconsistent at step {step}: {message}")]
    Corrupt {
        task: String,
        step: u64,
        message: String,
    },
    #[error(
        "task {task}: the journal before step {step} was compacted by `skillstate gc`; that state is no longer kept"
    )]
    Compacted { task: String, step: u64 },
    #[error("task {task}: step {step} does not exist (the task has {version} accepted steps)")]
    NoSuchStep {
        task: String,
        step: u64,
        version: u64,
    },
    #[error("stored {what} is unreadable: {message}")]
    Decode { what: String, message: String },
    #[error(
        "task {task} is being run by {} since {} ({}); only one process may drive a task at a time. Wait for it to finish or stop it; if it died, another process can take the task over when its lease expires at {} (the lease is renewed while it runs)",
        .lease.holder,
        time::utc(.lease.acquired_at),
        time::ago(.lease.acquired_at),
        time::utc(.lease.expires_at)
    )]
    Leased { task: String, lease: Box<LeaseInfo> },
    #[error(
        "task {task}: this process lost its execution lease (it was not renewed in time and another runner may have taken the task over); stopped without writing more"
    )]
    LeaseLost { task: String },
    #[error(
        "{location} holds no skillstate database yet (read-only commands do not create one); run a task with this --db first, or check the location"
    )]
    NoSchema { location: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[async_trait]
pub trait Store: Queue + Send + Sync {
    /// Creates a task at version 0 with its initial state, snapshot and opening observation.
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord>;
    /// Finds a task by full id or unique id prefix.
    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord>;
    async fn list_tasks(&self) -> Result<Vec<TaskSummary>>;
    /// Appends a rejected answer; the state is untouched.
    async fn record_rejection(&self, task: &str, entry: &JournalEntry) -> Result<()>;
    /// Commits an accepted step atomically, if the task is still at `expected_version`.
    async fn commit_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()>;
    /// Records a tool's result and the next observation atomically.
    async fn record_action_result(&self, task: &str, result: &ActionResult) -> Result<()>;
    async fn set_status(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
    ) -> Result<()>;
    async fn journal(&self, task: &str) -> Result<Vec<JournalEntry>>;
    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>>;
    /// Every recorded observation as `(step, text)`, in step order.
    async fn observations(&self, task: &str) -> Result<Vec<(u64, String)>>;
    async fn intents(&self, task: &str) -> Result<Vec<IntentRecord>>;
    /// The latest snapshot at or before `step`, as `(step, state)`; `None` when gc compacted
    /// everything up to there away.
    async fn snapshot_before(&self, task: &str, step: u64) -> Result<Option<(u64, Value)>>;
    /// `(step, patch, state_hash)` of accepted steps in `from..=to`, in order.
    async fn accepted_patches(
        &self,
        task: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Value, String)>>;
    /// Creates a task that continues `parent` after its step `step`: same skill, tools,
    /// context and model; `state` at version `step`; the parent's journal, observations,
    /// intents and snapshots up to that step copied; the parent and step recorded. One
    /// transaction.
    async fn fork_task(
        &self,
        parent: &str,
        step: u64,
        state: &Value,
        env_checkpoint: Option<&Value>,
    ) -> Result<TaskRecord>;
    /// Stores `state_before` (the state after step `keep_from - 1`) as a snapshot, then drops
    /// the journal, observation and intent rows of earlier steps and the older snapshots. One
    /// transaction. Returns the number of rows deleted.
    async fn compact_task(&self, task: &str, keep_from: u64, state_before: &Value) -> Result<u64>;
    /// Deletes a task and everything it owns.
    async fn delete_task(&self, task: &str) -> Result<()>;
    /// Bytes the task occupies, by kind.
    async fn storage_stats(&self, task: &str) -> Result<StorageStats>;
    /// The span of accepted steps in the journal, for checking its continuity cheaply.
    async fn journal_extent(&self, task: &str) -> Result<JournalExtent>;

    /// Takes the execution lease of `task` for `ttl_ms`: granted when nobody holds it, it has
    /// expired, `claim.token` holds it already (a renewal), or `replacing` names the token
    /// that holds it now (taking over from a holder known to be dead). Otherwise
    /// `StoreError::Leased` says who holds it. One atomic statement.
    async fn acquire_lease(
        &self,
        task: &str,
        claim: &LeaseClaim,
        ttl_ms: u64,
        replacing: Option<&str>,
    ) -> Result<LeaseInfo>;
    /// Extends the lease held by `token`; `StoreError::LeaseLost` when `token` no longer holds
    /// it.
    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()>;
    /// Gives the lease up, if `token` still holds it.
    async fn release_lease(&self, task: &str, token: &str) -> Result<()>;
    /// The current lease of `task`, expired or not.
    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>>;
}

/// What a task occupies in the store, in bytes of stored text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StorageStats {
    /// Accepted steps.
    pub steps: u64,
    /// Journal rows (answers, patches, actions, errors, hashes, usage).
    pub journal_bytes: u64,
    /// Action intents and their results.
    pub intent_bytes: u64,
    pub observation_bytes: u64,
    pub snapshot_bytes: u64,
}

impl StorageStats {
    /// Journal and intent bytes per accepted step, observations excluded.
    pub fn journal_bytes_per_step(&self) -> f64 {
        (self.journal_bytes + self.intent_bytes) as f64 / self.steps.max(1) as f64
    }
}

/// Opens the store named by `location`: a file path, `sqlite://path` or `sqlite::memory:`, or
/// a `postgres://` / `postgresql://` URL (a schema other than `public` can be chosen with
/// `?options=-c%20search_path%3Dname`).
pub async fn open(location: &str) -> Result<Arc<dyn Store>> {
    open_with(location, &StoreOptions::default()).await
}

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreOptions {
    /// A full state snapshot every this many steps: rebuilding a step applies at most this
    /// many patches.
    pub snapshot_every: u64,
    /// How long a runner's execution lease lasts without renewal, in seconds. The runner
    /// renews it every third of this; a runner that dies without releasing it blocks its task
    /// for at most this long (at once on the same machine, where a dead holder is detected).
    pub lease_secs: u64,
}

/// Default execution lease: renewed every 10 s while a task runs.
pub const DEFAULT_LEASE_SECS: u64 = 30;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            lease_secs: DEFAULT_LEASE_SECS,
        }
    }
}

/// Whether opening may create and migrate the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the database (SQLite file, tables) when missing and apply pending migrations.
    ReadWrite,
    /// Never create or change anything: the database must exist and hold a skillstate schema
    /// this version can read. For commands that only look (`tasks`, `show`, `pending`).
    Existing,
}

/// `open` with options.
pub async fn open_with(location: &str, options: &StoreOptions) -> Result<Arc<dyn Store>> {
    open_in_mode(location, options, OpenMode::ReadWrite).await
}

/// Opens an existing database without creating or migrating anything.
pub async fn open_existing(location: &str, options: &StoreOptions) -> Result<Arc<dyn Store>> {
    open_in_mode(location, options, OpenMode::Existing).await
}

async fn open_in_mode(
    location: &str,
    options: &StoreOptions,
    mode: OpenMode,
) -> Result<Arc<dyn Store>> {
    let every = options.snapshot_every.max(1);
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        return Ok(Arc::new(
            PostgresStore::open_mode(location, mode)
                .await?
                .with_snapshot_every(every),
        ));
    }
    Ok(Arc::new(
        SqliteStore::open_mode(location, Synchronous::Full, mode)
            .await?
            .with_snapshot_every(every),
    ))
}

pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn queue_todo() -> StoreError {
    StoreError::Decode {
        what: "queue".into(),
        message: "not implemented yet".into(),
    }
}
