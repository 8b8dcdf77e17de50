//! The server backend: PostgreSQL, for several runners sharing one store.
//!
//! It keeps the SQLite backend's behaviour to the byte: the same text in every JSON column, the
//! same snapshot rule, the same errors. Where SQLite serialises writers with `BEGIN IMMEDIATE`,
//! this backend relies on row locks under READ COMMITTED: a conditional `UPDATE` waits for a
//! concurrent writer of the same row and then re-checks its `WHERE` against the committed row,
//! which is what turns a second commit of the same version into a `Conflict`.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use serde_json::Value;
use skillstate_core::json::state_hash;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};

use crate::migrate::{check_postgres, migrate_postgres};
use crate::model::*;
use crate::rows::{
    decode, entry_from_row, extent_from_row, lease_from_row, summary_from_row, task_from_row,
    to_json, verdict_str,
};
use crate::{
    DEFAULT_SNAPSHOT_EVERY, OpenMode, Result, StorageStats, Store, StoreError, now_millis,
};

/// Enough for a few runners and the CLI; PostgreSQL's default limit is 100 per server.
const MAX_CONNECTIONS: u32 = 8;
/// Long enough to ride out a burst of concurrent commits, short enough that a dead server
/// surfaces as an error instead of a hang.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    snapshot_every: u64,
}

const TASK_COLUMNS: &str = "id, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, outcome, parent_task, parent_step, created_at, updated_at";

impl PostgresStore {
    /// Opens `url` (`postgres://user@host:port/db`, with libpq-style query parameters such as
    /// `options=-c search_path=name`) and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_mode(url, OpenMode::ReadWrite).await
    }

    /// Opens `url`; with `OpenMode::Existing` nothing is created or migrated, and a database
    /// without skillstate tables is reported as such.
    pub async fn open_mode(url: &str, mode: OpenMode) -> Result<Self> {
        let options = connect_options(url)?;
        Self::connect(url, options, None, mode).await
    }

    /// Like [`open`](Self::open), but keeps every table in `schema`, which is created when
    /// missing. The schema is set as `search_path` at connection startup, so every pooled
    /// connection uses it, including ones opened later.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<Self> {
        if !is_plain_identifier(schema) {
            return Err(StoreError::Open {
                location: redact(url),
                message: format!(
                    "`{schema}` is not a usable schema name; use letters, digits and `_`, starting with a letter or `_`, at most 63 characters"
                ),
            });
        }
        let options = connect_options(url)?.options([("search_path", format!("\"{schema}\""))]);
        Self::connect(url, options, Some(schema), OpenMode::ReadWrite).await
    }

    async fn connect(
        url: &str,
        options: PgConnectOptions,
        schema: Option<&str>,
        mode: OpenMode,
    ) -> Result<Self> {
        let open_error = |e: sqlx::Error| StoreError::Open {
            location: redact(url),
            message: e.to_string(),
        };
        // One plain connection first: the pool retries a refused or rejected connection until
        // its acquire timeout and then reports only "timed out", while this fails at once
        // with the server's actual answer (refused, bad password, no such database).
        let mut probe = PgConnection::connect_with(&options)
            .await
            .map_err(open_error)?;
        if let Some(schema) = schema {
            // The name was checked by `is_plain_identifier`, so quoting it is enough.
            let sql = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
            if let Err(error) = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut probe).await {
                // Two sessions creating the same schema at once can both pass the existence
                // check; the loser fails on the catalog's unique index although the schema now
                // exists, which is all that was asked for.
                let raced = error
                    .as_database_error()
                    .is_some_and(|e| e.is_unique_violation());
                if !raced {
                    return Err(error.into());
                }
            }
        }
        probe.close().await?;
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        match mode {
            OpenMode::ReadWrite => migrate_postgres(&pool).await?,
            OpenMode::Existing => check_postgres(&pool, &redact(url)).await?,
        }
        Ok(Self {
            pool,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
        })
    }

    /// Writes a full snapshot every `k` steps (`k` ≥ 1).
    pub fn with_snapshot_every(mut self, k: u64) -> Self {
        self.snapshot_every = k.max(1);
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn resolve_id(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(id_or_prefix.to_owned()));
        }
        // PostgreSQL's LIKE is case-sensitive where SQLite's is not; ids are lowercase. The
        // range bounds let a generic plan use the primary key: every id character sorts below
        // `~`, and the column is COLLATE "C".
        let lower = wanted.to_ascii_lowercase();
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%' ORDER BY id LIMIT 2",
        )
        .bind(&lower)
        .fetch_all(&self.pool)
        .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NotFound(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ => {
                if let Some(exact) = ids.iter().find(|id| **id == lower) {
                    return Ok(exact.clone());
                }
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM tasks WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%'",
                )
                .bind(&lower)
                .fetch_one(&self.pool)
                .await?;
                Err(StoreError::Ambiguous {
                    prefix: wanted.to_owned(),
                    count: count as usize,
                })
            }
        }
    }

    async fn current_version(&self, task: &str) -> Result<u64> {
        let version: Option<i64> = sqlx::query_scalar("SELECT version FROM tasks WHERE id = $1")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        version
            .map(|v| v as u64)
            .ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }

    async fn sum_bytes(&self, sql: &'static str, task: &str) -> Result<u64> {
        let value: Option<i64> = sqlx::query_scalar(sql)
            .bind(task)
            .fetch_one(&self.pool)
            .await?;
        Ok(value.unwrap_or(0) as u64)
    }
}

fn connect_options(url: &str) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(url).map_err(|e| StoreError::Open {
        location: redact(url),
        message: e.to_string(),
    })
}

/// Schema names are spliced into SQL and into the startup options, so only names that need no
/// escaping in either are accepted.
fn is_plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

/// The URL without its password (in the user info or a `password` parameter), for error
/// messages that end up in terminals and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|pair| {
                    if pair.starts_with("password=") {
                        "password=***"
                    } else {
                        pair
                    }
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

async fn insert_entry(
    conn: &mut sqlx::PgConnection,
    task: &str,
    entry: &JournalEntry,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(task)
    .bind(entry.step as i64)
    .bind(i64::from(entry.attempt))
    .bind(verdict_str(entry.verdict))
    .bind(&entry.output)
    .bind(entry.patch.as_ref().map(to_json))
    .bind(entry.action.as_ref().map(to_json))
    .bind(entry.errors.as_ref().map(to_json))
    .bind(&entry.state_hash)
    .bind(entry.prompt_tokens as i64)
    .bind(&entry.prompt_hash)
    .bind(entry.usage.as_ref().map(to_json))
    .bind(entry.latency_ms as i64)
    .bind(entry.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes `state` as the snapshot at `step`, replacing one already there (a fork's or a
/// compaction's base step may coincide with a regular snapshot).
async fn upsert_snapshot(
    conn: &mut sqlx::PgConnection,
    task: &str,
    step: i64,
    state: &Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (task_id, step) DO UPDATE SET state = EXCLUDED.state, state_hash = EXCLUDED.state_hash",
    )
    .bind(task)
    .bind(step)
    .bind(to_json(state))
    .bind(state_hash(state))
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, 0, $11, $12)",
        )
        .bind(&id)
        .bind(&task.skill.name)
        .bind(to_json(&task.skill))
        .bind(to_json(&task.tools))
        .bind(task.context.as_str())
        .bind(task.context_budget.map(|b| b as i64))
        .bind(&task.model)
        .bind(task.environment.as_ref().map(to_json))
        .bind(task.env_checkpoint.as_ref().map(to_json))
        .bind(to_json(initial_state))
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES ($1, 0, $2, $3)",
        )
        .bind(&id)
        .bind(to_json(initial_state))
        .bind(state_hash(initial_state))
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO observations (task_id, step, text) VALUES ($1, 1, $2)")
            .bind(&id)
            .bind(&task.opening_observation)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.task(&id).await
    }

    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord> {
        let id = self.resolve_id(id_or_prefix).await?;
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(&id)
            .fetch_one(&self.pool)
            .await?;
        task_from_row(&row)
    }

    async fn list_tasks(&self) -> Result<Vec<TaskSummary>> {
        let rows = sqlx::query(
            "SELECT id, skill_name, status, version, model, created_at, updated_at FROM tasks ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(summary_from_row).collect())
    }

    async fn record_rejection(&self, task: &str, entry: &JournalEntry) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        insert_entry(&mut tx, task, entry).await?;
        sqlx::query("UPDATE tasks SET updated_at = $1 WHERE id = $2")
            .bind(now_millis())
            .bind(task)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn commit_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()> {
        let next_version = expected_version + 1;
        let now = now_millis();
        let (status, outcome) = match &commit.status {
            Some((status, outcome)) => (Some(status.as_str()), outcome.as_ref().map(to_json)),
            None => (None, None),
        };
        let mut tx = self.pool.begin().await?;
        // The version check and the write are one statement: a concurrent writer of the same
        // task holds the row lock until it commits, and this UPDATE then sees its version.
        let updated = sqlx::query(
            "UPDATE tasks SET state = $1, version = $2, updated_at = $3, status = COALESCE($4, status), outcome = COALESCE($5, outcome) WHERE id = $6 AND version = $7",
        )
        .bind(to_json(&commit.new_state))
        .bind(next_version as i64)
        .bind(now)
        .bind(status)
        .bind(outcome)
        .bind(task)
        .bind(expected_version as i64)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            tx.rollback().await?;
            let actual = self.current_version(task).await?;
            return Err(StoreError::Conflict {
                task: task.to_owned(),
                expected: expected_version,
                actual,
            });
        }
        insert_entry(&mut tx, task, &commit.entry).await?;
        if let Some(intent) = &commit.intent {
            sqlx::query(
                "INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at) VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7)",
            )
            .bind(task)
            .bind(next_version as i64)
            .bind(&intent.tool)
            .bind(to_json(&intent.args))
            .bind(&intent.idempotency_key)
            .bind(&intent.side_effect)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        if next_version.is_multiple_of(self.snapshot_every) {
            sqlx::query(
                "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES ($1, $2, $3, $4)",
            )
            .bind(task)
            .bind(next_version as i64)
            .bind(to_json(&commit.new_state))
            .bind(state_hash(&commit.new_state))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_action_result(&self, task: &str, result: &ActionResult) -> Result<()> {
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE intents SET status = 'done', ok = $1, result = $2, finished_at = $3 WHERE task_id = $4 AND step = $5 AND status = 'pending'",
        )
        .bind(result.ok)
        .bind(&result.result)
        .bind(now)
        .bind(task)
        .bind(result.step as i64)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            tx.rollback().await?;
            return Err(StoreError::Corrupt {
                task: task.to_owned(),
                step: result.step,
                message: "no pending action intent to complete".into(),
            });
        }
        sqlx::query("INSERT INTO observations (task_id, step, text) VALUES ($1, $2, $3)")
            .bind(task)
            .bind((result.step + 1) as i64)
            .bind(&result.next_observation)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE tasks SET env_checkpoint = COALESCE($1, env_checkpoint), updated_at = $2 WHERE id = $3",
        )
        .bind(result.env_checkpoint.as_ref().map(to_json))
        .bind(now)
        .bind(task)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_status(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
    ) -> Result<()> {
        let updated = sqlx::query(
            "UPDATE tasks SET status = $1, outcome = COALESCE($2, outcome), updated_at = $3 WHERE id = $4",
        )
        .bind(status.as_str())
        .bind(outcome.map(to_json))
        .bind(now_millis())
        .bind(task)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        Ok(())
    }

    async fn journal(&self, task: &str) -> Result<Vec<JournalEntry>> {
        let rows = sqlx::query("SELECT * FROM journal WHERE task_id = $1 ORDER BY step, attempt")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT text FROM observations WHERE task_id = $1 AND step = $2")
                .bind(task)
                .bind(step as i64)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn observations(&self, task: &str) -> Result<Vec<(u64, String)>> {
        let rows =
            sqlx::query("SELECT step, text FROM observations WHERE task_id = $1 ORDER BY step")
                .bind(task)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| Ok((row.try_get::<i64, _>("step")? as u64, row.try_get("text")?)))
            .collect()
    }

    async fn intents(&self, task: &str) -> Result<Vec<IntentRecord>> {
        let rows = sqlx::query("SELECT * FROM intents WHERE task_id = $1 ORDER BY step")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let status: String = row.try_get("status")?;
                Ok(IntentRecord {
                    step: row.try_get::<i64, _>("step")? as u64,
                    tool: row.try_get("tool")?,
                    args: decode("intent args", &row.try_get::<String, _>("args")?)?,
                    idempotency_key: row.try_get("idempotency_key")?,
                    side_effect: row.try_get("side_effect")?,
                    done: status == "done",
                    ok: row.try_get("ok")?,
                    result: row.try_get("result")?,
                })
            })
            .collect()
    }

    async fn snapshot_before(&self, task: &str, step: u64) -> Result<Option<(u64, Value)>> {
        let row = sqlx::query(
            "SELECT step, state FROM snapshots WHERE task_id = $1 AND step <= $2 ORDER BY step DESC LIMIT 1",
        )
        .bind(task)
        .bind(step as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok((
                row.try_get::<i64, _>("step")? as u64,
                decode("snapshot", &row.try_get::<String, _>("state")?)?,
            ))
        })
        .transpose()
    }

    async fn accepted_patches(
        &self,
        task: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Value, String)>> {
        let rows = sqlx::query(
            "SELECT step, patch, state_hash FROM journal WHERE task_id = $1 AND verdict = 'accepted' AND step BETWEEN $2 AND $3 ORDER BY step",
        )
        .bind(task)
        .bind(from as i64)
        .bind(to as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let step = row.try_get::<i64, _>("step")? as u64;
                let patch: Option<String> = row.try_get("patch")?;
                let hash: Option<String> = row.try_get("state_hash")?;
                let corrupt = |message: &str| StoreError::Corrupt {
                    task: task.to_owned(),
                    step,
                    message: message.to_owned(),
                };
                let patch = patch.ok_or_else(|| corrupt("accepted step without a patch"))?;
                let patch = serde_json::from_str(&patch)
                    .map_err(|e| corrupt(&format!("the patch is not JSON: {e}")))?;
                Ok((
                    step,
                    patch,
                    hash.ok_or_else(|| corrupt("accepted step without a state hash"))?,
                ))
            })
            .collect()
    }

    async fn fork_task(
        &self,
        parent: &str,
        step: u64,
        state: &Value,
        env_checkpoint: Option<&Value>,
    ) -> Result<TaskRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_millis();
        let at = step as i64;
        let mut tx = self.pool.begin().await?;
        // Under READ COMMITTED every statement below reads a fresh snapshot. The share lock
        // keeps the parent from being compacted or deleted between them, so the copied
        // journal, intents, observations and snapshots agree with each other; commits to the
        // parent wait until the fork is done, as they would behind SQLite's write lock.
        let version: Option<i64> =
            sqlx::query_scalar("SELECT version FROM tasks WHERE id = $1 FOR SHARE")
                .bind(parent)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(version) = version else {
            tx.rollback().await?;
            return Err(StoreError::NotFound(parent.to_owned()));
        };
        if version < at {
            tx.rollback().await?;
            return Err(StoreError::NoSuchStep {
                task: parent.to_owned(),
                step,
                version: version as u64,
            });
        }
        sqlx::query(
            "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, parent_task, parent_step, created_at, updated_at) \
             SELECT $1, skill_name, skill, tools, context, context_budget, model, environment, $2, 'running', $3, $4, id, $4, $5, $5 FROM tasks WHERE id = $6",
        )
        .bind(&id)
        .bind(env_checkpoint.map(to_json))
        .bind(to_json(state))
        .bind(at)
        .bind(now)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        for sql in [
            "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at) \
             SELECT $1, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at FROM journal WHERE task_id = $2 AND step <= $3",
            "INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, ok, result, created_at, finished_at) \
             SELECT $1, step, tool, args, idempotency_key, side_effect, status, ok, result, created_at, finished_at FROM intents WHERE task_id = $2 AND step <= $3",
            "INSERT INTO snapshots (task_id, step, state, state_hash) \
             SELECT $1, step, state, state_hash FROM snapshots WHERE task_id = $2 AND step <= $3",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .bind(parent)
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        // The observation that step `at + 1` starts from belongs to the fork's history too.
        sqlx::query(
            "INSERT INTO observations (task_id, step, text) SELECT $1, step, text FROM observations WHERE task_id = $2 AND step <= $3",
        )
        .bind(&id)
        .bind(parent)
        .bind(at + 1)
        .execute(&mut *tx)
        .await?;
        upsert_snapshot(&mut tx, &id, at, state).await?;
        tx.commit().await?;
        self.task(&id).await
    }

    async fn compact_task(&self, task: &str, keep_from: u64, state_before: &Value) -> Result<u64> {
        let base = keep_from.saturating_sub(1) as i64;
        let mut tx = self.pool.begin().await?;
        // Waits for a fork that is copying this task's history (it holds a share lock).
        sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR NO KEY UPDATE")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        upsert_snapshot(&mut tx, task, base, state_before).await?;
        let mut deleted = 0;
        for sql in [
            "DELETE FROM journal WHERE task_id = $1 AND step < $2",
            "DELETE FROM intents WHERE task_id = $1 AND step < $2",
            "DELETE FROM observations WHERE task_id = $1 AND step < $2",
        ] {
            deleted += sqlx::query(sql)
                .bind(task)
                .bind(keep_from as i64)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        deleted += sqlx::query("DELETE FROM snapshots WHERE task_id = $1 AND step < $2")
            .bind(task)
            .bind(base)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }

    async fn delete_task(&self, task: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // Locking first makes a concurrent fork of this task finish before its parent link is
        // looked for; otherwise the fork's new row would be missed and block the DELETE.
        let found = sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE")
            .bind(task)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            tx.rollback().await?;
            return Err(StoreError::NotFound(task.to_owned()));
        }
        // Forks keep their own copies; only the link to the parent goes.
        sqlx::query("UPDATE tasks SET parent_task = NULL WHERE parent_task = $1")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM tasks WHERE id = $1")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn storage_stats(&self, task: &str) -> Result<StorageStats> {
        // The same per-row formulas as the SQLite backend (octet_length = LENGTH of the text
        // cast to BLOB; the constants stand for the integer columns), so both report the same
        // numbers for the same task.
        Ok(StorageStats {
            steps: self.current_version(task).await?,
            journal_bytes: self
                .sum_bytes(
                    "SELECT CAST(SUM(octet_length(task_id) + 8 + 4 + octet_length(verdict) + octet_length(output) + COALESCE(octet_length(patch), 0) + COALESCE(octet_length(action), 0) + COALESCE(octet_length(errors), 0) + COALESCE(octet_length(state_hash), 0) + 8 + octet_length(prompt_hash) + COALESCE(octet_length(usage), 0) + 16) AS BIGINT) FROM journal WHERE task_id = $1",
                    task,
                )
                .await?,
            intent_bytes: self
                .sum_bytes(
                    "SELECT CAST(SUM(octet_length(task_id) + 8 + octet_length(tool) + octet_length(args) + octet_length(idempotency_key) + octet_length(side_effect) + octet_length(status) + 8 + COALESCE(octet_length(result), 0) + 16) AS BIGINT) FROM intents WHERE task_id = $1",
                    task,
                )
                .await?,
            observation_bytes: self
                .sum_bytes(
                    "SELECT CAST(SUM(octet_length(text)) AS BIGINT) FROM observations WHERE task_id = $1",
                    task,
                )
                .await?,
            snapshot_bytes: self
                .sum_bytes(
                    "SELECT CAST(SUM(octet_length(state) + octet_length(state_hash)) AS BIGINT) FROM snapshots WHERE task_id = $1",
                    task,
                )
                .await?,
        })
    }

    async fn journal_extent(&self, task: &str) -> Result<JournalExtent> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS accepted, MIN(step) AS first, MAX(step) AS last, \
             (SELECT state_hash FROM journal WHERE task_id = $1 AND verdict = 'accepted' ORDER BY step DESC LIMIT 1) AS last_hash, \
             (SELECT MIN(step) FROM snapshots WHERE task_id = $1) AS base \
             FROM journal WHERE task_id = $1 AND verdict = 'accepted'",
        )
        .bind(task)
        .fetch_one(&self.pool)
        .await?;
        extent_from_row(&row)
    }

    async fn acquire_lease(
        &self,
        task: &str,
        claim: &LeaseClaim,
        ttl_ms: u64,
        replacing: Option<&str>,
    ) -> Result<LeaseInfo> {
        // The server's clock decides expiry, so runners on several machines agree.
        let updated = sqlx::query(
            "WITH now AS (SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS ms) \
             UPDATE tasks SET lease_acquired_at = CASE WHEN lease_token IS NOT DISTINCT FROM $1 THEN lease_acquired_at ELSE now.ms END, \
             lease_token = $1, lease_holder = $2, lease_process = $3, lease_expires_at = now.ms + $4 \
             FROM now WHERE id = $5 AND (lease_token IS NULL OR lease_expires_at <= now.ms OR lease_token = $1 OR lease_token = $6)",
        )
        .bind(&claim.token)
        .bind(&claim.holder)
        .bind(&claim.process)
        .bind(ttl_ms.min(i64::MAX as u64 / 2) as i64)
        .bind(task)
        .bind(replacing)
        .execute(&self.pool)
        .await?;
        match self.lease(task).await? {
            Some(lease) if updated.rows_affected() == 1 && lease.token == claim.token => Ok(lease),
            Some(lease) => Err(StoreError::Leased {
                task: task.to_owned(),
                lease: Box::new(lease),
            }),
            None => Err(StoreError::NotFound(task.to_owned())),
        }
    }

    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()> {
        let updated = sqlx::query(
            "UPDATE tasks SET lease_expires_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + $1 WHERE id = $2 AND lease_token = $3",
        )
        .bind(ttl_ms.min(i64::MAX as u64 / 2) as i64)
        .bind(task)
        .bind(token)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::LeaseLost {
                task: task.to_owned(),
            });
        }
        Ok(())
    }

    async fn release_lease(&self, task: &str, token: &str) -> Result<()> {
        sqlx::query(
            "UPDATE tasks SET lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL WHERE id = $1 AND lease_token = $2",
        )
        .bind(task)
        .bind(token)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>> {
        let row = sqlx::query(
            "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = $1",
        )
        .bind(task)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(task.to_owned()))?;
        lease_from_row(&row)
    }
}

// Placeholder until the queue lands (issue 10 work in progress).
#[async_trait]
impl crate::Queue for PostgresStore {
    async fn create_batch(&self, _batch: &crate::NewBatch) -> Result<crate::BatchRecord> {
        Err(crate::queue_todo())
    }
    async fn enqueue_tasks(
        &self,
        _batch: &str,
        _tasks: Vec<crate::QueuedTask>,
    ) -> Result<Vec<String>> {
        Err(crate::queue_todo())
    }
    async fn batch(&self, _id: &str) -> Result<crate::BatchRecord> {
        Err(crate::queue_todo())
    }
    async fn list_batches(&self) -> Result<Vec<crate::BatchRecord>> {
        Err(crate::queue_todo())
    }
    async fn claim_task(
        &self,
        _claim: &LeaseClaim,
        _ttl_ms: u64,
        _batch: Option<&str>,
    ) -> Result<Option<crate::Claimed>> {
        Err(crate::queue_todo())
    }
    async fn settle_claim(
        &self,
        _task: &str,
        _token: &str,
        _settle: &crate::Settle,
        _failure: Option<&str>,
    ) -> Result<()> {
        Err(crate::queue_todo())
    }
    async fn stop_batch(&self, _batch: &str, _reason: &str) -> Result<()> {
        Err(crate::queue_todo())
    }
    async fn requeue_failed(&self, _batch: &str) -> Result<u64> {
        Err(crate::queue_todo())
    }
    async fn batch_tasks(&self, _batch: &str) -> Result<Vec<crate::BatchTask>> {
        Err(crate::queue_todo())
    }
    async fn next_wakeup(&self, _batch: Option<&str>) -> Result<Option<i64>> {
        Err(crate::queue_todo())
    }
    async fn rate_acquire(
        &self,
        _scope: &str,
        _limit: &crate::RateLimit,
        _tokens: u64,
    ) -> Result<crate::RateDecision> {
        Err(crate::queue_todo())
    }
    async fn rate_add_tokens(&self, _scope: &str, _tokens: u64) -> Result<()> {
        Err(crate::queue_todo())
    }
}
