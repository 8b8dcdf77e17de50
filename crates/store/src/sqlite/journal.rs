//! The step journal on SQLite: accepted steps, rejections, tool results and statuses (written
//! through the group-commit writer), and reading them back.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;

use super::SqliteStore;
use super::ops::Write;
use super::ops_steps::{ActionDone, Rejection, Status, Step};
use crate::model::*;
use crate::rows::{decode, entry_from_row, extent_from_row, intent_from_row, to_json};
use crate::{Journal, Result, StoreError, now_millis};

#[async_trait]
impl Journal for SqliteStore {
    async fn record_rejection(&self, task: &str, entry: &JournalEntry) -> Result<()> {
        self.write_done(Write::Rejection(Rejection::new(task, entry, now_millis())))
            .await
    }

    async fn commit_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()> {
        self.write_done(Write::Step(Step::new(
            task,
            expected_version,
            commit,
            self.snapshot_every,
            now_millis(),
        )))
        .await
    }

    async fn record_action_result(&self, task: &str, result: &ActionResult) -> Result<()> {
        self.write_done(Write::ActionDone(ActionDone::new(
            task,
            result,
            now_millis(),
        )))
        .await
    }

    async fn set_status(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
    ) -> Result<()> {
        self.write_done(Write::Status(Status {
            task: task.to_owned(),
            status,
            outcome: outcome.map(to_json),
            now: now_millis(),
        }))
        .await
    }

    async fn journal(&self, task: &str) -> Result<Vec<JournalEntry>> {
        let rows = sqlx::query("SELECT * FROM journal WHERE task_id = ? ORDER BY step, attempt")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>> {
        if let Some(text) = self.readers.observation(task, step) {
            return Ok(text);
        }
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
        if let Some(intents) = self.readers.intents(task) {
            return intents;
        }
        let rows = sqlx::query("SELECT * FROM intents WHERE task_id = ? ORDER BY step")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(intent_from_row).collect()
    }

    async fn intent(&self, task: &str, step: u64) -> Result<Option<IntentRecord>> {
        if let Some(intent) = self.readers.intent(task, step) {
            return intent;
        }
        let row = sqlx::query("SELECT * FROM intents WHERE task_id = ? AND step = ?")
            .bind(task)
            .bind(step as i64)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(intent_from_row).transpose()
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
    async fn search_journal(
        &self,
        task: &str,
        query: &skillstate_core::recall::RecallQuery,
        after: Option<skillstate_core::recall::HitCursor>,
        limit: usize,
    ) -> Result<Vec<skillstate_core::recall::RawHit>> {
        crate::recall_rows::checked_search(query, after, limit, |after, n| {
            self.search_candidates(task, query, after, n)
        })
        .await
    }
}
