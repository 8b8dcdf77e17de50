//! The per-task figures of a batch on SQLite: three grouped queries (tasks, journal, intents)
//! however many tasks the batch holds; the token totals of a page of tasks (one grouped query);
//! the batches a tenant sees.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Row};

use super::SqliteStore;
use crate::queue::{BatchRecord, BatchTask};
use crate::queue_rows::{
    BATCH_COLUMNS, BATCH_TASK_COLUMNS, add_journal_figures, batch_from_row, batch_task_from_row,
    totals_from_row, visible_to,
};
use crate::service::{BatchQuery, TaskTotals};
use crate::service_rows::page_limit;
use crate::{Queue, Result, StoreError, now_millis};

/// A provider-reported usage count, 0 when the usage is absent, not JSON or not a number.
fn usage(key: &str) -> String {
    format!(
        "SUM(CASE WHEN json_valid(j.usage) AND json_type(j.usage, '$.{key}') = 'integer' THEN json_extract(j.usage, '$.{key}') ELSE 0 END) AS {key}"
    )
}

pub(super) async fn batch_tasks(store: &SqliteStore, batch: &str) -> Result<Vec<BatchTask>> {
    // Names a missing batch instead of answering with no tasks.
    let batch = store.batch(batch).await?.id;
    let now = now_millis();
    let sql = format!(
        "SELECT {BATCH_TASK_COLUMNS} FROM tasks WHERE batch_id = ? ORDER BY created_at, id"
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&batch)
        .fetch_all(store.pool())
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
         SUM(CASE WHEN j.verdict = 'accepted' THEN 1 ELSE 0 END) AS accepted, \
         SUM(CASE WHEN j.verdict = 'rejected' THEN 1 ELSE 0 END) AS rejected, \
         SUM(CASE WHEN j.verdict = 'rejected' AND json_valid(j.errors) AND json_type(j.errors) = 'array' \
             AND EXISTS (SELECT 1 FROM json_each(j.errors) e WHERE e.type = 'object' \
                 AND json_extract(e.value, '$.kind') IN ('unknown_tool', 'tool_args')) THEN 1 ELSE 0 END) AS tool_call_rejections, \
         SUM(j.prompt_tokens) AS prompt_tokens, {}, {}, \
         MIN(j.created_at) AS started_at \
         FROM journal j JOIN tasks t ON t.id = j.task_id WHERE t.batch_id = ? GROUP BY j.task_id",
        usage("input_tokens"),
        usage("output_tokens"),
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&batch)
        .fetch_all(store.pool())
        .await?;
    for row in &rows {
        let id: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&id) {
            add_journal_figures(&mut tasks[i], row)?;
        }
    }

    let rows = sqlx::query(
        "SELECT i.task_id, \
         SUM(CASE WHEN i.ok = 0 THEN 1 ELSE 0 END) AS errors, \
         SUM(CASE WHEN i.ok IS NULL THEN 1 ELSE 0 END) AS unknown \
         FROM intents i JOIN tasks t ON t.id = i.task_id \
         WHERE t.batch_id = ? AND i.status = 'done' AND (i.ok = 0 OR i.ok IS NULL) GROUP BY i.task_id",
    )
    .bind(&batch)
    .fetch_all(store.pool())
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
    store: &SqliteStore,
    tasks: &[String],
) -> Result<HashMap<String, TaskTotals>> {
    if tasks.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = format!(
        "SELECT j.task_id, COUNT(*) AS answers, SUM(j.prompt_tokens) AS prompt_tokens, \
         SUM(COALESCE(j.output_tokens, 0)) AS counted_output_tokens, \
         SUM(CASE WHEN json_valid(j.usage) AND json_type(j.usage, '$.input_tokens') = 'integer' THEN 1 ELSE 0 END) AS reported, \
         {}, {} \
         FROM journal j WHERE j.task_id IN (SELECT value FROM json_each(?)) GROUP BY j.task_id",
        usage("input_tokens"),
        usage("output_tokens"),
    );
    let ids = crate::rows::to_json(&tasks);
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(ids)
        .fetch_all(store.pool())
        .await?;
    rows.iter().map(totals_from_row).collect()
}

/// The batches whose every task is `query.tenant`'s, newest first (ids are UUIDv7).
pub(super) async fn list_batches_page(
    store: &SqliteStore,
    query: &BatchQuery,
) -> Result<Vec<BatchRecord>> {
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM batches b WHERE {} AND (?3 IS NULL OR b.id < ?3) \
         ORDER BY b.id DESC LIMIT ?2",
        visible_to("?1")
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(&query.tenant)
        .bind(page_limit(query.limit))
        .bind(query.after.as_deref())
        .fetch_all(store.pool())
        .await?;
    rows.iter().map(batch_from_row).collect()
}

pub(super) async fn batch_tenant(store: &SqliteStore, batch: &str) -> Result<Option<String>> {
    let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM batches WHERE id = ?")
        .bind(batch)
        .fetch_optional(store.pool())
        .await?;
    if found.is_none() {
        return Err(StoreError::NoSuchBatch(batch.to_owned()));
    }
    let tenants: Vec<Option<String>> =
        sqlx::query_scalar("SELECT DISTINCT tenant FROM tasks WHERE batch_id = ? LIMIT 2")
            .bind(batch)
            .fetch_all(store.pool())
            .await?;
    Ok(match tenants.as_slice() {
        [Some(tenant)] => Some(tenant.clone()),
        _ => None,
    })
}
