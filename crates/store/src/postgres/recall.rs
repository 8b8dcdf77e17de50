//! Searching the recall index on PostgreSQL: full-text search (`simple` configuration, each
//! word a phrase: `phraseto_tsquery`, or its anchor, checked whole after: `IndexWord`) over the
//! GIN-indexed `words` column, or the entries' pointer index for a location alone.

use skillstate_core::recall::{HitCursor, RawHit, RecallQuery};
use sqlx::Row;

use super::PostgresStore;
use crate::Result;
use crate::recall_rows::raw_hit;

impl PostgresStore {
    /// The index's candidates for `query` (its words looked up as `RecallQuery::index_words`
    /// says), in the search's order; `recall_rows::checked_search` makes them hits.
    pub(super) async fn search_candidates(
        &self,
        task: &str,
        query: &RecallQuery,
        after: Option<HitCursor>,
        limit: usize,
    ) -> Result<Vec<RawHit>> {
        let mut sql = String::from(
            "SELECT id, step, kind, pointer, text FROM recall_entries WHERE task_id = $1",
        );
        let mut next = 2;
        let mut param = || {
            let n = next;
            next += 1;
            format!("${n}")
        };
        let index_words = query.index_words();
        if !index_words.is_empty() {
            let words: Vec<String> = index_words
                .iter()
                .map(|_| format!("phraseto_tsquery('simple', {})", param()))
                .collect();
            sql.push_str(&format!(" AND words @@ ({})", words.join(" && ")));
        }
        if query.pointer.is_some() {
            let (p, n, prefix) = (param(), param(), param());
            sql.push_str(&format!(
                " AND (pointer = {p} OR left(pointer, {n}) = {prefix})"
            ));
        }
        if query.from_step.is_some() {
            sql.push_str(&format!(" AND step >= {}", param()));
        }
        if query.to_step.is_some() {
            sql.push_str(&format!(" AND step <= {}", param()));
        }
        if !query.kinds.is_empty() {
            let kinds: Vec<String> = query
                .kinds
                .iter()
                .map(|k| format!("'{}'", k.as_str()))
                .collect();
            sql.push_str(&format!(" AND kind IN ({})", kinds.join(", ")));
        }
        let (cmp, order) = if query.oldest_first {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        if after.is_some() {
            sql.push_str(&format!(" AND (step, id) {cmp} ({}, {})", param(), param()));
        }
        if query.word_tokens.is_empty() {
            sql.push_str(&format!(
                " ORDER BY step {order}, id {order} LIMIT {}",
                param()
            ));
        } else {
            // The matches first, through the GIN index, then their order: left to choose, the
            // planner walks the task's entries in step order and tests each one (30 ms for an
            // item on a 10,000-step journal instead of well under one).
            sql = format!(
                "WITH found AS MATERIALIZED ({sql}) SELECT id, step, kind, pointer, text FROM found ORDER BY step {order}, id {order} LIMIT {}",
                param()
            );
        }
        let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(task);
        // Each word as its tokens (or its anchor), the way the `words` column was built from
        // the text.
        for word in &index_words {
            statement = statement.bind(word.tokens().join(" "));
        }
        if let Some(pointer) = &query.pointer {
            statement = statement
                .bind(pointer.clone())
                .bind(pointer.chars().count() as i32 + 1)
                .bind(format!("{pointer}/"));
        }
        if let Some(from) = query.from_step {
            statement = statement.bind(from as i64);
        }
        if let Some(to) = query.to_step {
            statement = statement.bind(to as i64);
        }
        if let Some(after) = after {
            statement = statement.bind(after.step as i64).bind(after.id);
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
