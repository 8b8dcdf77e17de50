//! The recall index's rows, shared by both backends (docs/recall.md, "Recall and provenance"): what an
//! accepted journal row adds to `recall_entries`, written in the statement group of the row
//! itself (an observation is indexed by the database's own trigger, migration 0011), and how
//! a row read back becomes a `RawHit`.

pub(crate) use skillstate_core::recall::IndexEntry;
use skillstate_core::recall::{RawHit, RecallKind, step_entries};

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
