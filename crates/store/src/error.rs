//! What can go wrong in the store, each message naming what to do.

use crate::model::LeaseInfo;
use crate::time;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {location}: {message}")]
    Open { location: String, message: String },
    #[error("no task matches `{0}`; list tasks with `skillstate tasks`")]
    NotFound(String),
    #[error("`{prefix}` matches {count} tasks; give more characters of the id")]
    Ambiguous { prefix: String, count: usize },
    #[error("no batch matches `{0}`; list batches with `skillstate batches`")]
    NoSuchBatch(String),
    #[error("`{prefix}` matches {count} batches; give more characters of the batch id")]
    AmbiguousBatch { prefix: String, count: usize },
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
    #[error(
        "task {task}: its stored skill and tools do not match the hash recorded when it was created ({detail}): the database was changed outside skillstate, so the task cannot be trusted to run. Restore the database from a backup, or start a new task from the skill"
    )]
    Tampered { task: String, detail: String },
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
    /// The runner's lease was taken over (it was frozen or cut off past its time to live):
    /// `holder` has held the task since `at` (Unix milliseconds). Nothing was written.
    #[error(
        "task {task}: lost the lease to {holder} at {}; this process stopped without writing anything more (the task goes on under its new holder)",
        time::utc(*.at)
    )]
    LeaseLost {
        task: String,
        holder: String,
        at: i64,
    },
    #[error(
        "{location} holds no skillstate database yet (read-only commands do not create one); run a task with this --db first, or check the location"
    )]
    NoSchema { location: String },
    #[error(
        "writing to {location} failed: {message}; nothing of this write was recorded — check the disk and the file's permissions, then resume the task"
    )]
    Write { location: String, message: String },
    #[error("no API key matches `{0}`; list the keys to find its id")]
    NoSuchKey(String),
    #[error("`{prefix}` matches {count} API keys; give more characters of the key id")]
    AmbiguousKey { prefix: String, count: usize },
    #[error(
        "an API key with the secret hash `{hash_prefix}…` is already stored (tenant {tenant}); generate a new secret and create the key again"
    )]
    DuplicateKey {
        /// The first characters of the hash, never the whole of it.
        hash_prefix: String,
        tenant: String,
    },
    #[error(
        "tenant {tenant}: the task created with idempotency key `{key}` was deleted again and again while this create looked for it; send the create again"
    )]
    IdempotencyRace { tenant: String, key: String },
    #[error(
        "`{0}` is not an event position of this store; pass back the `position` (the SSE `id`) of an event it returned, or none to read from the first event"
    )]
    BadEventPosition(String),
    #[error("no board matches `{0}`; list boards with `skillstate board list`")]
    NoSuchBoard(String),
    #[error("a board named `{name}` already exists; choose another name or use that board")]
    BoardExists { name: String },
    #[error(
        "board {board} is at version {actual}, not {expected}: another writer committed first; read the board again and rebase or retry"
    )]
    BoardMoved {
        board: String,
        expected: u64,
        actual: u64,
    },
    #[error(
        "task {task} is attached to board {attached}, not {board}; a task belongs to one board"
    )]
    AttachedElsewhere {
        task: String,
        board: String,
        attached: String,
    },
    #[error(
        "task {task} is not attached to board {board}, so it cannot write it; attach it first (`skillstate run … --board NAME`, or the store's attach_task)"
    )]
    NotAttached { task: String, board: String },
    #[error(
        "`{name}` cannot name a board: {reason}; board names use letters, digits, `-`, `_` and `.`, at most 100 characters"
    )]
    BadBoardName { name: String, reason: String },
    #[error("board {board}: version {version} does not exist (the board has {current} writes)")]
    NoSuchBoardVersion {
        board: String,
        version: u64,
        current: u64,
    },
    #[error("board {board}: the journal is inconsistent at version {version}: {message}")]
    BoardCorrupt {
        board: String,
        version: u64,
        message: String,
    },
    /// A batch's task feed failed (`Queue::submit_batch`): the message names the input.
    /// Nothing of the batch was stored.
    #[error("{0}")]
    Feed(String),
    /// The server is reached through a pooler that lends a connection for one transaction
    /// at a time (PgBouncer in transaction mode) and the store was not told: its server-side
    /// prepared statements met another client's, or were gone ([`StoreError::from`]).
    #[error(
        "PostgreSQL is reached through a transaction pooler (PgBouncer `pool_mode = transaction`?) that does not keep prepared statements between transactions ({message}). Set `transaction_pooler = true` under `[store]` in skillstate.toml (or add `transaction_pooler=true` to the postgres URL), and let the pooler drop each transaction's statements (pgbouncer.ini: `server_reset_query = DEALLOCATE ALL`, `server_reset_query_always = 1`); or connect to PostgreSQL directly or through a session pooler"
    )]
    TransactionPooler { message: String },
    /// The connection was lost while a transaction committed: it may or may not be recorded.
    #[error(
        "the connection to PostgreSQL was lost while a write committed ({message}); whether it was recorded is unknown. Check the server, then look at the task (`skillstate show`) before resuming it"
    )]
    CommitUnknown { message: String },
    #[error("database error: {0}")]
    Database(sqlx::Error),
    /// The PostgreSQL store's partitions (schema 18) could not be set up as asked.
    #[error("partitioning the journal: {message}")]
    Partitioning { message: String },
}

/// Every sqlx error becomes a `StoreError` here, and only here: a pooler that breaks prepared
/// statements is named once, with what to do, whichever statement met it.
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if let Some(db) = error.as_database_error()
            && pooler_broke_statements(db.code().as_deref(), db.message())
        {
            return StoreError::TransactionPooler {
                message: db.message().to_owned(),
            };
        }
        StoreError::Database(error)
    }
}

/// PostgreSQL's answers when a named prepared statement of this client meets one of another
/// client on a shared server connection (42P05 duplicate_prepared_statement) or is missing on
/// the server connection the pooler lent this time (26000 invalid_sql_statement_name, for a
/// statement sqlx named `sqlx_s_…`).
fn pooler_broke_statements(code: Option<&str>, message: &str) -> bool {
    match code {
        Some("42P05") => true,
        Some("26000") => {
            message.contains("sqlx_s_") || message.contains("unnamed prepared statement")
        }
        _ => false,
    }
}
