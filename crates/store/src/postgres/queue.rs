//! The work queue on PostgreSQL: batches, claims and settles. A claim is one `UPDATE` of the
//! task its subquery picks `FOR UPDATE SKIP LOCKED`, so workers on many machines claim different
//! tasks without waiting on each other; times come from the server's clock, as for leases.

use async_trait::async_trait;
use skillstate_core::json::state_hash;
use sqlx::{AssertSqlSafe, Row};

use super::events::CREATED_EVENTS;
use super::{NOW_MS, PostgresStore};
use crate::model::*;
use crate::queue::*;
use crate::queue_rows::{BATCH_COLUMNS, batch_from_row, on_error_str};
use crate::rows::to_json;
use crate::spec_texts::SpecTexts;
use crate::{Result, StoreError, now_millis};

/// Tasks written per statement when enqueueing (each column travels as one array).
const ENQUEUE_CHUNK: usize = 500;

/// `tasks t` is claimable at `now.ms`: queued, past its backoff, nobody's lease, its batch
/// open.
const CLAIMABLE: &str = "t.queue = 'queued' AND (t.not_before IS NULL OR t.not_before <= now.ms) \
     AND (t.lease_token IS NULL OR t.lease_expires_at <= now.ms) \
     AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open')";

impl PostgresStore {
    /// The full id of the batch `id_or_prefix` names.
    pub(super) async fn resolve_batch(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim().to_ascii_lowercase();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NoSuchBatch(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM batches WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%' ORDER BY id LIMIT 2",
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
                    "SELECT COUNT(*) FROM batches WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%'",
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

/// Writes `tasks` (with their `ids`) queued in `batch`, with their snapshots, opening
/// observations and `created` events, in `tx`: a few statements, each column one array.
async fn insert_queued(
    tx: &mut sqlx::PgConnection,
    batch: &str,
    ids: &[String],
    tasks: &[QueuedTask],
    now: i64,
) -> Result<()> {
    let states: Vec<String> = tasks.iter().map(|t| to_json(&t.initial_state)).collect();
    // Each task's skill version, stored once for the tasks that share it.
    let mut hashes: Vec<String> = Vec::with_capacity(tasks.len());
    let mut versions: Vec<SpecTexts> = Vec::new();
    for task in tasks {
        let spec = SpecTexts::of(&task.task);
        hashes.push(spec.hash.clone());
        if !versions.iter().any(|v| v.hash == spec.hash) {
            versions.push(spec);
        }
    }
    super::tasks::store_versions(&mut *tx, &versions, now).await?;
    sqlx::query(
            "INSERT INTO tasks (id, skill_name, spec_hash, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at, batch_id, queue, labels, tenant) \
             SELECT u.id, u.skill_name, u.spec_hash, u.context, u.context_budget, u.model, u.environment, u.env_checkpoint, 'running', u.state, 0, $10, $10, $11, 'queued', u.labels, u.tenant \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[], $12::text[], $13::text[]) \
             AS u(id, skill_name, spec_hash, context, context_budget, model, environment, env_checkpoint, state, labels, tenant)",
        )
        .bind(ids)
        .bind(tasks.iter().map(|t| t.task.skill.name.clone()).collect::<Vec<_>>())
        .bind(&hashes)
        .bind(tasks.iter().map(|t| t.task.context.as_str().to_owned()).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.task.context_budget.map(|b| b as i64)).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.task.model.clone()).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.task.environment.as_ref().map(to_json)).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.task.env_checkpoint.as_ref().map(to_json)).collect::<Vec<_>>())
        .bind(&states)
        .bind(now)
        .bind(batch)
        .bind(tasks.iter().map(|t| to_json(&t.labels)).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.tenant.clone()).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO task_versions (task_id, from_step, spec_hash) \
             SELECT u.id, 0, u.hash FROM UNNEST($1::text[], $2::text[]) AS u(id, hash)",
    )
    .bind(ids)
    .bind(&hashes)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
            "INSERT INTO snapshots (task_id, step, state, state_hash) \
             SELECT u.id, 0, u.state, u.hash FROM UNNEST($1::text[], $2::text[], $3::text[]) AS u(id, state, hash)",
        )
        .bind(ids)
        .bind(&states)
        .bind(tasks.iter().map(|t| state_hash(&t.initial_state)).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO observations (task_id, step, text) \
             SELECT u.id, 1, u.text FROM UNNEST($1::text[], $2::text[]) AS u(id, text)",
    )
    .bind(ids)
    .bind(
        tasks
            .iter()
            .map(|t| t.task.opening_observation.clone())
            .collect::<Vec<_>>(),
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(CREATED_EVENTS)
        .bind(ids)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The batch's row, open, as `create_batch` and `submit_batch` write it.
async fn insert_batch<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    id: &str,
    batch: &NewBatch,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO batches (id, name, spec, on_error, max_retry, requests_per_minute, tokens_per_minute, state, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, 'open', $8)",
    )
    .bind(id)
    .bind(&batch.name)
    .bind(to_json(&batch.spec))
    .bind(on_error_str(batch.on_error))
    .bind(i64::from(batch.max_retry))
    .bind(batch.rate_limit.requests_per_minute.map(i64::from))
    .bind(batch.rate_limit.tokens_per_minute.map(|n| n.min(i64::MAX as u64) as i64))
    .bind(now)
    .execute(executor)
    .await?;
    Ok(())
}

#[async_trait]
impl Queue for PostgresStore {
    async fn create_batch(&self, batch: &NewBatch) -> Result<BatchRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        insert_batch(&self.pool, &id, batch, now_millis()).await?;
        self.batch(&id).await
    }

    async fn enqueue_tasks(&self, batch: &str, tasks: Vec<QueuedTask>) -> Result<Vec<String>> {
        let now = now_millis();
        let ids: Vec<String> = tasks
            .iter()
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let mut tx = self.pool.begin().await?;
        // The share lock keeps the batch from going away while its tasks are written.
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM batches WHERE id = $1 FOR SHARE")
                .bind(batch)
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            tx.rollback().await?;
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        for (ids, tasks) in ids.chunks(ENQUEUE_CHUNK).zip(tasks.chunks(ENQUEUE_CHUNK)) {
            insert_queued(&mut tx, batch, ids, tasks, now).await?;
        }
        super::db::commit(tx).await?;
        Ok(ids)
    }

    async fn submit_batch(
        &self,
        batch: &NewBatch,
        tasks: TaskFeed<'_>,
    ) -> Result<(BatchRecord, Vec<String>)> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_millis();
        // One transaction: dropped on any early return (an error, the feed's or a statement's),
        // it rolls back, and a process that dies leaves nothing committed.
        let mut tx = self.pool.begin().await?;
        insert_batch(&mut *tx, &id, batch, now).await?;
        let mut all = Vec::new();
        loop {
            let mut chunk = Vec::with_capacity(SUBMIT_CHUNK);
            for task in (&mut *tasks).take(SUBMIT_CHUNK) {
                chunk.push(task.map_err(StoreError::Feed)?);
            }
            if chunk.is_empty() {
                break;
            }
            let ids: Vec<String> = chunk
                .iter()
                .map(|_| uuid::Uuid::now_v7().to_string())
                .collect();
            insert_queued(&mut tx, &id, &ids, &chunk, now).await?;
            all.extend(ids);
            if chunk.len() < SUBMIT_CHUNK {
                break;
            }
        }
        super::db::commit(tx).await?;
        Ok((self.batch(&id).await?, all))
    }

    async fn batch(&self, id_or_prefix: &str) -> Result<BatchRecord> {
        let id = self.resolve_batch(id_or_prefix).await?;
        let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = $1");
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
        self.pool
            .unit(|| async move {
                // Run again when the connection is lost (`Db::unit`), even after the server may have
        // committed the claim: a claim whose answer was lost leaves a lease nobody renews, and
        // the task is taken over when it expires (`took_over`); its journal decides where it
        // resumes, so nothing runs twice.
        // The subquery locks the oldest claimable row, skipping rows other claimers hold
                // locked; a row claimed and committed meanwhile is re-checked against CLAIMABLE and
                // passed over.
                // A lease still recorded on the picked row expired without being released: a takeover.
                // Two statements, not `($5 IS NULL OR t.batch_id = $5)`: a generic plan of that form
                // cannot use `tasks_claimable_by_batch` and scans the batch's finished tasks too.
                let of_batch = if batch.is_some() {
                    "AND t.batch_id = $5"
                } else {
                    ""
                };
                let sql = format!(
                    "WITH now AS (SELECT {NOW_MS} AS ms), \
                     picked AS (SELECT t.id, t.lease_token IS NOT NULL AS took_over FROM tasks t, now WHERE {CLAIMABLE} {of_batch} \
                         ORDER BY t.created_at, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED) \
                     UPDATE tasks SET lease_token = $1, lease_holder = $2, lease_process = $3, lease_acquired_at = now.ms, lease_expires_at = now.ms + $4 \
                     FROM now, picked WHERE tasks.id = picked.id \
                     RETURNING tasks.id, tasks.batch_id, tasks.tries, tasks.lease_token, tasks.lease_holder, tasks.lease_process, tasks.lease_acquired_at, tasks.lease_expires_at, picked.took_over"
                );
                let query = sqlx::query(AssertSqlSafe(sql))
                    .bind(&claim.token)
                    .bind(&claim.holder)
                    .bind(&claim.process)
                    .bind(ttl_ms.min(i64::MAX as u64 / 2) as i64);
                let query = match batch {
                    Some(batch) => query.bind(batch),
                    None => query,
                };
                let row = query.fetch_optional(&self.pool).await?;
                row.map(|row| {
                    let lease = crate::rows::lease_from_row(&row)?.ok_or_else(|| StoreError::Decode {
                        what: "claimed task".into(),
                        message: "the claim wrote no lease".into(),
                    })?;
                    Ok(Claimed {
                        task_id: row.try_get("id")?,
                        batch_id: row.try_get("batch_id")?,
                        tries: u32::try_from(row.try_get::<i64, _>("tries")?.max(0)).unwrap_or(u32::MAX),
                        lease,
                        took_over: row.try_get("took_over")?,
                    })
            })
            .transpose()
            })
            .await
    }

    async fn settle_claim(
        &self,
        task: &str,
        token: &str,
        settle: &Settle,
        failure: Option<&str>,
    ) -> Result<()> {
        self.pool
            .checked_unit(
                || async move {
                let (queue, tries, not_before) = match settle {
                    Settle::Done => ("done", 0i64, None),
                    Settle::RetryAt { not_before } => ("queued", 1, Some(*not_before)),
                };
                // One statement (`skillstate_settle_claim`, schema 16): waiting inbox entries
                // keep the task queued, a post in progress included.
                let row = self
                    .pool
                    .write_alone(
                        sqlx::query("SELECT skillstate_settle_claim($1, $2, $3, $4, $5, $6, $7) AS answer")
                            .bind(task)
                            .bind(token)
                            .bind(queue)
                            .bind(tries)
                            .bind(not_before)
                            .bind(failure)
                            .bind(now_millis()),
                    )
                    .await?;
                let answer: String = row.try_get("answer")?;
                match answer.as_str() {
                    "ok" => Ok(()),
                    "not_found" => Err(StoreError::NotFound(task.to_owned())),
                    _ => Err(self.lost_lease(task).await?),
                }
            },
                // Settled: the claim's lease is gone (a takeover would have left another).
                || self.lease_cleared(task),
            )
            .await
    }

    async fn stop_batch(&self, batch: &str, reason: &str) -> Result<()> {
        // The first reason stays: it names the failure that stopped the batch.
        let updated = sqlx::query(
            "UPDATE batches SET state = 'stopped', stop_reason = CASE WHEN state = 'stopped' THEN stop_reason ELSE $1 END WHERE id = $2",
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

    async fn reopen_batch(&self, batch: &str) -> Result<BatchRecord> {
        let sql = format!(
            "UPDATE batches SET state = 'open', stop_reason = NULL WHERE id = $1 RETURNING {BATCH_COLUMNS}"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(batch)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(row) => batch_from_row(&row),
            None => Err(StoreError::NoSuchBatch(batch.to_owned())),
        }
    }

    async fn queue_task(&self, task: &str) -> Result<()> {
        let updated =
            sqlx::query("UPDATE tasks SET queue = 'queued', not_before = NULL WHERE id = $1")
                .bind(task)
                .execute(&self.pool)
                .await?;
        if updated.rows_affected() == 0 {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        Ok(())
    }

    async fn requeue_failed(&self, batch: &str) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let reopened =
            sqlx::query("UPDATE batches SET state = 'open', stop_reason = NULL WHERE id = $1")
                .bind(batch)
                .execute(&mut *tx)
                .await?;
        if reopened.rows_affected() == 0 {
            tx.rollback().await?;
            return Err(StoreError::NoSuchBatch(batch.to_owned()));
        }
        // A failed task someone is running right now (a retry in progress) is left to its
        // runner. The others get a fresh round of retries.
        let sql = format!(
            "WITH now AS (SELECT {NOW_MS} AS ms) \
             UPDATE tasks SET queue = 'queued', not_before = NULL, tries = 0, updated_at = $2 FROM now \
             WHERE batch_id = $1 AND status = 'failed' AND (lease_token IS NULL OR lease_expires_at <= now.ms)"
        );
        let queued = sqlx::query(AssertSqlSafe(sql))
            .bind(batch)
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        super::db::commit(tx).await?;
        Ok(queued.rows_affected())
    }

    async fn batch_tasks(&self, batch: &str) -> Result<Vec<BatchTask>> {
        super::report::batch_tasks(self, batch).await
    }

    async fn work_signal(&self) -> Result<Option<tokio::sync::watch::Receiver<u64>>> {
        self.work_signal_rx().await
    }

    async fn next_wakeup(&self, batch: Option<&str>) -> Result<Option<i64>> {
        // Queued tasks of open batches: claimable at the end of their backoff, or when the
        // lease someone holds on them expires (a dead worker's task). One that became
        // claimable since the caller's claim answers a time already past.
        let sql = format!(
            "WITH now AS (SELECT {NOW_MS} AS ms) \
             SELECT MIN(CASE WHEN t.lease_token IS NOT NULL AND t.lease_expires_at > now.ms \
                 THEN GREATEST(t.lease_expires_at, COALESCE(t.not_before, 0)) ELSE COALESCE(t.not_before, 0) END) \
             FROM tasks t, now WHERE t.queue = 'queued' AND ($1::text IS NULL OR t.batch_id = $1) \
             AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open')"
        );
        let wakeup: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(batch)
            .fetch_one(&self.pool)
            .await?;
        Ok(wakeup)
    }

    async fn queue_depth(&self) -> Result<QueueDepth> {
        let sql = format!(
            "WITH now AS (SELECT {NOW_MS} AS ms) {}",
            depth_query("(SELECT ms FROM now)")
        );
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(sql))
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
        super::rate::acquire(self, scope, limit, tokens).await
    }

    async fn rate_add_tokens(&self, scope: &str, tokens: u64) -> Result<()> {
        super::rate::add_tokens(self, scope, tokens).await
    }
}

impl PostgresStore {
    /// Whether `task` holds no lease (a settle of its claim was recorded).
    async fn lease_cleared(&self, task: &str) -> Result<bool> {
        let cleared: Option<bool> =
            sqlx::query_scalar("SELECT lease_token IS NULL FROM tasks WHERE id = $1")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?;
        Ok(cleared.unwrap_or(false))
    }
}
