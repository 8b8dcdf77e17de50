//! The work queue on SQLite: batches, claims and settles. Every write here is one `BEGIN
//! IMMEDIATE` transaction (or one statement), so claims are serialised by SQLite's write lock
//! and two claimers never get the same task.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};

use super::SqliteStore;
use super::tasks::insert_task;
use crate::model::*;
use crate::queue::*;
use crate::queue_rows::{BATCH_COLUMNS, batch_from_row, on_error_str};
use crate::rows::to_json;
use crate::{Result, StoreError, now_millis};

/// `tasks t` is claimable now (`?1` = now): queued, past its backoff, nobody's lease, its batch
/// open.
const CLAIMABLE: &str = "t.queue = 'queued' AND (t.not_before IS NULL OR t.not_before <= ?1) \
     AND (t.lease_token IS NULL OR t.lease_expires_at <= ?1) \
     AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open')";

impl SqliteStore {
    /// The full id of the batch `id_or_prefix` names.
    pub(super) async fn resolve_batch(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim().to_ascii_lowercase();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NoSuchBatch(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM batches WHERE id LIKE ? || '%' ORDER BY id LIMIT 2")
                .bind(&wanted)
                .fetch_all(&self.pool)
                .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NoSuchBatch(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ if ids.contains(&wanted) => Ok(wanted),
            _ => {
                let count: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM batches WHERE id LIKE ? || '%'")
                        .bind(&wanted)
                        .fetch_one(&self.pool)
                        .await?;
                Err(StoreError::AmbiguousBatch {
                    prefix: wanted,
                    count: count as usize,
                })
            }
        }
    }

    async fn task_exists(&self, task: &str) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM tasks WHERE id = ?")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.is_some())
    }
}

#[async_trait]
impl Queue for SqliteStore {
    async fn create_batch(&self, batch: &NewBatch) -> Result<BatchRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        sqlx::query(
            "INSERT INTO batches (id, name, spec, on_error, max_retry, requests_per_minute, tokens_per_minute, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'open', ?)",
        )
        .bind(&id)
        .bind(&batch.name)
        .bind(to_json(&batch.spec))
        .bind(on_error_str(batch.on_error))
        .bind(i64::from(batch.max_retry))
        .bind(batch.rate_limit.requests_per_minute.map(i64::from))
        .bind(batch.rate_limit.tokens_per_minute.map(|n| n.min(i64::MAX as u64) as i64))
        .bind(now_millis())
        .execute(&self.pool)
        .await?;
        self.batch(&id).await
    }

    async fn enqueue_tasks(&self, batch: &str, tasks: Vec<QueuedTask>) -> Result<Vec<String>> {
        let now = now_millis();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM batches WHERE id = ?")
            .bind(batch)
            .fetch_optional(&mut *tx)
            .await?;
        if found.is_none() {
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        // One transaction; sqlx keeps each statement prepared on the connection, so the loop
        // only binds and steps.
        let mut ids = Vec::with_capacity(tasks.len());
        for queued in &tasks {
            let id = uuid::Uuid::now_v7().to_string();
            insert_task(
                &mut tx,
                &id,
                &queued.task,
                &queued.initial_state,
                now,
                Some((batch, &queued.labels)),
            )
            .await?;
            ids.push(id);
        }
        tx.commit().await?;
        Ok(ids)
    }

    async fn batch(&self, id_or_prefix: &str) -> Result<BatchRecord> {
        let id = self.resolve_batch(id_or_prefix).await?;
        let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(&id)
            .fetch_one(&self.pool)
            .await?;
        batch_from_row(&row)
    }

    async fn list_batches(&self) -> Result<Vec<BatchRecord>> {
        let sql = format!("SELECT {BATCH_COLUMNS} FROM batches ORDER BY created_at DESC, id DESC");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(batch_from_row).collect()
    }

    async fn claim_task(
        &self,
        claim: &LeaseClaim,
        ttl_ms: u64,
        batch: Option<&str>,
    ) -> Result<Option<Claimed>> {
        let now = now_millis();
        let sql = format!(
            "UPDATE tasks SET lease_token = ?2, lease_holder = ?3, lease_process = ?4, lease_acquired_at = ?1, lease_expires_at = ?5 \
             WHERE id = (SELECT t.id FROM tasks t WHERE {CLAIMABLE} AND (?6 IS NULL OR t.batch_id = ?6) ORDER BY t.created_at, t.id LIMIT 1) \
             RETURNING id, batch_id, tries, lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at"
        );
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(now)
            .bind(&claim.token)
            .bind(&claim.holder)
            .bind(&claim.process)
            .bind(now.saturating_add(ttl_ms.min(i64::MAX as u64) as i64))
            .bind(batch)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        row.map(|row| claimed_from_row(&row)).transpose()
    }

    async fn settle_claim(
        &self,
        task: &str,
        token: &str,
        settle: &Settle,
        failure: Option<&str>,
    ) -> Result<()> {
        let (queue, tries, not_before) = match settle {
            Settle::Done => ("done", 0, None),
            Settle::RetryAt { not_before } => ("queued", 1, Some(*not_before)),
        };
        let updated = sqlx::query(
            "UPDATE tasks SET queue = ?, tries = tries + ?, not_before = ?, failure = COALESCE(?, failure), updated_at = ?, \
             lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL \
             WHERE id = ? AND lease_token = ?",
        )
        .bind(queue)
        .bind(tries)
        .bind(not_before)
        .bind(failure)
        .bind(now_millis())
        .bind(task)
        .bind(token)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() == 1 {
            return Ok(());
        }
        if !self.task_exists(task).await? {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        Err(StoreError::LeaseLost {
            task: task.to_owned(),
        })
    }

    async fn stop_batch(&self, batch: &str, reason: &str) -> Result<()> {
        // The first reason stays: it names the failure that stopped the batch.
        let updated = sqlx::query(
            "UPDATE batches SET state = 'stopped', stop_reason = CASE WHEN state = 'stopped' THEN stop_reason ELSE ? END WHERE id = ?",
        )
        .bind(reason)
        .bind(batch)
        .execute(&self.pool)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        Ok(())
    }

    async fn requeue_failed(&self, batch: &str) -> Result<u64> {
        let now = now_millis();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let reopened =
            sqlx::query("UPDATE batches SET state = 'open', stop_reason = NULL WHERE id = ?")
                .bind(batch)
                .execute(&mut *tx)
                .await?;
        if reopened.rows_affected() == 0 {
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        // A failed task someone is running right now (a retry in progress) is left to its
        // runner. The others get a fresh round of retries.
        let queued = sqlx::query(
            "UPDATE tasks SET queue = 'queued', not_before = NULL, tries = 0, updated_at = ?1 \
             WHERE batch_id = ?2 AND status = 'failed' AND (lease_token IS NULL OR lease_expires_at <= ?1)",
        )
        .bind(now)
        .bind(batch)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(queued.rows_affected())
    }

    async fn batch_tasks(&self, batch: &str) -> Result<Vec<BatchTask>> {
        super::report::batch_tasks(self, batch).await
    }

    async fn next_wakeup(&self, batch: Option<&str>) -> Result<Option<i64>> {
        // Queued tasks of open batches that become claimable later: at the end of their
        // backoff, or when the lease someone holds on them expires (a dead worker's task).
        let wakeup: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(CASE WHEN t.lease_token IS NOT NULL AND t.lease_expires_at > ?1 \
                 THEN MAX(t.lease_expires_at, COALESCE(t.not_before, 0)) ELSE t.not_before END) \
             FROM tasks t WHERE t.queue = 'queued' AND (?2 IS NULL OR t.batch_id = ?2) \
             AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open') \
             AND (t.not_before > ?1 OR (t.lease_token IS NOT NULL AND t.lease_expires_at > ?1))",
        )
        .bind(now_millis())
        .bind(batch)
        .fetch_one(&self.pool)
        .await?;
        Ok(wakeup)
    }

    async fn rate_acquire(
        &self,
        scope: &str,
        limit: &RateLimit,
        tokens: u64,
    ) -> Result<RateDecision> {
        super::rate::acquire(self, scope, limit, tokens).await
    }

    async fn rate_add_tokens(&self, scope: &str, tokens: u64) -> Result<()> {
        super::rate::add_tokens(self, scope, tokens).await
    }
}

fn claimed_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Claimed> {
    let lease = crate::rows::lease_from_row(row)?.ok_or_else(|| StoreError::Decode {
        what: "claimed task".into(),
        message: "the claim wrote no lease".into(),
    })?;
    Ok(Claimed {
        task_id: row.try_get("id")?,
        batch_id: row.try_get("batch_id")?,
        tries: u32::try_from(row.try_get::<i64, _>("tries")?.max(0)).unwrap_or(u32::MAX),
        lease,
    })
}
