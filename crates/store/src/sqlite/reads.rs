//! Point reads on the caller's thread: a task by its full id, an API key by its secret's hash,
//! one observation, a task's intents. These are what every HTTP request and every state write
//! reads, and each is a primary-key or unique-index lookup that SQLite answers in microseconds
//! from its cache; sent through the sqlx pool, each would cost two thread hand-overs (to the
//! connection's worker thread and back), which is most of a request's CPU time (README
//! "Performance", "HTTP service").
//!
//! A task's skill definition and tool list never change after its creation, and they are most of
//! its row: they are decoded once per task and kept (`DECODED_KEPT` tasks at most) with the text
//! they came from; a later read compares the stored text with it (a memory comparison, the
//! bytes were read anyway) and decodes only the rest of the row.
//!
//! Each read runs on an idle connection of this module's own (opened on first use, at most
//! `IDLE` kept), in its own read transaction, exactly as a pooled read would. Anything unusual
//! — the file cannot be opened, a lock is not granted within `BUSY`, a column is missing in an
//! older schema opened read-only — answers `None`, and the caller reads through the pool
//! instead, which waits for locks as long as the pool does and reports errors as before. So
//! these reads never change an answer, only how fast it comes; and a caller's thread waits at
//! most `BUSY` here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row};
use serde_json::Value;
use skillstate_core::{ContextStrategy, SkillDefinition, ToolSpec};

use crate::model::{IntentRecord, TaskRecord, TaskState};
use crate::rows::{decode, decode_opt, labels_of, parse_status};
use crate::service::KeyRecord;
use crate::{Result, StoreError};

/// Idle connections kept for the next reads.
const IDLE: usize = 8;
/// How long a read waits for a lock here before the pool takes over.
const BUSY: Duration = Duration::from_millis(20);
/// Tasks whose decoded skill and tools are kept; the cache starts over when full.
const DECODED_KEPT: usize = 4096;

/// A task's skill definition and tool list, decoded, with the text they were decoded from.
struct Decoded {
    skill: SkillDefinition,
    tools: Vec<ToolSpec>,
    /// `skill.schema`, shared by `TaskState`s.
    schema: Arc<Value>,
    skill_text: String,
    tools_text: String,
}

pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    decoded: Mutex<HashMap<String, Arc<Decoded>>>,
}

impl Readers {
    pub(super) fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
            decoded: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `read` on an idle connection (a new one when none is idle); `None` when it failed.
    fn read<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open(&self.path).ok()?,
        };
        let result = read(&conn).ok();
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE {
                idle.push(conn);
            }
        }
        result
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

    /// The row of task `id`, its skill and tools decoded: taken from `decoded` when the stored
    /// text is the text decoded last time, else decoded and kept.
    fn task_row(&self, id: &str) -> Option<Result<(RawTask, Arc<Decoded>)>> {
        let (raw, found) = self
            .read(|conn| {
                conn.prepare_cached(TASK)?
                    .query_row([id], |row| {
                        let raw = RawTask::of(row)?;
                        let skill = row.get_ref(0)?.as_str()?;
                        let tools = row.get_ref(1)?.as_str()?;
                        let known = self
                            .decoded
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(id)
                            .filter(|d| d.skill_text == skill && d.tools_text == tools)
                            .cloned();
                        Ok((
                            raw,
                            known.ok_or_else(|| (skill.to_owned(), tools.to_owned())),
                        ))
                    })
                    .optional()
            })
            .flatten()?;
        let (skill_text, tools_text) = match found {
            Ok(known) => return Some(Ok((raw, known))),
            Err(texts) => texts,
        };
        let decoded = (|| {
            let skill: SkillDefinition = decode("skill of task", &skill_text)?;
            let tools: Vec<ToolSpec> = decode("tools of task", &tools_text)?;
            Ok::<_, StoreError>(Arc::new(Decoded {
                schema: Arc::new(skill.schema.clone()),
                skill,
                tools,
                skill_text,
                tools_text,
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
        kept.insert(raw.id.clone(), decoded.clone());
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

    /// `task`'s action intents, in step order.
    pub(super) fn intents(&self, task: &str) -> Option<Result<Vec<IntentRecord>>> {
        let rows = self.read(|conn| {
            conn.prepare_cached(
                "SELECT step, tool, args, idempotency_key, side_effect, status, ok, result FROM intents WHERE task_id = ? ORDER BY step",
            )?
            .query_map([task], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<bool>>(6)?,
                    row.get::<_, Option<String>>(7)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        Some(
            rows.into_iter()
                .map(
                    |(step, tool, args, idempotency_key, side_effect, status, ok, result)| {
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
                    },
                )
                .collect(),
        )
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    // Never creates the file: a store whose file is gone reads through the pool and says so.
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    conn.pragma_update(None, "query_only", true)?;
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

/// A task row: skill and tools, then the columns of `RawTask::of`.
const TASK: &str = "SELECT skill, tools, id, context, context_budget, model, environment, env_checkpoint, status, state, version, outcome, parent_task, parent_step, created_at, updated_at, tenant, labels FROM tasks WHERE id = ?";

/// A task row as text but its skill and tools, decoded after the connection is given back.
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
}

impl RawTask {
    /// Columns 2.. of a `TASK` row.
    fn of(row: &Row<'_>) -> rusqlite::Result<Self> {
        let at = 2;
        Ok(Self {
            id: row.get(at)?,
            context: row.get(at + 1)?,
            context_budget: row.get(at + 2)?,
            model: row.get(at + 3)?,
            environment: row.get(at + 4)?,
            env_checkpoint: row.get(at + 5)?,
            status: row.get(at + 6)?,
            state: row.get(at + 7)?,
            version: row.get(at + 8)?,
            outcome: row.get(at + 9)?,
            parent_task: row.get(at + 10)?,
            parent_step: row.get(at + 11)?,
            created_at: row.get(at + 12)?,
            updated_at: row.get(at + 13)?,
            tenant: row.get(at + 14)?,
            labels: row.get(at + 15)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_lower_case_ids_are_read_here() {
        assert!(is_full_id("01a23034-893e-71f5-b245-1589c83ce626"));
        assert!(!is_full_id("01A23034-893e-71f5-b245-1589c83ce626"));
        assert!(!is_full_id("01a23034-893e-71f5-b245-1589c83ce62"));
        assert!(!is_full_id("01a23034"));
        assert!(!is_full_id("01a23034x893e-71f5-b245-1589c83ce626"));
    }
}
