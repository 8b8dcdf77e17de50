//! The per-task figures of a batch on PostgreSQL: three grouped queries (tasks, journal,
//! intents) however many tasks the batch holds; the token totals of a page of tasks (one
//! grouped query); the batches a tenant sees. JSON columns are text; `skillstate_jsonb`
//! (migration 3) reads them, taking text that is not JSON as absent.
//!
//! Every statement goes through the store's `Db` (`&store.pool`), never the bare `PgPool`
//! (`store.pool()`): outside a transaction sqlx prepares a statement and runs it in two
//! exchanges, which a transaction pooler may send to two different server connections (the
//! second then fails with `prepared statement "sqlx_s_…" does not exist`); `Db` runs such a
//! statement inside a transaction of its own there (db.rs), and on a lent connection otherwise.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Row};

use super::{NOW_MS, PostgresStore};
use crate::queue::{BatchRecord, BatchTask};
use crate::queue_rows::{
    BATCH_COLUMNS, BATCH_TASK_COLUMNS, add_journal_figures, batch_from_row, batch_task_from_row,
    totals_from_row, visible_to,
};
use crate::service::{BatchQuery, TaskTotals};
use crate::service_rows::page_limit;
use crate::{Queue, Result, StoreError};

/// A provider-reported usage count, 0 when absent or not a whole number.
fn usage(key: &str) -> String {
    format!(
        "CAST(SUM(CASE WHEN jsonb_typeof(j.usage -> '{key}') = 'number' AND j.usage ->> '{key}' ~ '^[0-9]{{1,18}}$' \
         THEN CAST(j.usage ->> '{key}' AS BIGINT) ELSE 0 END) AS BIGINT) AS {key}"
    )
}

pub(super) async fn batch_tasks(store: &PostgresStore, batch: &str) -> Result<Vec<BatchTask>> {
    // Names a missing batch instead of answering with no tasks.
    let batch = store.batch(batch).await?.id;
    let now: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW_MS}")))
        .fetch_one(&store.pool)
        .await?;
    let sql = format!(
        "SELECT {BATCH_TASK_COLUMNS} FROM tasks WHERE batch_id = $1 ORDER BY created_at, id"
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&batch)
        .fetch_all(&store.pool)
        .await?;
    let mut tasks = rows
        .iter()
        .map(|row| batch_task_from_row(row, now))
        .collect::<Result<Vec<_>>>()?;
    let index: HashMap<String, usize> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.clone(), i))
        .collect();

    let sql = format!(
        "SELECT j.task_id, \
         CAST(SUM(CASE WHEN j.verdict = 'accepted' THEN 1 ELSE 0 END) AS BIGINT) AS accepted, \
         CAST(SUM(CASE WHEN j.verdict = 'rejected' THEN 1 ELSE 0 END) AS BIGINT) AS rejected, \
         CAST(SUM(CASE WHEN j.verdict = 'rejected' AND jsonb_typeof(j.errors) = 'array' \
             AND EXISTS (SELECT 1 FROM jsonb_array_elements(j.errors) e WHERE jsonb_typeof(e) = 'object' \
                 AND e ->> 'kind' IN ('unknown_tool', 'tool_args')) THEN 1 ELSE 0 END) AS BIGINT) AS tool_call_rejections, \
         CAST(SUM(j.prompt_tokens) AS BIGINT) AS prompt_tokens, {}, {}, \
         MIN(j.created_at) AS started_at \
         FROM (SELECT journal.task_id, journal.verdict, journal.prompt_tokens, journal.created_at, \
                 CASE WHEN journal.verdict = 'rejected' THEN skillstate_jsonb(journal.errors) END AS errors, \
                 skillstate_jsonb(journal.usage) AS usage \
               FROM journal JOIN tasks t ON t.id = journal.task_id WHERE t.batch_id = $1) j \
         GROUP BY j.task_id",
        usage("input_tokens"),
        usage("output_tokens"),
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&batch)
        .fetch_all(&store.pool)
        .await?;
    for row in &rows {
        let id: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&id) {
            add_journal_figures(&mut tasks[i], row)?;
        }
    }

    let rows = sqlx::query(
        "SELECT i.task_id, \
         COUNT(*) FILTER (WHERE i.ok = false) AS errors, \
         COUNT(*) FILTER (WHERE i.ok IS NULL) AS unknown \
         FROM intents i JOIN tasks t ON t.id = i.task_id \
         WHERE t.batch_id = $1 AND i.status = 'done' AND (i.ok = false OR i.ok IS NULL) GROUP BY i.task_id",
    )
    .bind(&batch)
    .fetch_all(&store.pool)
    .await?;
    for row in &rows {
        let id: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&id) {
            tasks[i].tool_errors = row.try_get::<i64, _>("errors")?.max(0) as u64;
            tasks[i].outcome_unknown = row.try_get::<i64, _>("unknown")?.max(0) as u64;
        }
    }
    Ok(tasks)
}

/// The token totals of `tasks`: one grouped query over their journal rows (the journal's key
/// starts with the task id, so each task is one range of it).
pub(super) async fn task_totals(
    store: &PostgresStore,
    tasks: &[String],
) -> Result<HashMap<String, TaskTotals>> {
    if tasks.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = format!(
        "SELECT j.task_id, COUNT(*) AS answers, CAST(SUM(j.prompt_tokens) AS BIGINT) AS prompt_tokens, \
         CAST(SUM(COALESCE(j.output_tokens, 0)) AS BIGINT) AS counted_output_tokens, \
         CAST(SUM(CASE WHEN jsonb_typeof(j.usage -> 'input_tokens') = 'number' THEN 1 ELSE 0 END) AS BIGINT) AS reported, \
         {}, {} \
         FROM (SELECT task_id, prompt_tokens, output_tokens, skillstate_jsonb(usage) AS usage \
               FROM journal WHERE task_id = ANY($1)) j \
         GROUP BY j.task_id",
        usage("input_tokens"),
        usage("output_tokens"),
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(tasks)
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(totals_from_row).collect()
}

/// The batches whose every task is `query.tenant`'s, newest first (ids are UUIDv7).
pub(super) async fn list_batches_page(
    store: &PostgresStore,
    query: &BatchQuery,
) -> Result<Vec<BatchRecord>> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches b WHERE {} AND ($3::text IS NULL OR b.id < $3) \
         ORDER BY b.id DESC LIMIT $2",
        visible_to("$1")
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&query.tenant)
        .bind(page_limit(query.limit))
        .bind(query.after.as_deref())
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(batch_from_row).collect()
}

pub(super) async fn batch_tenant(store: &PostgresStore, batch: &str) -> Result<Option<String>> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM batches WHERE id = $1")
        .bind(batch)
        .fetch_optional(&store.pool)
        .await?;
    if found.is_none() {
        return Err(StoreError::NoSuchBatch(batch.to_owned()));
    }
    let tenants: Vec<Option<String>> =
        sqlx::query_scalar("SELECT DISTINCT tenant FROM tasks WHERE batch_id = $1 LIMIT 2")
            .bind(batch)
            .fetch_all(&store.pool)
            .await?;
    Ok(match tenants.as_slice() {
        [Some(tenant)] => Some(tenant.clone()),
        _ => None,
    })
}
