//! Tasks as wholes on SQLite: create, find, list, fork, compact, delete (with its events),
//! measure.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::json::state_hash;
use sqlx::Connection;

use super::SqliteStore;
use super::ops::Write;
use super::ops_tasks::{CREATED_EVENT, NewTasks, TaskRow};
use crate::model::*;
use crate::rows::{summary_from_row, task_from_row, to_json};
use crate::spec_texts::{
    SpecTexts, TaskVersionRow, VersionSummaryRow, stored_version, task_version, version_summary,
};
use crate::{Result, StorageStats, StoreError, Tasks, now_millis};

#[async_trait]
impl Tasks for SqliteStore {
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord> {
        let row = TaskRow::new(&task, initial_state, None);
        let id = row.id.clone();
        self.write_done(Write::NewTasks(NewTasks {
            rows: vec![row],
            batch: None,
            board: None,
            now: now_millis(),
        }))
        .await?;
        self.task(&id).await
    }

    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord> {
        if let Some(task) = self.readers.task(id_or_prefix) {
            return task;
        }
        let id = self.resolve_id(id_or_prefix).await?;
        let row = sqlx::query(self.task_by_id)
            .bind(&id)
            .fetch_one(&self.pool)
            .await?;
        task_from_row(&row)
    }

    async fn task_state(&self, id: &str) -> Result<TaskState> {
        if let Some(state) = self.readers.task_state(id) {
            return state;
        }
        let row = sqlx::query(self.task_by_id)
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
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        // The skill version the parent ran at `step` (an upgrade after it is not the fork's).
        let created = sqlx::query(
            "INSERT INTO tasks (id, skill_name, context, context_budget, model, environment, env_checkpoint, status, state, version, parent_task, parent_step, created_at, updated_at, tenant, labels, spec_hash) \
             SELECT ?, skill_name, context, context_budget, model, environment, ?, 'running', ?, ?, id, ?, ?, ?, tenant, labels, \
             (SELECT spec_hash FROM task_versions WHERE task_id = tasks.id AND from_step <= ? ORDER BY from_step DESC LIMIT 1) \
             FROM tasks WHERE id = ? AND version >= ?",
        )
        .bind(&id)
        .bind(env_checkpoint.map(to_json))
        .bind(to_json(state))
        .bind(at)
        .bind(at)
        .bind(now)
        .bind(now)
        .bind(at)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        if created.rows_affected() != 1 {
            drop(tx);
            drop(conn);
            let version = self.current_version(parent).await?;
            return Err(StoreError::NoSuchStep {
                task: parent.to_owned(),
                step,
                version,
            });
        }
        // The versions the parent ran up to `step`, named by the fork too (stored once).
        let runs = sqlx::query(
            "INSERT INTO task_versions (task_id, from_step, spec_hash) SELECT ?, from_step, spec_hash FROM task_versions WHERE task_id = ? AND from_step <= ?",
        )
        .bind(&id)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        if runs.rows_affected() == 0 {
            return Err(StoreError::Decode {
                what: format!("skill version of task {parent}"),
                message: "not stored".into(),
            });
        }
        for sql in [
            "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at, output_tokens, author, board_version) SELECT ?, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at, output_tokens, author, board_version FROM journal WHERE task_id = ? AND step <= ?",
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
        // The parent's recall entries of the kept steps, after the observations (indexed by
        // their trigger as they were copied, after the intents, so a recall result stays out):
        // within a step, the entries keep the parent's order.
        sqlx::query(
            "INSERT INTO recall_entries (task_id, step, kind, pointer, text) SELECT ?, step, kind, pointer, text FROM recall_entries WHERE task_id = ? AND step <= ? AND kind <> 'observation' ORDER BY id",
        )
        .bind(&id)
        .bind(parent)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT OR REPLACE INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)")
            .bind(&id)
            .bind(at)
            .bind(to_json(state))
            .bind(state_hash(state))
            .execute(&mut *tx)
            .await?;
        // A fork of a board member is a member of the same board (its skill's scope).
        sqlx::query(
            "INSERT INTO board_members (task_id, board_id, attached_at) SELECT ?, board_id, ? FROM board_members WHERE task_id = ?",
        )
        .bind(&id)
        .bind(now)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        sqlx::query(CREATED_EVENT)
            .bind(now)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(conn);
        self.task(&id).await
    }

    async fn compact_task(&self, task: &str, keep_from: u64, state_before: &Value) -> Result<u64> {
        let base = keep_from.saturating_sub(1) as i64;
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
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
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        // Forks keep their own copies; only the link to the parent goes. The task's rows in the
        // other tables (the skill versions it ran, when no other task names them) go with it: ON DELETE CASCADE,
        // and every connection of the store turns foreign keys on.
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

    async fn task_versions(&self, task: &str) -> Result<Vec<TaskVersion>> {
        let rows: Vec<TaskVersionRow> = sqlx::query_as(
            "SELECT tv.from_step, tv.spec_hash, v.version FROM task_versions tv JOIN skill_versions v ON v.hash = tv.spec_hash WHERE tv.task_id = ? ORDER BY tv.from_step",
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
            sqlx::query_as("SELECT skill, tools FROM skill_versions WHERE hash = ?")
                .bind(hash)
                .fetch_optional(&self.pool)
                .await?;
        stored_version(hash, texts)
    }

    async fn skill_versions(&self) -> Result<Vec<SkillVersionSummary>> {
        let rows: Vec<VersionSummaryRow> = sqlx::query_as(
            "SELECT v.hash, v.name, v.version, v.created_at, (SELECT COUNT(*) FROM tasks t WHERE t.spec_hash = v.hash) AS tasks, (SELECT COUNT(DISTINCT tv.task_id) FROM task_versions tv WHERE tv.spec_hash = v.hash) AS ran, LENGTH(v.skill) + LENGTH(v.tools) AS bytes FROM skill_versions v ORDER BY v.name, v.created_at, v.hash",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(version_summary).collect())
    }

    async fn trace_context(&self, task: &str) -> Result<Option<String>> {
        let found: Option<Option<String>> =
            sqlx::query_scalar("SELECT trace_context FROM tasks WHERE id = ?")
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
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        if let Some((spec, _)) = &spec {
            sqlx::query(super::INSERT_VERSION)
                .bind(&spec.hash)
                .bind(&spec.name)
                .bind(&spec.version)
                .bind(&spec.skill)
                .bind(&spec.tools)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        let updated = sqlx::query(
            "UPDATE tasks SET upgrade_to = ?, upgrade_author = ? WHERE id = ? AND version = ?",
        )
        .bind(spec.as_ref().map(|(spec, _)| spec.hash.clone()))
        .bind(spec.as_ref().map(|(_, author)| (*author).to_owned()))
        .bind(task)
        .bind(expected_version as i64)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            drop(tx);
            drop(conn);
            let actual = self.current_version(task).await?;
            return Err(StoreError::Conflict {
                task: task.to_owned(),
                expected: expected_version,
                actual,
            });
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
}
