//! The embedded default backend: one SQLite file in WAL mode. Every write of the process goes
//! through one group-commit writer (`writer.rs`): the hot path's (steps, rejections, tool
//! results, statuses, lease heartbeats, claims, settles, rate windows: `ops*.rs`) in shared
//! transactions, the others on its connection between groups; reads use the pool. One module
//! per concern: `tasks.rs`, `journal.rs`, `leases.rs`, `queue.rs` (with `report.rs`); this one
//! opens the file and resolves ids.

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::migrate::{check_sqlite, migrate_sqlite};
use crate::{DEFAULT_SNAPSHOT_EVERY, OpenMode, Result, StoreError};

mod journal;
mod leases;
mod ops;
mod ops_queue;
mod ops_steps;
mod queue;
mod report;
mod tasks;
mod writer;

use ops::{Reply, Write};
use writer::{Lent, Writer, commit_group};

/// A connection to write on: the writer's, lent between two groups, or for an in-memory
/// database the pool's only connection.
enum WriteConn {
    Lent(Lent),
    Pool(sqlx::pool::PoolConnection<sqlx::Sqlite>),
}

impl std::ops::Deref for WriteConn {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &sqlx::SqliteConnection {
        match self {
            WriteConn::Lent(conn) => conn,
            WriteConn::Pool(conn) => conn,
        }
    }
}

impl std::ops::DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut sqlx::SqliteConnection {
        match self {
            WriteConn::Lent(conn) => conn,
            WriteConn::Pool(conn) => conn,
        }
    }
}

/// How hard SQLite syncs on commit. `Full` survives power loss; `Normal` in WAL mode survives
/// process crashes (the last transactions may be lost on power loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    Full,
    Normal,
}

pub struct SqliteStore {
    /// Reads, and the writes off the hot path (creating, forking, claiming, ...).
    pool: SqlitePool,
    snapshot_every: u64,
    /// The group-commit writer of the hot path, started at the first such write; `None` for
    /// an in-memory database, which lives in the pool's one connection (writes go there).
    writer: Option<(SqliteConnectOptions, tokio::sync::OnceCell<Writer>)>,
    location: String,
}

pub(super) const TASK_COLUMNS: &str = "id, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, outcome, parent_task, parent_step, created_at, updated_at";

impl SqliteStore {
    pub async fn open(location: &str, synchronous: Synchronous) -> Result<Self> {
        Self::open_mode(location, synchronous, OpenMode::ReadWrite).await
    }

    /// Opens `location`; with `OpenMode::Existing` the file must exist and hold a skillstate
    /// schema, and nothing is created, converted or migrated.
    pub async fn open_mode(
        location: &str,
        synchronous: Synchronous,
        mode: OpenMode,
    ) -> Result<Self> {
        let open_error = |message: String| StoreError::Open {
            location: location.to_owned(),
            message,
        };
        let options = if location == "sqlite::memory:" || location == ":memory:" {
            SqliteConnectOptions::from_str("sqlite::memory:")
                .map_err(|e| open_error(e.to_string()))?
        } else {
            let path = location.strip_prefix("sqlite://").unwrap_or(location);
            if let Some(parent) = std::path::Path::new(path).parent()
                && !parent.as_os_str().is_empty()
                && !parent.is_dir()
            {
                return Err(open_error(format!(
                    "the directory {} does not exist; create it or choose another --db path",
                    parent.display()
                )));
            }
            if mode == OpenMode::Existing && !std::path::Path::new(path).is_file() {
                return Err(StoreError::NoSchema {
                    location: location.to_owned(),
                });
            }
            SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(mode == OpenMode::ReadWrite)
        };
        let options = match mode {
            OpenMode::ReadWrite => options.journal_mode(SqliteJournalMode::Wal),
            OpenMode::Existing => options,
        };
        let options = options
            .synchronous(match synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let in_memory = location.contains(":memory:");
        // Switching a brand-new file to WAL needs a lock that SQLite does not wait for (the busy
        // timeout applies only afterwards), so two processes opening the same new file at once
        // can see "database is locked": try again for a while before giving up.
        let mut attempts = 0;
        let pool = loop {
            let connected = SqlitePoolOptions::new()
                // An in-memory database lives in one connection.
                .max_connections(if in_memory { 1 } else { 4 })
                .connect_with(options.clone())
                .await;
            match connected {
                Ok(pool) => break pool,
                Err(e) if attempts < 100 && e.to_string().contains("database is locked") => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(open_error(e.to_string())),
            }
        };
        match mode {
            OpenMode::ReadWrite => migrate_sqlite(&pool).await?,
            OpenMode::Existing => check_sqlite(&pool, location).await?,
        }
        Ok(Self {
            pool,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            writer: (!in_memory).then(|| (options, tokio::sync::OnceCell::new())),
            location: location.to_owned(),
        })
    }

    /// Writes a full snapshot every `k` steps (`k` ≥ 1).
    pub fn with_snapshot_every(mut self, k: u64) -> Self {
        self.snapshot_every = k.max(1);
        self
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn writer(&self) -> Result<Option<&Writer>> {
        match &self.writer {
            Some((options, writer)) => Ok(Some(
                writer
                    .get_or_try_init(|| Writer::start(options, &self.location))
                    .await?,
            )),
            None => Ok(None),
        }
    }

    /// Commits `write` through the group-commit writer; returns once it is on disk.
    async fn write(&self, write: Write) -> Result<Reply> {
        match self.writer().await? {
            Some(writer) => writer.submit(write).await,
            None => {
                let mut conn = self.pool.acquire().await?;
                commit_group(&mut conn, &[&write], &self.location)
                    .await
                    .into_iter()
                    .next()
                    .unwrap_or(Ok(Reply::Done))
            }
        }
    }

    /// `write` for the writes that answer nothing but success.
    async fn write_done(&self, write: Write) -> Result<()> {
        self.write(write).await.map(|_| ())
    }

    /// The connection the other writes of this process run their own transaction on, in turn
    /// with the writer's groups. Drop it as soon as the transaction is over.
    async fn write_conn(&self) -> Result<WriteConn> {
        match self.writer().await? {
            Some(writer) => Ok(WriteConn::Lent(writer.lend().await?)),
            None => Ok(WriteConn::Pool(self.pool.acquire().await?)),
        }
    }

    pub(super) async fn resolve_id(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM tasks WHERE id LIKE ? || '%' ORDER BY id LIMIT 2")
                .bind(wanted.to_ascii_lowercase())
                .fetch_all(&self.pool)
                .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NotFound(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ => {
                if ids.iter().any(|id| id == wanted) {
                    return Ok(wanted.to_owned());
                }
                let count: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM tasks WHERE id LIKE ? || '%'")
                        .bind(wanted)
                        .fetch_one(&self.pool)
                        .await?;
                Err(StoreError::Ambiguous {
                    prefix: wanted.to_owned(),
                    count: count as usize,
                })
            }
        }
    }

    pub(super) async fn current_version(&self, task: &str) -> Result<u64> {
        let version: Option<i64> = sqlx::query_scalar("SELECT version FROM tasks WHERE id = ?")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        version
            .map(|v| v as u64)
            .ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }
}
