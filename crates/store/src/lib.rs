//! Durable task state and the step journal, behind one trait (docs/storage.md, "Storage and durable
//! execution").
//!
//! Invariants every backend keeps:
//! - an accepted step (journal row, new state and version, action intent) is ONE transaction;
//! - a state write names the version it replaces; a stale writer gets `Conflict`, never a lost
//!   update;
//! - the journal is append-only; time travel rebuilds states from patches and checks each
//!   recorded hash.

mod board_rows;
mod boards;
mod boards_history;
mod error;
mod fenced;
mod history;
mod inbox;
pub mod metrics;
mod migrate;
mod model;
mod postgres;
mod queue;
mod queue_rows;
mod recall_rows;
mod rows;
mod service;
mod service_rows;
mod spec_texts;
pub use spec_texts::spec_hash_of;
mod sqlite;
pub mod time;
mod traits;

use std::sync::Arc;

pub use boards::{
    BoardAuthor, BoardRecord, BoardSchemaRecord, BoardSummary, BoardWrite, BoardWriteRecord,
    Boards, NewBoard,
};
pub use boards_history::{
    board_schema_at, board_state_at, board_state_replayed, member_board_secrets,
};
pub use error::StoreError;
pub use fenced::LeasedWrite;
pub use history::state_at;
pub use inbox::{Inbox, MessageKind, MessageRecord, NewMessage};
#[doc(hidden)]
pub use migrate::migrate_postgres_to;
pub use model::*;
pub use postgres::{Connections, DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS_RANGE, PostgresStore};
pub use queue::*;
pub use service::*;
pub use sqlite::{SqliteStore, Synchronous};
pub use traits::{Journal, Leases, Release, RetiredPartition, StorageStats, Store, Tasks};

/// The store's traits, for calling their methods on an `Arc<dyn Store>` or a backend:
/// `use skillstate_store::prelude::*;`. Imported anonymously, so no name clashes with the
/// caller's own.
pub mod prelude {
    pub use crate::boards::Boards as _;
    pub use crate::inbox::Inbox as _;
    pub use crate::queue::Queue as _;
    pub use crate::service::{Events as _, Keys as _, Tenancy as _};
    pub use crate::traits::{Journal as _, Leases as _, Release as _, Store, Tasks as _};
}

/// The database `skillstate` uses unless told otherwise: in the database directory of its data
/// directory (`.skillstate`), apart from the work directories beside it.
pub const DEFAULT_DB: &str = ".skillstate/db/skillstate.db";
/// Full state snapshots are written every this many steps (plus step 0).
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 100;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The file a SQLite `location` (as [`open`] takes it) keeps its database in; `None` for a
/// PostgreSQL URL or an in-memory database. Its `-wal`, `-shm` and `-journal` files lie beside
/// it, in the same directory.
pub fn database_file(location: &str) -> Option<std::path::PathBuf> {
    if location.starts_with("postgres://")
        || location.starts_with("postgresql://")
        || location == "sqlite::memory:"
        || location == ":memory:"
    {
        return None;
    }
    let path = location.strip_prefix("sqlite://").unwrap_or(location);
    Some(std::path::PathBuf::from(path))
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
    /// PostgreSQL is reached through a pooler that lends a server connection for one
    /// transaction at a time (PgBouncer in `pool_mode = transaction`): no server-side prepared
    /// statement is kept between transactions, every statement runs inside one, and no startup
    /// parameter such a pooler refuses is sent. The URL's `transaction_pooler=true` does the
    /// same. No effect on SQLite.
    pub transaction_pooler: bool,
    /// PostgreSQL connections one process's store opens at most (2–1000, default 16): half
    /// for transactions, half for single statements such as a step's commit. A worker whose
    /// server is a network hop away keeps its steps' commits waiting for a connection unless
    /// it has about as many as it runs tasks at once. The URL's `max_connections=N` does the
    /// same. No effect on SQLite.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

/// Default execution lease: renewed every 10 s while a task runs.
pub const DEFAULT_LEASE_SECS: u64 = 30;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            lease_secs: DEFAULT_LEASE_SECS,
            transaction_pooler: false,
            max_connections: None,
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

/// A PostgreSQL URL without the store's own query parameters (`transaction_pooler`,
/// `max_connections`), for a client other than the store.
pub fn postgres_server_url(url: &str) -> Result<String> {
    postgres::take_store_parameters(url).map(|(bare, _)| bare)
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
            PostgresStore::open_configured(
                location,
                mode,
                &postgres::Connections {
                    transaction_pooler: options.transaction_pooler,
                    max_connections: options.max_connections,
                },
            )
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
