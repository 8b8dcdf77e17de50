//! The embedded default backend: one SQLite file in WAL mode. Every write of the process goes
//! through one group-commit writer (`writer.rs`): the hot path's (steps, rejections, tool
//! results, statuses, lease heartbeats, claims, settles, rate windows, API keys: `ops*.rs`) in
//! shared transactions, the others on a pooled connection during the writer's turns; reads use
//! the pool. One module per concern: `tasks.rs`, `journal.rs`, `leases.rs`, `queue.rs` (with
//! `report.rs`), `service.rs` (keys, tenants, events); this one opens the file and resolves ids.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::migrate::{check_sqlite, migrate_sqlite};
use crate::{DEFAULT_SNAPSHOT_EVERY, OpenMode, Result, StoreError};

mod boards;
mod checkpoint;
mod inbox;
mod journal;
mod leases;
mod ops;
mod ops_boards;
mod ops_fenced;
mod ops_keys;
mod ops_queue;
mod ops_state;
mod ops_steps;
mod ops_submit;
mod ops_tasks;
mod queue;
mod reads;
mod recall;
mod report;
mod service;
mod tasks;
mod writer;

use ops::{Reply, Write};
use writer::{Turn, Writer};

/// A pooled connection to write on while the writer waits (its `Turn`); fields drop in order,
/// so the connection is back before the writer goes on.
struct WriteConn {
    conn: sqlx::pool::PoolConnection<sqlx::Sqlite>,
    _turn: Turn,
}

impl std::ops::Deref for WriteConn {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &sqlx::SqliteConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriteConn {
    fn deref_mut(&mut self) -> &mut sqlx::SqliteConnection {
        &mut self.conn
    }
}

/// The file behind `sqlite::memory:`: private to the store, never synced, deleted with it.
struct TempDb(PathBuf);

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
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
    /// Reads, and the writes off the hot path during the writer's turns.
    pool: SqlitePool,
    /// The hot point reads, on the caller's thread (`reads.rs`); the pool when they cannot.
    readers: reads::Readers,
    snapshot_every: u64,
    /// The group-commit writer, started at the first write.
    writer: tokio::sync::OnceCell<Writer>,
    path: PathBuf,
    /// The `synchronous` pragma of the writer's connection.
    synchronous: &'static str,
    location: String,
    /// `TASK_BY_ID`, or `TASK_BY_ID_BEFORE_SPECS` for an older schema opened read-only.
    task_by_id: &'static str,
    _temp: Option<TempDb>,
}

/// Stores a skill version (hash, name, version, skill, tools, created at) unless it is stored.
pub(super) const INSERT_VERSION: &str = "INSERT INTO skill_versions (hash, name, version, skill, tools, created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING";

/// A task by its id (`?`), as `rows::task_from_row` decodes it: every column of `tasks` (`tenant`
/// came with schema 5, and read-only opens read older schemas too: `rows::later_text_column`)
/// and the skill and tools of the version it runs (`skill_versions`, schema 13; migration 13
/// says why). A LEFT JOIN: a task without them fails to decode, naming the column, instead of
/// vanishing. `t.spec_hash` is the hash they are checked against.
const TASK_BY_ID: &str = "SELECT t.*, v.skill, v.tools FROM tasks t LEFT JOIN skill_versions v ON v.hash = t.spec_hash WHERE t.id = ?";
/// `TASK_BY_ID` for a database of schema 7 to 12, opened read-only: skill and tools in a copy
/// per task (`task_specs`).
const TASK_BY_ID_SPECS_APART: &str =
    "SELECT t.*, s.* FROM tasks t LEFT JOIN task_specs s ON s.task_id = t.id WHERE t.id = ?";
/// `TASK_BY_ID` for a database before schema 7, opened read-only: skill and tools in `tasks`.
const TASK_BY_ID_BEFORE_SPECS: &str = "SELECT * FROM tasks WHERE id = ?";

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
        let in_memory = location == "sqlite::memory:" || location == ":memory:";
        // An in-memory database is a private temporary file that is never synced: the
        // writer's connection and the pool's must all reach the same database.
        let temp = in_memory.then(|| {
            TempDb(std::env::temp_dir().join(format!(
                "skillstate-memory-{}.db",
                uuid::Uuid::now_v7().simple()
            )))
        });
        let (options, path) = if let Some(temp) = &temp {
            (
                SqliteConnectOptions::new()
                    .filename(&temp.0)
                    .create_if_missing(true),
                temp.0.clone(),
            )
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
            (
                SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(mode == OpenMode::ReadWrite),
                PathBuf::from(path),
            )
        };
        let synchronous = match (in_memory, synchronous) {
            (true, _) => SqliteSynchronous::Off,
            (false, Synchronous::Full) => SqliteSynchronous::Full,
            (false, Synchronous::Normal) => SqliteSynchronous::Normal,
        };
        let options = match mode {
            OpenMode::ReadWrite => options.journal_mode(SqliteJournalMode::Wal),
            OpenMode::Existing => options,
        };
        let options = options
            .synchronous(synchronous)
            .foreign_keys(true)
            // SQLite's default page cache is 2 MiB per connection: a long task's journal and
            // recall index outgrow it, and every step then reads the pages it changes back
            // from the OS. At most 32 MiB per connection of this pool, and never more than the
            // database itself. The group-commit writer (writer.rs) and the direct readers
            // (reads.rs) open their own connections and keep SQLite's default: a 32 MiB cache on
            // the writer did not make a 10,000-step task's late steps faster.
            .pragma("cache_size", "-32768")
            .busy_timeout(Duration::from_secs(10));
        // Switching a brand-new file to WAL needs a lock that SQLite does not wait for (the busy
        // timeout applies only afterwards), so two processes opening the same new file at once
        // can see "database is locked": try again for a while before giving up.
        let mut attempts = 0;
        let pool = loop {
            let connected = SqlitePoolOptions::new()
                .max_connections(4)
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
        let mut task_by_id = TASK_BY_ID;
        let pool = match mode {
            OpenMode::ReadWrite => {
                migrate_sqlite(&pool).await?;
                // A connection that read the schema while the migrations ran keeps that
                // schema until its next transaction: a `SELECT *` prepared on it gets the old
                // column list and SQLite hands back rows of the new one. Start over with
                // connections that only ever saw the migrated schema.
                pool.close().await;
                SqlitePoolOptions::new()
                    .max_connections(4)
                    .connect_with(options.clone())
                    .await
                    .map_err(|e| open_error(e.to_string()))?
            }
            OpenMode::Existing => {
                check_sqlite(&pool, location).await?;
                // Decided once: a process that migrates the file meanwhile makes this store's
                // task reads fail (no `skill` column), never answer wrongly; read-only opens are
                // the short-lived looking commands.
                let table = |name: &'static str| {
                    sqlx::query_scalar::<_, bool>(
                        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)",
                    )
                    .bind(name)
                    .fetch_one(&pool)
                };
                if !table("skill_versions").await? {
                    task_by_id = if table("task_specs").await? {
                        TASK_BY_ID_SPECS_APART
                    } else {
                        TASK_BY_ID_BEFORE_SPECS
                    };
                }
                pool
            }
        };
        Ok(Self {
            pool,
            readers: reads::Readers::new(&path),
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            writer: tokio::sync::OnceCell::new(),
            path,
            synchronous: match synchronous {
                SqliteSynchronous::Off => "OFF",
                SqliteSynchronous::Normal => "NORMAL",
                _ => "FULL",
            },
            location: location.to_owned(),
            task_by_id,
            _temp: temp,
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

    async fn writer(&self) -> Result<&Writer> {
        self.writer
            .get_or_try_init(|| Writer::start(&self.path, self.synchronous, &self.location))
            .await
    }

    /// Commits `write` through the group-commit writer; returns once it is on disk.
    async fn write(&self, write: Write) -> Result<Reply> {
        self.writer().await?.submit(write).await
    }

    /// `write` for the writes that answer nothing but success.
    async fn write_done(&self, write: Write) -> Result<()> {
        self.write(write).await.map(|_| ())
    }

    /// A connection for the writes that run their own transaction, while the writer waits
    /// between two groups. Drop it as soon as the transaction is over, and do not write through
    /// the writer meanwhile (it waits for this).
    async fn write_conn(&self) -> Result<WriteConn> {
        let turn = self.writer().await?.turn().await?;
        Ok(WriteConn {
            conn: self.pool.acquire().await?,
            _turn: turn,
        })
    }

    /// Commits the writes already handed over and stops the writer; writing through this store
    /// afterwards fails with an error saying so. Reads go on working.
    pub async fn close(&self) {
        if let Some(writer) = self.writer.get() {
            writer.close().await;
        }
    }

    pub(super) async fn resolve_id(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> =
            // A range on the primary key (ids are lowercase hex and '-', all below '~'), so a
            // lookup costs the same with ten tasks or a million.
            sqlx::query_scalar(
                "SELECT id FROM tasks WHERE id >= ?1 AND id < ?1 || '~' ORDER BY id LIMIT 2",
            )
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
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM tasks WHERE id >= ?1 AND id < ?1 || '~'",
                )
                .bind(wanted.to_ascii_lowercase())
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

#[async_trait::async_trait]
impl crate::Release for SqliteStore {
    async fn release(&self) {
        self.close().await;
        self.readers.close();
        self.pool.close().await;
    }
}
