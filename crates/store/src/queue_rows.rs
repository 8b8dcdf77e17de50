//! The queue's rows, shared by both backends: the text of its enums, decoding batches and the
//! per-task report rows, and the rolling rate window's decision.

use serde_json::Value;
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::queue::*;
use crate::rows::{decode, decode_opt};
use crate::{Result, StoreError, TaskStatus};

/// The span of a shared rate window.
pub(crate) const RATE_WINDOW_MS: i64 = 60_000;

pub(crate) const BATCH_COLUMNS: &str = "id, name, spec, on_error, max_retry, requests_per_minute, tokens_per_minute, state, stop_reason, created_at";

pub(crate) const BATCH_TASK_COLUMNS: &str = "id, status, queue, tries, labels, version, outcome, failure, created_at, updated_at, lease_token, lease_expires_at";

pub(crate) fn on_error_str(on_error: OnError) -> &'static str {
    match on_error {
        OnError::SkipAndLog => "skip_and_log",
        OnError::Stop => "stop",
    }
}

pub(crate) fn batch_from_row<R: Row>(row: &R) -> Result<BatchRecord>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.try_get("id")?;
    let bad = |what: &str, text: &str| StoreError::Decode {
        what: format!("{what} of batch {id}"),
        message: format!("unknown value `{text}`"),
    };
    let on_error: String = row.try_get("on_error")?;
    let state: String = row.try_get("state")?;
    Ok(BatchRecord {
        name: row.try_get("name")?,
        spec: decode(
            &format!("settings of batch {id}"),
            &row.try_get::<String, _>("spec")?,
        )?,
        on_error: match on_error.as_str() {
            "skip_and_log" => OnError::SkipAndLog,
            "stop" => OnError::Stop,
            other => return Err(bad("on_error", other)),
        },
        max_retry: u32::try_from(row.try_get::<i64, _>("max_retry")?.max(0)).unwrap_or(u32::MAX),
        rate_limit: RateLimit {
            requests_per_minute: row
                .try_get::<Option<i64>, _>("requests_per_minute")?
                .map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX)),
            tokens_per_minute: row
                .try_get::<Option<i64>, _>("tokens_per_minute")?
                .map(|n| n.max(0) as u64),
        },
        state: match state.as_str() {
            "open" => BatchState::Open,
            "stopped" => BatchState::Stopped,
            other => return Err(bad("state", other)),
        },
        stop_reason: row.try_get("stop_reason")?,
        created_at: row.try_get("created_at")?,
        id,
    })
}

/// A task row of `BATCH_TASK_COLUMNS`, journal figures zero (filled in by the caller). An
/// unreadable status leaves `status` empty and says why in `failure`.
pub(crate) fn batch_task_from_row<R: Row>(row: &R, now: i64) -> Result<BatchTask>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: String = row.try_get("id")?;
    let status_text: String = row.try_get("status")?;
    let status = TaskStatus::parse(&status_text);
    let mut failure: Option<String> = row.try_get("failure")?;
    if status.is_none() {
        failure = Some(format!("unknown status `{status_text}`"));
    }
    let queue = match row.try_get::<Option<String>, _>("queue")?.as_deref() {
        Some("queued") => Some(QueueState::Queued),
        Some("done") => Some(QueueState::Done),
        _ => None,
    };
    let lease: Option<String> = row.try_get("lease_token")?;
    let expires: Option<i64> = row.try_get("lease_expires_at")?;
    Ok(BatchTask {
        status,
        queue,
        tries: u32::try_from(row.try_get::<i64, _>("tries")?.max(0)).unwrap_or(u32::MAX),
        labels: decode_opt::<Value>(&format!("labels of task {id}"), row.try_get("labels")?)?
            .unwrap_or(Value::Null),
        version: row.try_get::<i64, _>("version")?.max(0) as u64,
        outcome: decode_opt(&format!("outcome of task {id}"), row.try_get("outcome")?)?,
        failure,
        accepted: 0,
        rejected: 0,
        tool_call_rejections: 0,
        tool_errors: 0,
        outcome_unknown: 0,
        prompt_tokens: 0,
        input_tokens: 0,
        output_tokens: 0,
        created_at: row.try_get("created_at")?,
        started_at: None,
        updated_at: row.try_get("updated_at")?,
        leased: lease.is_some() && expires.is_some_and(|at| at > now),
        id,
    })
}

/// Journal figures of one task, summed by the backend's grouped query.
pub(crate) fn add_journal_figures<R: Row>(task: &mut BatchTask, row: &R) -> Result<()>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let count = |column: &str| -> Result<u64> {
        Ok(row.try_get::<Option<i64>, _>(column)?.unwrap_or(0).max(0) as u64)
    };
    task.accepted = count("accepted")?;
    task.rejected = count("rejected")?;
    task.tool_call_rejections = count("tool_call_rejections")?;
    task.prompt_tokens = count("prompt_tokens")?;
    task.input_tokens = count("input_tokens")?;
    task.output_tokens = count("output_tokens")?;
    task.started_at = row.try_get("started_at")?;
    Ok(())
}

/// The condition (on batch `b`) that it has tasks and every one belongs to the tenant bound
/// at `tenant`; both subqueries use the tasks' `batch_id` index.
pub(crate) fn visible_to(tenant: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM tasks t WHERE t.batch_id = b.id AND t.tenant = {tenant}) \
         AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.batch_id = b.id \
             AND (t.tenant IS NULL OR t.tenant <> {tenant}))"
    )
}

/// One task's row of `task_totals`: `task_id`, `answers`, `prompt_tokens`,
/// `counted_output_tokens`, `reported`, `input_tokens`, `output_tokens`.
pub(crate) fn totals_from_row<R: Row>(row: &R) -> Result<(String, crate::TaskTotals)>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let count = |column: &str| -> Result<u64> {
        Ok(row.try_get::<Option<i64>, _>(column)?.unwrap_or(0).max(0) as u64)
    };
    Ok((
        row.try_get("task_id")?,
        crate::TaskTotals {
            answers: count("answers")?,
            prompt_tokens: count("prompt_tokens")?,
            output_tokens: count("counted_output_tokens")?,
            reported_answers: count("reported")?,
            input_tokens_reported: count("input_tokens")?,
            output_tokens_reported: count("output_tokens")?,
        },
    ))
}

/// One entry of a rate window: when, and how many requests and tokens it counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateEntry {
    pub at: i64,
    pub requests: u64,
    pub tokens: u64,
}

/// Whether a request of `tokens` fits `limit` at `now`, given the window's entries of the last
/// `RATE_WINDOW_MS` in time order; if not, how long until enough of them leave the window. A
/// request larger than the whole token quota is let through once the window holds no tokens,
/// so it waits its turn instead of forever.
pub(crate) fn rate_decision(
    limit: &RateLimit,
    now: i64,
    window: &[RateEntry],
    tokens: u64,
) -> RateDecision {
    // How long until the oldest entries that together free `need` units have left the window.
    let wait_for = |need: u64, units: &dyn Fn(&RateEntry) -> u64| -> i64 {
        let mut freed = 0;
        for entry in window {
            freed += units(entry);
            if freed >= need {
                return entry.at + RATE_WINDOW_MS - now;
            }
        }
        RATE_WINDOW_MS
    };
    let mut wait = 0i64;
    if let Some(rpm) = limit.requests_per_minute {
        let used: u64 = window.iter().map(|e| e.requests).sum();
        if used + 1 > u64::from(rpm) {
            wait = wait.max(wait_for(used + 1 - u64::from(rpm), &|e| e.requests));
        }
    }
    if let Some(tpm) = limit.tokens_per_minute {
        let used: u64 = window.iter().map(|e| e.tokens).sum();
        if used > 0 && used + tokens > tpm {
            let need = (used + tokens - tpm).min(used);
            wait = wait.max(wait_for(need, &|e| e.tokens));
        }
    }
    if wait > 0 {
        RateDecision::Wait {
            ms: u64::try_from(wait.min(RATE_WINDOW_MS)).unwrap_or(1).max(1),
        }
    } else {
        RateDecision::Granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: i64, requests: u64, tokens: u64) -> RateEntry {
        RateEntry {
            at,
            requests,
            tokens,
        }
    }

    #[test]
    fn requests_wait_for_the_oldest_to_leave_the_window() {
        let limit = RateLimit {
            requests_per_minute: Some(2),
            tokens_per_minute: None,
        };
        let now = 100_000;
        assert_eq!(rate_decision(&limit, now, &[], 5), RateDecision::Granted);
        let one = [entry(50_000, 1, 5)];
        assert_eq!(rate_decision(&limit, now, &one, 5), RateDecision::Granted);
        let two = [entry(50_000, 1, 5), entry(90_000, 1, 5)];
        assert_eq!(
            rate_decision(&limit, now, &two, 5),
            RateDecision::Wait { ms: 10_000 }
        );
    }

    #[test]
    fn tokens_wait_until_enough_have_left_and_a_huge_request_waits_for_an_empty_window() {
        let limit = RateLimit {
            requests_per_minute: None,
            tokens_per_minute: Some(100),
        };
        let now = 100_000;
        let window = [
            entry(41_000, 1, 30),
            entry(50_000, 0, 30),
            entry(70_000, 1, 30),
        ];
        assert_eq!(
            rate_decision(&limit, now, &window, 10),
            RateDecision::Granted
        );
        // 90 used + 40 wanted: 30 must leave, the first entry does at 101_000.
        assert_eq!(
            rate_decision(&limit, now, &window, 40),
            RateDecision::Wait { ms: 1_000 }
        );
        // 500 wanted can never fit: it waits until the window is empty, then goes alone.
        assert_eq!(
            rate_decision(&limit, now, &window, 500),
            RateDecision::Wait { ms: 30_000 }
        );
        assert_eq!(rate_decision(&limit, now, &[], 500), RateDecision::Granted);
    }
}
