//! The step journal on SQLite: accepted steps, rejections, tool results, and reading them back.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::json::state_hash;
use sqlx::Row;

use super::SqliteStore;
use crate::model::*;
use crate::rows::{decode, entry_from_row, extent_from_row, to_json, verdict_str};
use crate::{Journal, Result, StoreError, now_millis};

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
impl Journal for SqliteStore {
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
}
