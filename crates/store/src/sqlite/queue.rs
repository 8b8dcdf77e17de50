//! The work queue on SQLite: batches, claims and settles. Every write goes through the
//! process's one writer (claims, settles and rate windows in its groups), under SQLite's write
//! lock, so two claimers never get the same task.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Connection};

use super::SqliteStore;
use super::ops::{Reply, Write};
use super::ops_queue::{Claim, Rate, RateTokens, Settle as SettleWrite};
use super::ops_submit::{Chunk, SubmitBatch};
use super::ops_tasks::{NewTasks, TaskRow};
use crate::model::*;
use crate::queue::*;
use crate::queue_rows::{BATCH_COLUMNS, batch_from_row, on_error_str};
use crate::rows::to_json;
use crate::{Result, StoreError, now_millis};

impl SqliteStore {
    /// The full id of the batch `id_or_prefix` names.
    pub(super) async fn resolve_batch(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim().to_ascii_lowercase();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NoSuchBatch(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM batches WHERE id >= ?1 AND id < ?1 || '~' ORDER BY id LIMIT 2",
        )
        .bind(&wanted)
        .fetch_all(&self.pool)
        .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NoSuchBatch(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ if ids.contains(&wanted) => Ok(wanted),
            _ => {
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM batches WHERE id >= ?1 AND id < ?1 || '~'",
                )
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
}

#[async_trait]
impl Queue for SqliteStore {
    async fn create_batch(&self, batch: &NewBatch) -> Result<BatchRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let mut conn = self.write_conn().await?;
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
        .execute(&mut *conn)
        .await?;
        drop(conn);
        self.batch(&id).await
    }

    async fn enqueue_tasks(&self, batch: &str, tasks: Vec<QueuedTask>) -> Result<Vec<String>> {
        // Serialised here, written by the writer in one savepoint: all or nothing.
        let rows: Vec<TaskRow> = tasks
            .iter()
            .map(|t| {
                TaskRow::new(&t.task, &t.initial_state, Some(&t.labels)).of_tenant(t.tenant.clone())
            })
            .collect();
        let ids = rows.iter().map(|row| row.id.clone()).collect();
        self.write_done(Write::NewTasks(NewTasks {
            rows,
            batch: Some(batch.to_owned()),
            board: None,
            now: now_millis(),
        }))
        .await?;
        Ok(ids)
    }

    async fn submit_batch(
        &self,
        batch: &NewBatch,
        tasks: TaskFeed<'_>,
    ) -> Result<(BatchRecord, Vec<String>)> {
        let id = uuid::Uuid::now_v7().to_string();
        // Two chunks wait at most: the feed is read as fast as the writer writes.
        let (sender, receiver) = tokio::sync::mpsc::channel(2);
        let write = Write::SubmitBatch(SubmitBatch {
            id: id.clone(),
            name: batch.name.clone(),
            spec: to_json(&batch.spec),
            on_error: on_error_str(batch.on_error),
            max_retry: i64::from(batch.max_retry),
            requests_per_minute: batch.rate_limit.requests_per_minute.map(i64::from),
            tokens_per_minute: batch
                .rate_limit
                .tokens_per_minute
                .map(|n| n.min(i64::MAX as u64) as i64),
            now: now_millis(),
            chunks: std::sync::Mutex::new(receiver),
        });
        let feed = async move {
            let mut ids = Vec::new();
            loop {
                let mut rows = Vec::with_capacity(SUBMIT_CHUNK);
                let mut failed = None;
                for task in (&mut *tasks).take(SUBMIT_CHUNK) {
                    match task {
                        Ok(t) => rows.push(
                            TaskRow::new(&t.task, &t.initial_state, Some(&t.labels))
                                .of_tenant(t.tenant),
                        ),
                        Err(message) => {
                            failed = Some(message);
                            break;
                        }
                    }
                }
                let last = rows.len() < SUBMIT_CHUNK;
                ids.extend(rows.iter().map(|row| row.id.clone()));
                // A send fails only when the writer gave up: its error is the answer.
                if !rows.is_empty() && sender.send(Chunk::Rows(rows)).await.is_err() {
                    return ids;
                }
                if let Some(message) = failed {
                    let _ = sender.send(Chunk::Failed(message)).await;
                    return ids;
                }
                if last {
                    let _ = sender.send(Chunk::End).await;
                    return ids;
                }
            }
        };
        let (written, ids) = tokio::join!(self.write_done(write), feed);
        written?;
        Ok((self.batch(&id).await?, ids))
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
        let reply = self
            .write(Write::Claim(Claim {
                claim: claim.clone(),
                batch: batch.map(str::to_owned),
                now,
                expires_at: now.saturating_add(ttl_ms.min(i64::MAX as u64) as i64),
            }))
            .await?;
        match reply {
            Reply::Claimed(claimed) => Ok(claimed),
            other => Err(unexpected(other)),
        }
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
        self.write_done(Write::Settle(SettleWrite {
            task: task.to_owned(),
            token: token.to_owned(),
            queue,
            tries,
            not_before,
            failure: failure.map(str::to_owned),
            now: now_millis(),
        }))
        .await
    }

    async fn stop_batch(&self, batch: &str, reason: &str) -> Result<()> {
        // The first reason stays: it names the failure that stopped the batch.
        let mut conn = self.write_conn().await?;
        let updated = sqlx::query(
            "UPDATE batches SET state = 'stopped', stop_reason = CASE WHEN state = 'stopped' THEN stop_reason ELSE ? END WHERE id = ?",
        )
        .bind(reason)
        .bind(batch)
        .execute(&mut *conn)
        .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        Ok(())
    }

    async fn reopen_batch(&self, batch: &str) -> Result<BatchRecord> {
        let mut conn = self.write_conn().await?;
        let updated =
            sqlx::query("UPDATE batches SET state = 'open', stop_reason = NULL WHERE id = ?")
                .bind(batch)
                .execute(&mut *conn)
                .await?;
        drop(conn);
        if updated.rows_affected() == 0 {
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        self.batch(batch).await
    }

    async fn queue_task(&self, task: &str) -> Result<()> {
        let mut conn = self.write_conn().await?;
        let updated =
            sqlx::query("UPDATE tasks SET queue = 'queued', not_before = NULL WHERE id = ?")
                .bind(task)
                .execute(&mut *conn)
                .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        Ok(())
    }

    async fn requeue_failed(&self, batch: &str) -> Result<u64> {
        let now = now_millis();
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
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
        // Queued tasks of open batches: claimable at the end of their backoff, or when the
        // lease someone holds on them expires (a dead worker's task). One that became
        // claimable since the caller's claim answers a time already past.
        let wakeup: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(CASE WHEN t.lease_token IS NOT NULL AND t.lease_expires_at > ?1 \
                 THEN MAX(t.lease_expires_at, COALESCE(t.not_before, 0)) ELSE COALESCE(t.not_before, 0) END) \
             FROM tasks t WHERE t.queue = 'queued' AND (?2 IS NULL OR t.batch_id = ?2) \
             AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open')",
        )
        .bind(now_millis())
        .bind(batch)
        .fetch_one(&self.pool)
        .await?;
        Ok(wakeup)
    }

    async fn queue_depth(&self) -> Result<QueueDepth> {
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(depth_query("?1")))
            .bind(now_millis())
            .fetch_all(&self.pool)
            .await?;
        let mut depth = QueueDepth::default();
        for (state, tasks) in rows {
            depth.add(&state, tasks);
        }
        Ok(depth)
    }

    async fn rate_acquire(
        &self,
        scope: &str,
        limit: &RateLimit,
        tokens: u64,
    ) -> Result<RateDecision> {
        let reply = self
            .write(Write::Rate(Rate {
                scope: scope.to_owned(),
                limit: *limit,
                tokens: tokens.min(i64::MAX as u64),
                now: now_millis(),
            }))
            .await?;
        match reply {
            Reply::Rate(decision) => Ok(decision),
            other => Err(unexpected(other)),
        }
    }

    async fn rate_add_tokens(&self, scope: &str, tokens: u64) -> Result<()> {
        self.write_done(Write::RateTokens(RateTokens {
            scope: scope.to_owned(),
            tokens,
            now: now_millis(),
        }))
        .await
    }
}

pub(super) fn unexpected(reply: Reply) -> StoreError {
    StoreError::Decode {
        what: "the writer's answer".into(),
        message: format!("unexpected {reply:?}"),
    }
}
