//! The recall index's rows, shared by both backends (docs/recall.md, "Recall and provenance"): what an
//! accepted journal row adds to `recall_entries`, written in the statement group of the row
//! itself (an observation is indexed by the database's own trigger, migration 0011), and how
//! a row read back becomes a `RawHit`.

use std::future::Future;

pub(crate) use skillstate_core::recall::IndexEntry;
use skillstate_core::recall::{HitCursor, RawHit, RecallKind, RecallQuery, step_entries};

use crate::model::{JournalEntry, Verdict};
use crate::{Result, StoreError};

/// The entries an accepted step adds to the index; none for a rejected answer (it changed
/// nothing and did nothing).
pub(crate) fn recall_entries(entry: &JournalEntry) -> Vec<IndexEntry> {
    if entry.verdict != Verdict::Accepted {
        return Vec::new();
    }
    step_entries(&entry.output, entry.patch.as_ref(), entry.action.as_ref())
}

/// A row of `recall_entries` as read back.
pub(crate) fn raw_hit(
    id: i64,
    step: i64,
    kind: &str,
    pointer: Option<String>,
    text: String,
) -> Result<RawHit> {
    let kind = RecallKind::parse(kind).ok_or_else(|| StoreError::Decode {
        what: "recall entry kind".into(),
        message: format!("unknown kind {kind:?}"),
    })?;
    Ok(RawHit::from_index(
        id,
        step.max(0) as u64,
        kind,
        pointer,
        text,
    ))
}

/// The task's key in SQLite's full-text index: its id as one token.
pub(crate) fn task_key(task: &str) -> String {
    format!("t{}", task.replace('-', ""))
}

/// A search of `query` made of pages of the index's candidates (`page(after, n)`: at most `n`
/// entries after `after`, in the search's order). When every word was looked up whole, the
/// candidates are the hits; when some word was looked up by its anchor alone
/// (`RecallQuery::needs_check`), each candidate is checked for the whole words and pages follow
/// until `limit` hits are found or the candidates end, so both backends find exactly the entries
/// the words' phrases find.
pub(crate) async fn checked_search<F, Fut>(
    query: &RecallQuery,
    after: Option<HitCursor>,
    limit: usize,
    mut page: F,
) -> Result<Vec<RawHit>>
where
    F: FnMut(Option<HitCursor>, usize) -> Fut,
    Fut: Future<Output = Result<Vec<RawHit>>>,
{
    if !query.needs_check() {
        return page(after, limit).await;
    }
    if limit == 0 {
        return Ok(Vec::new());
    }
    // Candidates per round trip: about half of an anchor's entries have the whole word in the
    // warehouse's journal (the number names an item and a shelf).
    let per_page = limit.saturating_mul(2).clamp(16, 1000);
    let mut hits = Vec::new();
    let mut cursor = after;
    loop {
        let candidates = page(cursor, per_page).await?;
        let last = candidates.len() < per_page;
        for candidate in candidates {
            cursor = Some(HitCursor {
                step: candidate.step,
                id: candidate.id,
            });
            if candidate.matches(query) {
                hits.push(candidate);
                if hits.len() == limit {
                    return Ok(hits);
                }
            }
        }
        if last {
            return Ok(hits);
        }
    }
}
