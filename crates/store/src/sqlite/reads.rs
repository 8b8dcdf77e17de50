//! Point reads on the caller's thread: a task by its full id, an API key by its secret's hash,
//! one observation, a task's intents. These are what every HTTP request and every state write
//! reads, and each is a primary-key or unique-index lookup that SQLite answers in microseconds
//! from its cache; sent through the sqlx pool, each would cost two thread hand-overs (to the
//! connection's worker thread and back), which is most of a request's CPU time (docs/performance.md,
//! "Performance", "HTTP service").
//!
//! A recall search (`recall.rs`) is read here too, since a step that recalls waits for it; it is
//! the one read whose cost depends on the query (a word on most entries), so it is interrupted
//! after `SEARCH_BUSY` and handed to the pool, which runs it off the caller's thread.
//!
//! A task's skill definition and tool list (about 4 KB) are most of what a read of it decodes.
//! Since schema 13 they are a skill version (`skill_versions`), stored once under the hash of its
//! content and refused any UPDATE by a trigger; a task's row names the version it runs
//! (`tasks.spec_hash`). So a version is read and decoded once and kept (`DECODED_KEPT` versions
//! at most), shared by every task that runs it; a read of a task reads its `tasks` row, and the
//! version only when it is not kept. A kept entry cannot go stale: its key is its content's
//! hash, checked when it was decoded (`rows::verified_spec`), and an upgraded task names
//! another hash.
//!
//! Each read runs on an idle connection of this module's own (opened on first use, at most
//! `IDLE` kept), in its own read transaction, exactly as a pooled read would. Anything unusual
//! — the file cannot be opened, a lock is not granted within `BUSY`, a column or table is missing
//! in an older schema opened read-only — answers `None`, and the caller reads through the pool
//! instead, which waits for locks as long as the pool does and reports errors as before. So
//! these reads never change an answer, only how fast it comes; and a caller's thread waits at
//! most `BUSY` here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row};
use serde_json::Value;
use skillstate_core::{ContextStrategy, SkillDefinition, ToolSpec};

use crate::model::{IntentRecord, TaskRecord, TaskState};
use crate::rows::{decode, decode_opt, labels_of, parse_status, verified_spec};
use crate::service::KeyRecord;
use crate::{Result, StoreError};

/// Idle connections kept for the next reads.
const IDLE: usize = 8;
/// How long a read waits for a lock here before the pool takes over.
const BUSY: Duration = Duration::from_millis(20);
/// How long a recall search may run here before it is interrupted and the pool runs it.
const SEARCH_BUSY: Duration = Duration::from_millis(2);
/// Skill versions kept decoded; the cache starts over when full.
const DECODED_KEPT: usize = 4096;

thread_local! {
    /// The connection of a [`Readers::together`] running on this thread, with the address of
    /// its `Readers`: the reads made inside share its read transaction.
    static HELD: RefCell<Option<(usize, Connection)>> = const { RefCell::new(None) };
}

/// A skill version (a skill definition and tool list), decoded.
struct Decoded {
    skill: SkillDefinition,
    tools: Vec<ToolSpec>,
    /// `skill.schema`, shared by `TaskState`s.
    schema: Arc<Value>,
}

pub(super) struct Readers {
    path: PathBuf,
    /// Set by [`Readers::close`]: no connection is opened or kept any more.
    closed: std::sync::atomic::AtomicBool,
    idle: Mutex<Vec<Connection>>,
    decoded: Mutex<HashMap<String, Arc<Decoded>>>,
}

impl Readers {
    pub(super) fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            closed: std::sync::atomic::AtomicBool::new(false),
            idle: Mutex::new(Vec::new()),
            decoded: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `read` on an idle connection (a new one when none is idle), or on the connection
    /// of the [`Readers::together`] this thread is in; `None` when it failed.
    fn read<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        let me = self as *const Self as usize;
        let held = HELD.with_borrow_mut(|held| match held.take() {
            Some((owner, conn)) if owner == me => Some(conn),
            other => {
                *held = other;
                None
            }
        });
        if let Some(conn) = held {
            let result = read(&conn).ok();
            HELD.set(Some((me, conn)));
            return result;
        }
        let conn = self.checkout()?;
        let result = read(&conn).ok();
        self.check_in(conn);
        result
    }

    /// Runs `reads` (calls of this `Readers` on this thread) in one read transaction: they see
    /// one snapshot, and the transaction's locks are taken and dropped once instead of once
    /// per read (SQLite's file and WAL locks were a seventh of an HTTP state read's CPU time).
    /// Reads that cannot share it (the connection cannot be opened) run as usual.
    pub(super) fn together<T>(&self, reads: impl FnOnce() -> T) -> T {
        let nested = HELD.with_borrow(|held| held.is_some());
        let Some(conn) = (!nested).then(|| self.checkout()).flatten() else {
            return reads();
        };
        if conn
            .prepare_cached("BEGIN")
            .and_then(|mut begin| begin.execute([]))
            .is_err()
        {
            self.check_in(conn);
            return reads();
        }
        HELD.set(Some((self as *const Self as usize, conn)));
        // Ends the transaction however `reads` ends, so no later read of this thread sees
        // its snapshot.
        struct End<'a>(&'a Readers);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                if let Some((_, conn)) = HELD.take() {
                    // A failed COMMIT leaves the connection in its transaction: it is dropped.
                    let _ = conn
                        .prepare_cached("COMMIT")
                        .and_then(|mut commit| commit.execute([]));
                    self.0.check_in(conn);
                }
            }
        }
        let _end = End(self);
        reads()
    }

    /// Closes the idle connections; from now on every read goes to the pool (the store is
    /// being released). A read in progress closes its connection when it ends.
    pub(super) fn close(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock, so no connection is checked in after the clear.
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        idle.clear();
    }

    fn checkout(&self) -> Option<Connection> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(conn) => Some(conn),
            None => open(&self.path).ok(),
        }
    }

    /// Keeps `conn` for the next read, unless it is still in a transaction or enough are kept.
    fn check_in(&self, conn: Connection) {
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE && !self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                idle.push(conn);
            }
        }
    }

    /// The task whose full id is `id`. `None` also when there is no such task: the caller's
    /// lookup, which accepts id prefixes, decides.
    pub(super) fn task(&self, id: &str) -> Option<Result<TaskRecord>> {
        if !is_full_id(id) {
            return None;
        }
        Some(
            self.task_row(id)?.and_then(|(raw, decoded)| {
                raw.decode(decoded.skill.clone(), decoded.tools.clone())
            }),
        )
    }

    /// `Tasks::task_state` of the task whose full id is `id`; `None` also when there is none.
    pub(super) fn task_state(&self, id: &str) -> Option<Result<TaskState>> {
        if !is_full_id(id) {
            return None;
        }
        Some(
            self.task_row(id)?
                .and_then(|(raw, decoded)| raw.state_of(&decoded)),
        )
    }

    /// The row of task `id` and the skill version it runs, decoded: taken from `decoded` when
    /// kept there, else read, decoded and kept.
    fn task_row(&self, id: &str) -> Option<Result<(RawTask, Arc<Decoded>)>> {
        let (raw, hash) = self
            .read(|conn| {
                conn.prepare_cached(TASK)?
                    .query_row([id], |row| {
                        Ok((RawTask::of(row)?, row.get::<_, Option<String>>(SPEC_AT)?))
                    })
                    .optional()
            })
            .flatten()?;
        let Some(hash) = hash else {
            // No version named: the pool's read reports it.
            return None;
        };
        let kept = self
            .decoded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
            .cloned();
        if let Some(kept) = kept {
            return Some(Ok((raw, kept)));
        }
        let (skill_text, tools_text) = self
            .read(|conn| {
                conn.prepare_cached(VERSION)?
                    .query_row([&hash], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                    })
                    .optional()
            })
            .flatten()?;
        let decoded = (|| {
            let (skill, tools) =
                verified_spec(&raw.id, &skill_text, &tools_text, Some(Some(hash.as_str())))?;
            Ok::<_, StoreError>(Arc::new(Decoded {
                schema: Arc::new(skill.schema.clone()),
                skill,
                tools,
            }))
        })();
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(error) => return Some(Err(error)),
        };
        let mut kept = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= DECODED_KEPT {
            kept.clear();
        }
        kept.insert(hash, decoded.clone());
        drop(kept);
        Some(Ok((raw, decoded)))
    }

    /// The API key whose secret hashes to `secret_hash`; `Some(Ok(None))` when there is none.
    pub(super) fn key_by_hash(&self, secret_hash: &str) -> Option<Result<Option<KeyRecord>>> {
        let raw = self.read(|conn| {
            conn.prepare_cached(
                "SELECT id, tenant, label, scopes, created_at, revoked_at FROM api_keys WHERE secret_hash = ?",
            )?
            .query_row([secret_hash], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, Option<i64>>(5)?,
                ))
            })
            .optional()
        })?;
        Some(
            raw.map(|(id, tenant, label, scopes, created_at, revoked_at)| {
                Ok(KeyRecord {
                    scopes: decode_opt(&format!("scopes of API key {id}"), scopes)?,
                    id,
                    tenant,
                    label,
                    created_at,
                    revoked_at,
                })
            })
            .transpose(),
        )
    }

    /// The observation `task`'s step `step` starts from.
    pub(super) fn observation(&self, task: &str, step: u64) -> Option<Option<String>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT text FROM observations WHERE task_id = ? AND step = ?")?
                .query_row(rusqlite::params![task, step as i64], |row| row.get(0))
                .optional()
        })
    }

    /// Whether anything waits in `task`'s inbox: asked before every step, and nearly always
    /// `false`, so it must cost microseconds.
    pub(super) fn inbox_waiting(&self, task: &str) -> Option<bool> {
        self.read(|conn| {
            conn.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM inbox WHERE task_id = ? AND delivered_step IS NULL)",
            )?
            .query_row([task], |row| row.get(0))
        })
    }

    /// The rows of a recall search's statement (`recall.rs`), with its values bound in order.
    pub(super) fn search(
        &self,
        sql: &str,
        binds: &[super::recall::Bind],
    ) -> Option<Vec<super::recall::SearchRow>> {
        self.read(|conn| {
            // Past `SEARCH_BUSY` the read is interrupted and the pool runs it instead: a
            // search for a word on most entries must not hold the caller's thread.
            let deadline = std::time::Instant::now() + SEARCH_BUSY;
            conn.progress_handler(1000, Some(move || std::time::Instant::now() > deadline))?;
            let found = search_rows(conn, sql, binds);
            conn.progress_handler(0, None::<fn() -> bool>)?;
            found
        })
    }

    /// `task`'s action intents, in step order.
    pub(super) fn intents(&self, task: &str) -> Option<Result<Vec<IntentRecord>>> {
        let rows = self.read(|conn| {
            conn.prepare_cached(
                "SELECT step, tool, args, idempotency_key, side_effect, status, ok, result FROM intents WHERE task_id = ? ORDER BY step",
            )?
            .query_map([task], intent_row)?
            .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        Some(rows.into_iter().map(decode_intent).collect())
    }

    /// `task`'s action intent at `step`, if there is one: a point read, whatever the length of
    /// the task's history.
    pub(super) fn intent(&self, task: &str, step: u64) -> Option<Result<Option<IntentRecord>>> {
        let row = self.read(|conn| {
            conn.prepare_cached(
                "SELECT step, tool, args, idempotency_key, side_effect, status, ok, result FROM intents WHERE task_id = ? AND step = ?",
            )?
            .query_row(rusqlite::params![task, step as i64], intent_row)
            .optional()
        })?;
        Some(row.map(decode_intent).transpose())
    }
}

/// An intent's columns as read, before its arguments are decoded.
type IntentRow = (
    i64,
    String,
    String,
    String,
    String,
    String,
    Option<bool>,
    Option<String>,
);

fn intent_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<IntentRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
    ))
}

fn decode_intent(row: IntentRow) -> Result<IntentRecord> {
    let (step, tool, args, idempotency_key, side_effect, status, ok, result) = row;
    Ok(IntentRecord {
        step: step as u64,
        tool,
        args: decode("intent args", &args)?,
        idempotency_key,
        side_effect,
        done: status == "done",
        ok,
        result,
    })
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    // Never creates the file: a store whose file is gone reads through the pool and says so.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    conn.pragma_update(None, "query_only", true)?;
    // A cached statement is planned once. Without the query planner stability guarantee,
    // SQLite (built with STAT4) marks a statement whose plan looked at a bound value (a range
    // on an indexed column, a LIMIT) as expired at every bind and compiles it again at its
    // next step: that was 28% of a recall search (`cargo bench -p skillstate-store --bench
    // recall`). The statements here are written for the plan they get.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// A task id as the store makes them (a lower-case hyphenated UUID), which no other id has as
/// its prefix; anything else goes through the prefix lookup.
fn is_full_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// The columns of `RawTask::of`, in its order.
macro_rules! task_columns {
    () => {
        "t.id, t.context, t.context_budget, t.model, t.environment, t.env_checkpoint, t.status, t.state, t.version, t.outcome, t.parent_task, t.parent_step, t.created_at, t.updated_at, t.tenant, t.labels, t.env_checkpoint_step, t.upgrade_to, t.upgrade_author"
    };
}

/// A task row, then the hash of the skill version it runs (column `SPEC_AT`).
const TASK: &str = concat!(
    "SELECT ",
    task_columns!(),
    ", t.spec_hash FROM tasks t WHERE t.id = ?"
);
/// A skill version's skill and tools by its hash.
const VERSION: &str = "SELECT skill, tools FROM skill_versions WHERE hash = ?";
const SPEC_AT: usize = 19;

/// A task row as text, decoded after the connection is given back.
struct RawTask {
    id: String,
    context: String,
    context_budget: Option<i64>,
    model: String,
    environment: Option<String>,
    env_checkpoint: Option<String>,
    status: String,
    state: String,
    version: i64,
    outcome: Option<String>,
    parent_task: Option<String>,
    parent_step: Option<i64>,
    created_at: i64,
    updated_at: i64,
    tenant: Option<String>,
    labels: Option<String>,
    env_checkpoint_step: Option<i64>,
    upgrade_to: Option<String>,
    upgrade_author: Option<String>,
}

impl RawTask {
    /// The first columns of a `TASK` row.
    fn of(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            context: row.get(1)?,
            context_budget: row.get(2)?,
            model: row.get(3)?,
            environment: row.get(4)?,
            env_checkpoint: row.get(5)?,
            status: row.get(6)?,
            state: row.get(7)?,
            version: row.get(8)?,
            outcome: row.get(9)?,
            parent_task: row.get(10)?,
            parent_step: row.get(11)?,
            created_at: row.get(12)?,
            updated_at: row.get(13)?,
            tenant: row.get(14)?,
            labels: row.get(15)?,
            env_checkpoint_step: row.get(16)?,
            upgrade_to: row.get(17)?,
            upgrade_author: row.get(18)?,
        })
    }

    /// The `TaskState` of this row.
    fn state_of(self, decoded: &Decoded) -> Result<TaskState> {
        Ok(TaskState {
            status: parse_status(&self.status)?,
            state: decode("state", &self.state)?,
            version: self.version as u64,
            tenant: self.tenant,
            id: self.id,
            schema: decoded.schema.clone(),
            state_tokens: decoded.skill.settings.budgets.state_tokens,
        })
    }

    /// The same record and the same errors as `rows::task_from_row`.
    fn decode(self, skill: SkillDefinition, tools: Vec<ToolSpec>) -> Result<TaskRecord> {
        Ok(TaskRecord {
            skill,
            tools,
            context: parse_context(&self.context)?,
            context_budget: self.context_budget.map(|b| b as usize),
            model: self.model,
            environment: decode_opt("environment", self.environment)?,
            env_checkpoint: decode_opt("environment checkpoint", self.env_checkpoint)?,
            env_checkpoint_step: self.env_checkpoint_step.map(|s| s.max(0) as u64),
            upgrade_to: crate::rows::scheduled_upgrade(self.upgrade_to, self.upgrade_author),
            status: parse_status(&self.status)?,
            state: decode("state", &self.state)?,
            version: self.version as u64,
            outcome: decode_opt("outcome", self.outcome)?,
            parent: self.parent_task.zip(self.parent_step.map(|s| s as u64)),
            created_at: self.created_at,
            updated_at: self.updated_at,
            tenant: self.tenant,
            labels: labels_of(self.labels.as_deref())?,
            id: self.id,
        })
    }
}

fn parse_context(context: &str) -> Result<ContextStrategy> {
    ContextStrategy::parse(context).ok_or_else(|| StoreError::Decode {
        what: "context strategy".into(),
        message: format!("unknown strategy `{context}`"),
    })
}

/// A recall search's rows (`Readers::search`).
fn search_rows(
    conn: &Connection,
    sql: &str,
    binds: &[super::recall::Bind],
) -> rusqlite::Result<Vec<super::recall::SearchRow>> {
    use super::recall::Bind;
    let mut statement = conn.prepare_cached(sql)?;
    for (at, bind) in binds.iter().enumerate() {
        match bind {
            Bind::Text(text) => statement.raw_bind_parameter(at + 1, text)?,
            Bind::Int(n) => statement.raw_bind_parameter(at + 1, n)?,
        }
    }
    let mut rows = statement.raw_query();
    let mut found = Vec::new();
    while let Some(row) = rows.next()? {
        found.push((
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn only_full_lower_case_ids_are_read_here() {
        assert!(is_full_id("01a23034-893e-71f5-b245-1589c83ce626"));
        assert!(!is_full_id("01A23034-893e-71f5-b245-1589c83ce626"));
        assert!(!is_full_id("01a23034-893e-71f5-b245-1589c83ce62"));
        assert!(!is_full_id("01a23034"));
        assert!(!is_full_id("01a23034x893e-71f5-b245-1589c83ce626"));
    }

    /// Reads inside `together` share one snapshot; the next read after it sees what was
    /// committed meanwhile, also on the same thread and connection.
    #[test]
    fn reads_together_share_one_snapshot_and_keep_none_of_it_afterwards() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("k.db");
        let writer = Connection::open(&path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        writer.execute_batch(
            "CREATE TABLE api_keys (id TEXT, tenant TEXT, label TEXT, scopes TEXT, \
             created_at INTEGER, revoked_at INTEGER, secret_hash TEXT UNIQUE);
             INSERT INTO api_keys VALUES ('k1', 'acme', 'ci', NULL, 1, NULL, 'h1');",
        )?;
        let readers = Readers::new(&path);
        let revoked = |readers: &Readers| -> anyhow::Result<Option<i64>> {
            let key = readers.key_by_hash("h1").context("read")??.context("key")?;
            Ok(key.revoked_at)
        };
        let (before, during) = readers.together(|| -> anyhow::Result<_> {
            let before = revoked(&readers)?;
            writer.execute("UPDATE api_keys SET revoked_at = 7 WHERE id = 'k1'", [])?;
            Ok((before, revoked(&readers)?))
        })?;
        assert_eq!((before, during), (None, None));
        assert_eq!(revoked(&readers)?, Some(7));
        // A panic inside leaves no transaction behind either.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            readers.together(|| {
                let _ = revoked(&readers);
                panic!("inside");
            })
        }));
        assert!(caught.is_err());
        writer.execute("UPDATE api_keys SET revoked_at = 8 WHERE id = 'k1'", [])?;
        assert_eq!(revoked(&readers)?, Some(8));
        Ok(())
    }

    /// A search that runs past `SEARCH_BUSY` is interrupted (the pool runs it instead), and
    /// the connection it ran on answers the next search as usual.
    #[test]
    fn a_long_search_is_handed_back_and_leaves_its_connection_usable() -> anyhow::Result<()> {
        use super::super::recall::Bind;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.db");
        let writer = Connection::open(&path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        let readers = Readers::new(&path);
        let long = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
                    SELECT max(i), 0, 'observation', NULL, '' FROM n";
        assert_eq!(readers.search(long, &[Bind::Int(1_000_000_000)]), None);
        let short = readers
            .search(long, &[Bind::Int(3)])
            .context("a short search")?;
        assert_eq!(
            short,
            vec![(3, 0, "observation".to_owned(), None, String::new())]
        );
        Ok(())
    }
}
