//! The embedded default backend: one SQLite file in WAL mode.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use serde_json::Value;
use skillstate_core::json::state_hash;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use crate::migrate::{check_sqlite, migrate_sqlite};
use crate::model::*;
use crate::rows::{
    decode, entry_from_row, extent_from_row, lease_from_row, summary_from_row, task_from_row,
    to_json, verdict_str,
};
use crate::{
    DEFAULT_SNAPSHOT_EVERY, OpenMode, Result, StorageStats, Store, StoreError, now_millis,
};

/// How hard SQLite syncs on commit. `Full` survives power loss; `Normal` in WAL mode survives
/// process crashes (the last transactions may be lost on power loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    Full,
    Normal,
}

pub struct SqliteStore {
    pool: SqlitePool,
    snapshot_every: u64,
}

const TASK_COLUMNS: &str = "id, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, outcome, parent_task, parent_step, created_at, updated_at";

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

    async fn resolve_id(&self, id_or_prefix: &str) -> Result<String> {
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

    async fn current_version(&self, task: &str) -> Result<u64> {
        let version: Option<i64> = sqlx::query_scalar("SELECT version FROM tasks WHERE id = ?")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        version
            .map(|v| v as u64)
            .ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }
}

async fn insert_entry(
    conn: &mut sqlx::SqliteConnection,
    task: &str,
    entry: &JournalEntry,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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

#[async_trait]
impl Store for SqliteStore {
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_millis();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, 0, ?, ?)",
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
        sqlx::query("INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, 0, ?, ?)")
            .bind(&id)
            .bind(to_json(initial_state))
            .bind(state_hash(initial_state))
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO observations (task_id, step, text) VALUES (?, 1, ?)")
            .bind(&id)
            .bind(&task.opening_observation)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.task(&id).await
    }

    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord> {
        let id = self.resolve_id(id_or_prefix).await?;
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        insert_entry(&mut tx, task, entry).await?;
        sqlx::query("UPDATE tasks SET updated_at = ? WHERE id = ?")
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let (status, outcome) = match &commit.status {
            Some((status, outcome)) => (Some(status.as_str()), outcome.as_ref().map(to_json)),
            None => (None, None),
        };
        let updated = sqlx::query(
            "UPDATE tasks SET state = ?, version = ?, updated_at = ?, status = COALESCE(?, status), outcome = COALESCE(?, outcome) WHERE id = ? AND version = ?",
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
            drop(tx);
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
                "INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
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
                "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)",
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let updated = sqlx::query(
            "UPDATE intents SET status = 'done', ok = ?, result = ?, finished_at = ? WHERE task_id = ? AND step = ? AND status = 'pending'",
        )
        .bind(result.ok)
        .bind(&result.result)
        .bind(now)
        .bind(task)
        .bind(result.step as i64)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(StoreError::Corrupt {
                task: task.to_owned(),
                step: result.step,
                message: "no pending action intent to complete".into(),
            });
        }
        sqlx::query("INSERT INTO observations (task_id, step, text) VALUES (?, ?, ?)")
            .bind(task)
            .bind((result.step + 1) as i64)
            .bind(&result.next_observation)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE tasks SET env_checkpoint = COALESCE(?, env_checkpoint), updated_at = ? WHERE id = ?")
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
        let updated = sqlx::query("UPDATE tasks SET status = ?, outcome = COALESCE(?, outcome), updated_at = ? WHERE id = ?")
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
        let rows = sqlx::query("SELECT * FROM journal WHERE task_id = ? ORDER BY step, attempt")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT text FROM observations WHERE task_id = ? AND step = ?")
                .bind(task)
                .bind(step as i64)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn observations(&self, task: &str) -> Result<Vec<(u64, String)>> {
        let rows =
            sqlx::query("SELECT step, text FROM observations WHERE task_id = ? ORDER BY step")
                .bind(task)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| Ok((row.try_get::<i64, _>("step")? as u64, row.try_get("text")?)))
            .collect()
    }

    async fn intents(&self, task: &str) -> Result<Vec<IntentRecord>> {
        let rows = sqlx::query("SELECT * FROM intents WHERE task_id = ? ORDER BY step")
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
        let row = sqlx::query("SELECT step, state FROM snapshots WHERE task_id = ? AND step <= ? ORDER BY step DESC LIMIT 1")
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
            "SELECT step, patch, state_hash FROM journal WHERE task_id = ? AND verdict = 'accepted' AND step BETWEEN ? AND ? ORDER BY step",
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let created = sqlx::query(
            "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, parent_task, parent_step, created_at, updated_at) \
             SELECT ?, skill_name, skill, tools, context, context_budget, model, environment, ?, 'running', ?, ?, id, ?, ?, ? FROM tasks WHERE id = ? AND version >= ?",
        )
        .bind(&id)
        .bind(env_checkpoint.map(to_json))
        .bind(to_json(state))
        .bind(at)
        .bind(at)
        .bind(now)
        .bind(now)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        if created.rows_affected() != 1 {
            drop(tx);
            let version = self.current_version(parent).await?;
            return Err(StoreError::NoSuchStep {
                task: parent.to_owned(),
                step,
                version,
            });
        }
        for sql in [
            "INSERT INTO journal SELECT ?, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at FROM journal WHERE task_id = ? AND step <= ?",
            "INSERT INTO intents SELECT ?, step, tool, args, idempotency_key, side_effect, status, ok, result, created_at, finished_at FROM intents WHERE task_id = ? AND step <= ?",
            "INSERT INTO snapshots SELECT ?, step, state, state_hash FROM snapshots WHERE task_id = ? AND step <= ?",
        ] {
            sqlx::query(sql)
                .bind(&id)
                .bind(parent)
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("INSERT INTO observations SELECT ?, step, text FROM observations WHERE task_id = ? AND step <= ?")
            .bind(&id)
            .bind(parent)
            .bind(at + 1)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT OR REPLACE INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)")
            .bind(&id)
            .bind(at)
            .bind(to_json(state))
            .bind(state_hash(state))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.task(&id).await
    }

    async fn compact_task(&self, task: &str, keep_from: u64, state_before: &Value) -> Result<u64> {
        let base = keep_from.saturating_sub(1) as i64;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT OR REPLACE INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)")
            .bind(task)
            .bind(base)
            .bind(to_json(state_before))
            .bind(state_hash(state_before))
            .execute(&mut *tx)
            .await?;
        let mut deleted = 0;
        for sql in [
            "DELETE FROM journal WHERE task_id = ? AND step < ?",
            "DELETE FROM intents WHERE task_id = ? AND step < ?",
            "DELETE FROM observations WHERE task_id = ? AND step < ?",
        ] {
            deleted += sqlx::query(sql)
                .bind(task)
                .bind(keep_from as i64)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        deleted += sqlx::query("DELETE FROM snapshots WHERE task_id = ? AND step < ?")
            .bind(task)
            .bind(base)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }

    async fn delete_task(&self, task: &str) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        // Forks keep their own copies; only the link to the parent goes.
        sqlx::query("UPDATE tasks SET parent_task = NULL WHERE parent_task = ?")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        let deleted = sqlx::query("DELETE FROM tasks WHERE id = ?")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn storage_stats(&self, task: &str) -> Result<StorageStats> {
        let bytes = |sql: &'static str| {
            let pool = self.pool.clone();
            let task = task.to_owned();
            async move {
                let value: Option<i64> =
                    sqlx::query_scalar(sql).bind(task).fetch_one(&pool).await?;
                Ok::<u64, StoreError>(value.unwrap_or(0) as u64)
            }
        };
        Ok(StorageStats {
            steps: self.current_version(task).await?,
            journal_bytes: bytes(
                "SELECT SUM(LENGTH(CAST(task_id AS BLOB)) + 8 + 4 + LENGTH(CAST(verdict AS BLOB)) + LENGTH(CAST(output AS BLOB)) + COALESCE(LENGTH(CAST(patch AS BLOB)), 0) + COALESCE(LENGTH(CAST(action AS BLOB)), 0) + COALESCE(LENGTH(CAST(errors AS BLOB)), 0) + COALESCE(LENGTH(CAST(state_hash AS BLOB)), 0) + 8 + LENGTH(CAST(prompt_hash AS BLOB)) + COALESCE(LENGTH(CAST(usage AS BLOB)), 0) + 16) FROM journal WHERE task_id = ?",
            )
            .await?,
            intent_bytes: bytes(
                "SELECT SUM(LENGTH(CAST(task_id AS BLOB)) + 8 + LENGTH(CAST(tool AS BLOB)) + LENGTH(CAST(args AS BLOB)) + LENGTH(CAST(idempotency_key AS BLOB)) + LENGTH(CAST(side_effect AS BLOB)) + LENGTH(CAST(status AS BLOB)) + 8 + COALESCE(LENGTH(CAST(result AS BLOB)), 0) + 16) FROM intents WHERE task_id = ?",
            )
            .await?,
            observation_bytes: bytes("SELECT SUM(LENGTH(CAST(text AS BLOB))) FROM observations WHERE task_id = ?").await?,
            snapshot_bytes: bytes("SELECT SUM(LENGTH(CAST(state AS BLOB)) + LENGTH(CAST(state_hash AS BLOB))) FROM snapshots WHERE task_id = ?").await?,
        })
    }

    async fn journal_extent(&self, task: &str) -> Result<JournalExtent> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS accepted, MIN(step) AS first, MAX(step) AS last, \
             (SELECT state_hash FROM journal WHERE task_id = ?1 AND verdict = 'accepted' ORDER BY step DESC LIMIT 1) AS last_hash, \
             (SELECT MIN(step) FROM snapshots WHERE task_id = ?1) AS base \
             FROM journal WHERE task_id = ?1 AND verdict = 'accepted'",
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
        let now = now_millis();
        let updated = sqlx::query(
            "UPDATE tasks SET lease_acquired_at = CASE WHEN lease_token IS ?1 THEN lease_acquired_at ELSE ?2 END, \
             lease_token = ?1, lease_holder = ?3, lease_process = ?4, lease_expires_at = ?5 \
             WHERE id = ?6 AND (lease_token IS NULL OR lease_expires_at <= ?2 OR lease_token = ?1 OR lease_token IS ?7)",
        )
        .bind(&claim.token)
        .bind(now)
        .bind(&claim.holder)
        .bind(&claim.process)
        .bind(now.saturating_add(ttl_ms.min(i64::MAX as u64) as i64))
        .bind(task)
        .bind(replacing)
        .execute(&self.pool)
        .await?;
        let lease = self.lease(task).await?;
        match lease {
            Some(lease) if updated.rows_affected() == 1 && lease.token == claim.token => Ok(lease),
            Some(lease) => Err(StoreError::Leased {
                task: task.to_owned(),
                lease: Box::new(lease),
            }),
            None => Err(StoreError::NotFound(task.to_owned())),
        }
    }

    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()> {
        let expires = now_millis().saturating_add(ttl_ms.min(i64::MAX as u64) as i64);
        let updated =
            sqlx::query("UPDATE tasks SET lease_expires_at = ? WHERE id = ? AND lease_token = ?")
                .bind(expires)
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
            "UPDATE tasks SET lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL WHERE id = ? AND lease_token = ?",
        )
        .bind(task)
        .bind(token)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>> {
        let row = sqlx::query(
            "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = ?",
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
impl crate::Queue for SqliteStore {
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
