//! Searching the recall index on SQLite: FTS5 over `recall_fts` (words, intersected with the
//! task's own key), or the entries' pointer index for a location alone.

use skillstate_core::recall::{HitCursor, RawHit, RecallQuery};
use sqlx::Row;

use super::SqliteStore;
use crate::Result;
use crate::recall_rows::{raw_hit, task_key};

impl SqliteStore {
    pub(super) async fn search_index(
        &self,
        task: &str,
        query: &RecallQuery,
        after: Option<HitCursor>,
        limit: usize,
    ) -> Result<Vec<RawHit>> {
        let mut sql = String::from("SELECT e.id, e.step, e.kind, e.pointer, e.text FROM ");
        let words = query.fts5_match();
        if words.is_some() {
            // CROSS JOIN keeps the full-text match as the outer loop: left to choose, SQLite
            // walks the task's entries in step order and probes the match once per entry (a
            // 700-step journal took 190 ms per query instead of 0.3 ms). The match reads only
            // the index written since the task's first entry (FTS5 takes the rowid bound), and
            // intersects with the task's key only when most of that part is other tasks':
            // walking the key's list, which every entry of the task is on, is what grew with the
            // journal (`cargo bench -p skillstate-store --bench recall`: p50 0.94 ms with the
            // key on every search, 0.52 ms since). Either form
            // finds the same rows: the join keeps the task's own.
            sql.push_str(
                "recall_fts CROSS JOIN recall_entries e ON e.id = recall_fts.rowid \
                 WHERE recall_fts MATCH COALESCE((\
                   SELECT CASE WHEN (SELECT max(id) FROM recall_entries) - s.first < 16 * (t.version + 1) THEN ? ELSE ? END \
                   FROM tasks t, (SELECT min(id) AS first FROM recall_entries WHERE task_id = ?) s WHERE t.id = ?), ?) \
                 AND recall_fts.rowid >= COALESCE((SELECT min(id) FROM recall_entries WHERE task_id = ?), 0) \
                 AND e.task_id = ?",
            );
        } else {
            sql.push_str("recall_entries e WHERE e.task_id = ?");
        }
        filters(&mut sql, query, after);
        let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(words) = words {
            let key = task_key(task).replace('"', "\"\"");
            let keyed = format!("task_key : \"{key}\" AND text : ({words})");
            statement = statement
                .bind(format!("text : ({words})"))
                .bind(keyed.clone())
                .bind(task)
                .bind(task)
                .bind(keyed)
                .bind(task);
        }
        statement = statement.bind(task);
        if let Some(pointer) = &query.pointer {
            statement = statement
                .bind(pointer.clone())
                .bind(pointer.chars().count() as i64 + 1)
                .bind(format!("{pointer}/"));
        }
        if let Some(from) = query.from_step {
            statement = statement.bind(from as i64);
        }
        if let Some(to) = query.to_step {
            statement = statement.bind(to as i64);
        }
        if let Some(after) = after {
            statement = statement
                .bind(after.step as i64)
                .bind(after.step as i64)
                .bind(after.id);
        }
        let rows = statement
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|row| {
                raw_hit(
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get::<&str, _>(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                )
            })
            .collect()
    }
}

/// The filters after the task's own, in the order their values are bound; then the order and
/// the limit. Only constants and placeholders enter the text.
fn filters(sql: &mut String, query: &RecallQuery, after: Option<HitCursor>) {
    if query.pointer.is_some() {
        sql.push_str(" AND (e.pointer = ? OR substr(e.pointer, 1, ?) = ?)");
    }
    if query.from_step.is_some() {
        sql.push_str(" AND e.step >= ?");
    }
    if query.to_step.is_some() {
        sql.push_str(" AND e.step <= ?");
    }
    if !query.kinds.is_empty() {
        let kinds: Vec<String> = query
            .kinds
            .iter()
            .map(|k| format!("'{}'", k.as_str()))
            .collect();
        sql.push_str(&format!(" AND e.kind IN ({})", kinds.join(", ")));
    }
    let (cmp, order) = if query.oldest_first {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    if after.is_some() {
        sql.push_str(&format!(
            " AND (e.step {cmp} ? OR (e.step = ? AND e.id {cmp} ?))"
        ));
    }
    sql.push_str(&format!(" ORDER BY e.step {order}, e.id {order} LIMIT ?"));
}
