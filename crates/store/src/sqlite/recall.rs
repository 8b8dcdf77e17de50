//! Searching the recall index on SQLite: FTS5 over `recall_fts` (words, intersected with the
//! task's own key), or the entries' pointer index for a location alone.
//!
//! A search runs on the caller's thread through the direct readers (`reads.rs`), like the
//! other reads every step makes: a recall is part of a step, and the two thread hand-overs of
//! the sqlx pool were a sixth of its cost. When the direct read cannot run, the pool answers
//! the same statement with the same values.

use skillstate_core::recall::{HitCursor, RawHit, RecallQuery};
use sqlx::Row;

use super::SqliteStore;
use crate::Result;
use crate::recall_rows::{raw_hit, task_key};

/// A value bound to a search's statement, in order.
#[derive(Debug, Clone)]
pub(super) enum Bind {
    Text(String),
    Int(i64),
}

/// One entry as the search statement returns it: id, step, kind, pointer, text.
pub(super) type SearchRow = (i64, i64, String, Option<String>, String);

impl SqliteStore {
    /// The index's candidates for `query` (its words looked up as `RecallQuery::index_words`
    /// says), in the search's order; `recall_rows::checked_search` makes them hits.
    pub(super) async fn search_candidates(
        &self,
        task: &str,
        query: &RecallQuery,
        after: Option<HitCursor>,
        limit: usize,
    ) -> Result<Vec<RawHit>> {
        let (sql, binds) = search_statement(task, query, after, limit);
        let rows = match self.readers.search(&sql, &binds) {
            Some(rows) => rows,
            None => {
                let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql));
                for bind in binds {
                    statement = match bind {
                        Bind::Text(text) => statement.bind(text),
                        Bind::Int(n) => statement.bind(n),
                    };
                }
                statement
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .map(|row| {
                        Ok((
                            row.try_get(0)?,
                            row.try_get(1)?,
                            row.try_get(2)?,
                            row.try_get(3)?,
                            row.try_get(4)?,
                        ))
                    })
                    .collect::<std::result::Result<Vec<SearchRow>, sqlx::Error>>()?
            }
        };
        rows.into_iter()
            .map(|(id, step, kind, pointer, text)| raw_hit(id, step, &kind, pointer, text))
            .collect()
    }
}

/// The search's statement and its values, in the order they are bound. Only constants and
/// placeholders enter the text.
fn search_statement(
    task: &str,
    query: &RecallQuery,
    after: Option<HitCursor>,
    limit: usize,
) -> (String, Vec<Bind>) {
    let mut sql = String::from("SELECT e.id, e.step, e.kind, e.pointer, e.text FROM ");
    let mut binds = Vec::new();
    let words = query.fts5_match();
    if let Some(words) = words {
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
        let key = task_key(task).replace('"', "\"\"");
        let keyed = format!("task_key : \"{key}\" AND text : ({words})");
        binds.extend([
            Bind::Text(format!("text : ({words})")),
            Bind::Text(keyed.clone()),
            Bind::Text(task.to_owned()),
            Bind::Text(task.to_owned()),
            Bind::Text(keyed),
            Bind::Text(task.to_owned()),
        ]);
    } else {
        sql.push_str("recall_entries e WHERE e.task_id = ?");
    }
    binds.push(Bind::Text(task.to_owned()));
    if let Some(pointer) = &query.pointer {
        sql.push_str(" AND (e.pointer = ? OR substr(e.pointer, 1, ?) = ?)");
        binds.extend([
            Bind::Text(pointer.clone()),
            Bind::Int(pointer.chars().count() as i64 + 1),
            Bind::Text(format!("{pointer}/")),
        ]);
    }
    if let Some(from) = query.from_step {
        sql.push_str(" AND e.step >= ?");
        binds.push(Bind::Int(from.min(i64::MAX as u64) as i64));
    }
    if let Some(to) = query.to_step {
        sql.push_str(" AND e.step <= ?");
        binds.push(Bind::Int(to.min(i64::MAX as u64) as i64));
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
    if let Some(after) = after {
        sql.push_str(&format!(
            " AND (e.step {cmp} ? OR (e.step = ? AND e.id {cmp} ?))"
        ));
        let step = after.step.min(i64::MAX as u64) as i64;
        binds.extend([Bind::Int(step), Bind::Int(step), Bind::Int(after.id)]);
    }
    sql.push_str(&format!(" ORDER BY e.step {order}, e.id {order} LIMIT ?"));
    binds.push(Bind::Int(limit.min(i64::MAX as usize) as i64));
    (sql, binds)
}
