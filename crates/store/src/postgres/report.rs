//! The per-task figures of a batch on PostgreSQL: three grouped queries (tasks, journal,
//! intents) however many tasks the batch holds. JSON columns are text; `skillstate_jsonb`
//! (migration 3) reads them, taking text that is not JSON as absent.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Row};

use super::{NOW_MS, PostgresStore};
use crate::Queue;
use crate::Result;
use crate::queue::BatchTask;
use crate::queue_rows::{BATCH_TASK_COLUMNS, add_journal_figures, batch_task_from_row};

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
        .fetch_one(store.pool())
        .await?;
    let sql = format!(
        "SELECT {BATCH_TASK_COLUMNS} FROM tasks WHERE batch_id = $1 ORDER BY created_at, id"
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
        .fetch_all(store.pool())
        .await?;
    for row in &rows {
        let id: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&id) {
            add_journal_figures(&mut tasks[i], row)?;
        }
    }

    let rows = sqlx::query(
        "SELECT i.task_id, COUNT(*) AS errors FROM intents i JOIN tasks t ON t.id = i.task_id \
         WHERE t.batch_id = $1 AND i.status = 'done' AND i.ok = false GROUP BY i.task_id",
    )
    .bind(&batch)
    .fetch_all(store.pool())
    .await?;
    for row in &rows {
        let id: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&id) {
            tasks[i].tool_errors = row.try_get::<i64, _>("errors")?.max(0) as u64;
        }
    }
    Ok(tasks)
}
