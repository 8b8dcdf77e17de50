//! The service's rows, shared by both backends: the `data` of each event kind, decoding keys
//! and events, and the limits of a page.

use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::model::{ActionResult, JournalEntry, TaskStatus};
use crate::rows::{decode, decode_opt, to_json};
use crate::service::{EventKind, EventRecord, KeyRecord};
use crate::{Result, StoreError};

pub(crate) const KEY_COLUMNS: &str = "id, tenant, label, scopes, created_at, revoked_at";

/// The most rows one page (of tasks or events) returns.
pub(crate) const MAX_PAGE: u32 = 1000;

/// `limit` within `1..=MAX_PAGE`.
pub(crate) fn page_limit(limit: u32) -> i64 {
    i64::from(limit.clamp(1, MAX_PAGE))
}

/// A JSON object from keys and values that are JSON text already (serialised by `to_json`),
/// so a step's patch is not serialised twice.
fn object(fields: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(
        2 + fields
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum::<usize>(),
    );
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // The keys are this module's constants: plain words, nothing to escape.
        out.push('"');
        out.push_str(key);
        out.push_str("\":");
        out.push_str(value);
    }
    out.push('}');
    out
}

/// `Step`: `{"step", "patch", "action", "author"}`, from the journal row's JSON text.
pub(crate) fn step_data(
    step: u64,
    patch: Option<&str>,
    action: Option<&str>,
    author: Option<&str>,
) -> String {
    let author = author.map(|author| to_json(&author));
    object(&[
        ("step", &step.to_string()),
        ("patch", patch.unwrap_or("null")),
        ("action", action.unwrap_or("null")),
        ("author", author.as_deref().unwrap_or("null")),
    ])
}

/// `Step` data of `entry`, for callers that hold it unserialised.
pub(crate) fn step_data_of(entry: &JournalEntry) -> String {
    step_data(
        entry.step,
        entry.patch.as_ref().map(to_json).as_deref(),
        entry.action.as_ref().map(to_json).as_deref(),
        entry.author.as_deref(),
    )
}

/// `Rejected`: `{"step", "attempt", "errors"}`.
pub(crate) fn rejected_data(step: u64, attempt: u32, errors: Option<&str>) -> String {
    object(&[
        ("step", &step.to_string()),
        ("attempt", &attempt.to_string()),
        ("errors", errors.unwrap_or("null")),
    ])
}

/// `Action`: `{"step", "ok"}`.
pub(crate) fn action_data(result: &ActionResult) -> String {
    object(&[
        ("step", &result.step.to_string()),
        ("ok", if result.ok { "true" } else { "false" }),
    ])
}

/// The status a task had before a status write.
pub(crate) struct OldStatus {
    pub(crate) status: String,
    pub(crate) outcome: Option<String>,
}

/// The `Status` event of setting `status` (and `outcome`, JSON text, when given) on a task
/// that was at `old`: `None` when neither the status nor the outcome changes (a watcher would
/// see nothing new). The event carries the outcome the task has afterwards.
pub(crate) fn status_data(
    old: &OldStatus,
    status: TaskStatus,
    outcome: Option<&str>,
) -> Option<String> {
    let changed = old.status != status.as_str()
        || outcome.is_some_and(|outcome| old.outcome.as_deref() != Some(outcome));
    if !changed {
        return None;
    }
    // A stored outcome that is not JSON (edited by hand) would make the event unreadable.
    let kept = old
        .outcome
        .as_deref()
        .filter(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok());
    Some(object(&[
        ("status", &to_json(&status.as_str())),
        ("outcome", outcome.or(kept).unwrap_or("null")),
    ]))
}

pub(crate) fn key_from_row<R: Row>(row: &R) -> Result<KeyRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.try_get("id")?;
    Ok(KeyRecord {
        tenant: row.try_get("tenant")?,
        label: row.try_get("label")?,
        scopes: decode_opt(&format!("scopes of API key {id}"), row.try_get("scopes")?)?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
        id,
    })
}

/// An event row (`task_id, tenant, kind, step, data, created_at`) at `position`.
pub(crate) fn event_from_row<R: Row>(row: &R, position: String) -> Result<EventRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let kind: String = row.try_get("kind")?;
    let kind = EventKind::parse(&kind).ok_or_else(|| StoreError::Decode {
        what: format!("kind of event {position}"),
        message: format!("unknown kind `{kind}`"),
    })?;
    let data: Value = decode(
        &format!("data of event {position}"),
        &row.try_get::<String, _>("data")?,
    )?;
    Ok(EventRecord {
        task: row.try_get("task_id")?,
        tenant: row.try_get("tenant")?,
        kind,
        step: row.try_get::<i64, _>("step")?.max(0) as u64,
        data,
        created_at: row.try_get("created_at")?,
        position,
    })
}

/// The error for a position that is not one of ours.
pub(crate) fn bad_position(position: &str) -> StoreError {
    StoreError::BadEventPosition(position.to_owned())
}

/// A decimal number of at most 19 digits (fits `i64`), nothing else (no sign, no spaces).
pub(crate) fn parse_counter(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Whether `text` can be a (prefix of a) uuid: hex digits and `-`.
pub(crate) fn is_id_prefix(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn event_data_is_json_of_its_kind() {
        let step: Value =
            serde_json::from_str(&step_data(3, Some(r#"{"a":1}"#), None, Some("k\"1"))).unwrap();
        assert_eq!(
            step,
            serde_json::json!({"step": 3, "patch": {"a": 1}, "action": null, "author": "k\"1"})
        );
        let rejected: Value = serde_json::from_str(&rejected_data(2, 4, None)).unwrap();
        assert_eq!(
            rejected,
            serde_json::json!({"step": 2, "attempt": 4, "errors": null})
        );
    }

    #[test]
    fn a_status_event_only_when_something_changes() {
        let old = OldStatus {
            status: "running".into(),
            outcome: Some("not json".into()),
        };
        assert_eq!(status_data(&old, TaskStatus::Running, None), None);
        let data: Value =
            serde_json::from_str(&status_data(&old, TaskStatus::Failed, None).unwrap()).unwrap();
        // The unreadable stored outcome is left out rather than copied into the event.
        assert_eq!(
            data,
            serde_json::json!({"status": "failed", "outcome": null})
        );
        let data: Value = serde_json::from_str(
            &status_data(&old, TaskStatus::Running, Some(r#"{"why":"x"}"#)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            data,
            serde_json::json!({"status": "running", "outcome": {"why": "x"}})
        );
    }

    #[test]
    fn counters_are_plain_decimals() {
        assert_eq!(parse_counter("42"), Some(42));
        for bad in ["", "-1", "+1", " 1", "1.5", "99999999999999999999", "x"] {
            assert_eq!(parse_counter(bad), None, "{bad}");
        }
    }
}
