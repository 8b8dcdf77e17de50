//! Tasks as wholes on PostgreSQL: create (also owned by a tenant), find, list, fork, compact,
//! delete (with its events), measure.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::json::state_hash;

use super::events::CREATED_EVENTS;
use super::{PostgresStore, TASK_BY_ID};
use crate::model::*;
use crate::rows::{summary_from_row, task_from_row, to_json};
use crate::service::TaskOwner;
use crate::spec_texts::{
    SpecTexts, TaskVersionRow, VersionSummaryRow, stored_version, task_version, version_summary,
};
use crate::{Result, RetiredPartition, StorageStats, StoreError, Tasks, now_millis};

/// Writes the task `id` at version 0 (owned by `owner` when given) with its snapshot, opening
/// observation and `created` event. Returns `false`, writing nothing, when the owner's tenant
/// already has a task with the owner's idempotency key: the unique index decides, after
/// waiting for a concurrent create with the same key to commit or roll back.
pub(super) async fn insert_task(
    conn: &mut sqlx::PgConnection,
    id: &str,
    task: &NewTask,
    initial_state: &Value,
    owner: Option<&TaskOwner>,
    now: i64,
) -> Result<bool> {
    let spec = SpecTexts::of(task);
    let inserted = sqlx::query(
        "INSERT INTO tasks (id, skill_name, spec_hash, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at, tenant, idempotency_key, labels, batch_id, trace_context) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', $9, 0, $10, $10, $11, $12, $13, $14, $15) \
         ON CONFLICT (tenant, idempotency_key) WHERE tenant IS NOT NULL AND idempotency_key IS NOT NULL DO NOTHING",
    )
    .bind(id)
    .bind(&task.skill.name)
    .bind(&spec.hash)
    .bind(task.context.as_str())
    .bind(task.context_budget.map(|b| b as i64))
    .bind(&task.model)
    .bind(task.environment.as_ref().map(to_json))
    .bind(task.env_checkpoint.as_ref().map(to_json))
    .bind(to_json(initial_state))
    .bind(now)
    .bind(owner.map(|o| o.tenant.as_str()))
    .bind(owner.and_then(|o| o.idempotency_key.as_deref()))
    .bind(owner.map(|o| to_json(&o.labels)))
    .bind(owner.and_then(|o| o.batch.as_deref()))
    .bind(owner.and_then(|o| o.trace_context.as_deref()))
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() != 1 {
        return Ok(false);
    }
    store_versions(&mut *conn, std::slice::from_ref(&spec), now).await?;
    sqlx::query("INSERT INTO task_versions (task_id, from_step, spec_hash) VALUES ($1, 0, $2)")
        .bind(id)
        .bind(&spec.hash)
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO snapshots (task_id, step, state, state_hash) VALUES ($1, 0, $2, $3)")
        .bind(id)
        .bind(to_json(initial_state))
        .bind(state_hash(initial_state))
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO observations (task_id, step, text) VALUES ($1, 1, $2)")
        .bind(id)
        .bind(&task.opening_observation)
        .execute(&mut *conn)
        .await?;
    sqlx::query(CREATED_EVENTS)
        .bind([id])
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(true)
}

/// Stores `versions` that are not stored yet. An existing row is locked (a no-op update), so
/// that a concurrent collection of the same version (`collect_version`) either waits for this
/// transaction and then sees its task, or deletes first and this inserts the row again.
pub(super) async fn store_versions(
    conn: &mut sqlx::PgConnection,
    versions: &[SpecTexts],
    now: i64,
) -> Result<()> {
    for spec in versions {
        sqlx::query(
            "INSERT INTO skill_versions (hash, name, version, skill, tools, created_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (hash) DO UPDATE SET created_at = skill_versions.created_at",
        )
        .bind(&spec.hash)
        .bind(&spec.name)
        .bind(&spec.version)
        .bind(&spec.skill)
        .bind(&spec.tools)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Deletes the version `hash` when no task names it any more (garbage collection). The row is
/// locked first, so a task being created with it (`store_versions` locks it too) is either
/// seen by the check, which runs after that task's transaction ends, or stores the row again.
pub(super) async fn collect_version(conn: &mut sqlx::PgConnection, hash: &str) -> Result<()> {
    let locked: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM skill_versions WHERE hash = $1 FOR UPDATE")
            .bind(hash)
            .fetch_optional(&mut *conn)
            .await?;
    if locked.is_some() {
        sqlx::query(
            "DELETE FROM skill_versions WHERE hash = $1 AND NOT EXISTS (SELECT 1 FROM task_versions WHERE spec_hash = $1) \
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE upgrade_to = $1)",
        )
        .bind(hash)
        .execute(&mut *conn)
        .await?;
    }
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
impl Tasks for PostgresStore {
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let mut tx = self.pool.begin().await?;
        insert_task(&mut tx, &id, &task, initial_state, None, now_millis()).await?;
        super::db::commit(tx).await?;
        self.task(&id).await
    }

    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord> {
        // A whole id (what runners and the service pass) is read in one statement; only a
        // prefix is resolved first.
        let exact = id_or_prefix.trim().to_ascii_lowercase();
        if let Some(row) = sqlx::query(TASK_BY_ID)
            .bind(&exact)
            .fetch_optional(&self.pool)
            .await?
        {
            return task_from_row(&row);
        }
        let id = self.resolve_id(id_or_prefix).await?;
        let row = sqlx::query(TASK_BY_ID)
            .bind(&id)
            .fetch_one(&self.pool)
            .await?;
        task_from_row(&row)
    }

    async fn task_state(&self, id: &str) -> Result<TaskState> {
        let row = sqlx::query(TASK_BY_ID)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        Ok(TaskState::of(&task_from_row(&row)?))
    }

    async fn list_tasks(&self) -> Result<Vec<TaskSummary>> {
        let rows = sqlx::query(
            "SELECT id, skill_name, status, version, model, created_at, updated_at FROM tasks ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(summary_from_row).collect())
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
        // The skill version the parent ran at `step` (an upgrade after it is not the fork's),
        // and every version it ran up to there.
        sqlx::query(
            "INSERT INTO tasks (id, skill_name, spec_hash, context, context_budget, model, environment, env_checkpoint, status, state, version, parent_task, parent_step, created_at, updated_at, tenant, labels) \
             SELECT $1, skill_name, (SELECT spec_hash FROM task_versions WHERE task_id = $6 AND from_step <= $4 ORDER BY from_step DESC LIMIT 1), \
             context, context_budget, model, environment, $2, 'running', $3, $4, id, $4, $5, $5, tenant, labels FROM tasks WHERE id = $6",
        )
        .bind(&id)
        .bind(env_checkpoint.map(to_json))
        .bind(to_json(state))
        .bind(at)
        .bind(now)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO task_versions (task_id, from_step, spec_hash) SELECT $1, from_step, spec_hash FROM task_versions WHERE task_id = $2 AND from_step <= $3",
        )
        .bind(&id)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        for sql in [
            "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, output_tokens, prompt_hash, usage, latency_ms, created_at, author, board_version) \
             SELECT $1, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, output_tokens, prompt_hash, usage, latency_ms, created_at, author, board_version FROM journal WHERE task_id = $2 AND step <= $3",
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
        // The parent's recall entries of the kept steps, after the observations (indexed by
        // their trigger as they were copied, after the intents, so a recall result stays out):
        // within a step, the entries keep the parent's order.
        sqlx::query(
            "INSERT INTO recall_entries (task_id, step, kind, pointer, text) \
             SELECT $1, step, kind, pointer, text FROM recall_entries WHERE task_id = $2 AND step <= $3 AND kind <> 'observation' ORDER BY id",
        )
        .bind(&id)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        upsert_snapshot(&mut tx, &id, at, state).await?;
        // A fork of a board member is a member of the same board (its skill's scope).
        sqlx::query(
            "INSERT INTO board_members (task_id, board_id, attached_at) SELECT $1, board_id, $2 FROM board_members WHERE task_id = $3",
        )
        .bind(&id)
        .bind(now)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        sqlx::query(CREATED_EVENTS)
            .bind([&id])
            .bind(now)
            .execute(&mut *tx)
            .await?;
        super::db::commit(tx).await?;
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
        super::db::commit(tx).await?;
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
        let versions: Vec<String> = sqlx::query_scalar(
            "SELECT spec_hash FROM task_versions WHERE task_id = $1 UNION SELECT upgrade_to FROM tasks WHERE id = $1 AND upgrade_to IS NOT NULL",
        )
                .bind(task)
                .fetch_all(&mut *tx)
                .await?;
        sqlx::query("DELETE FROM tasks WHERE id = $1")
            .bind(task)
            .execute(&mut *tx)
            .await?;
        for hash in &versions {
            collect_version(&mut tx, hash).await?;
        }
        super::db::commit(tx).await?;
        Ok(())
    }

    async fn retire_partitions(
        &self,
        updated_before: i64,
        dry_run: bool,
    ) -> Result<Vec<RetiredPartition>> {
        self.retire(updated_before, dry_run).await
    }

    async fn task_versions(&self, task: &str) -> Result<Vec<TaskVersion>> {
        let rows: Vec<TaskVersionRow> = sqlx::query_as(
            "SELECT tv.from_step, tv.spec_hash, v.version FROM task_versions tv JOIN skill_versions v ON v.hash = tv.spec_hash WHERE tv.task_id = $1 ORDER BY tv.from_step",
        )
        .bind(task)
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            // A task names at least the version it was created with.
            self.current_version(task).await?;
        }
        Ok(rows.into_iter().map(task_version).collect())
    }

    async fn skill_version(&self, hash: &str) -> Result<SkillChange> {
        let texts: Option<(String, String)> =
            sqlx::query_as("SELECT skill, tools FROM skill_versions WHERE hash = $1")
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?;
        stored_version(hash, texts)
    }

    async fn skill_versions(&self) -> Result<Vec<SkillVersionSummary>> {
        let rows: Vec<VersionSummaryRow> = sqlx::query_as(
            "SELECT v.hash, v.name, v.version, v.created_at, (SELECT COUNT(*) FROM tasks t WHERE t.spec_hash = v.hash) AS tasks, (SELECT COUNT(DISTINCT tv.task_id) FROM task_versions tv WHERE tv.spec_hash = v.hash) AS ran, CAST(octet_length(v.skill) + octet_length(v.tools) AS BIGINT) AS bytes FROM skill_versions v ORDER BY v.name, v.created_at, v.hash",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(version_summary).collect())
    }

    async fn trace_context(&self, task: &str) -> Result<Option<String>> {
        let found: Option<Option<String>> =
            sqlx::query_scalar("SELECT trace_context FROM tasks WHERE id = $1")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?;
        found.ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }

    async fn schedule_upgrade(
        &self,
        task: &str,
        expected_version: u64,
        change: Option<(&SkillChange, &str)>,
    ) -> Result<()> {
        let spec =
            change.map(|(change, author)| (SpecTexts::new(&change.skill, &change.tools), author));
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        if let Some((spec, _)) = &spec {
            store_versions(&mut tx, std::slice::from_ref(spec), now).await?;
        }
        let before: Option<Option<String>> = sqlx::query_scalar(
            "SELECT upgrade_to FROM tasks WHERE id = $1 AND version = $2 FOR UPDATE",
        )
        .bind(task)
        .bind(expected_version as i64)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(before) = before else {
            tx.rollback().await?;
            let actual = self.current_version(task).await?;
            return Err(StoreError::Conflict {
                task: task.to_owned(),
                expected: expected_version,
                actual,
            });
        };
        sqlx::query("UPDATE tasks SET upgrade_to = $1, upgrade_author = $2 WHERE id = $3")
            .bind(spec.as_ref().map(|(spec, _)| spec.hash.clone()))
            .bind(spec.as_ref().map(|(_, author)| (*author).to_owned()))
            .bind(task)
            .execute(&mut *tx)
            .await?;
        if let Some(hash) = before {
            collect_version(&mut tx, &hash).await?;
        }
        super::db::commit(tx).await?;
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
}
