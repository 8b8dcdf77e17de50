//! Writes a runner makes under its execution lease. The lease is checked first, in the same
//! transaction as the write (`Leases::write_under_lease`): a runner that lost its lease (it was
//! frozen past its time to live and another runner took the task over) is told so, naming the
//! new holder, before anything else about the write (a version, a pending intent) is looked at,
//! and nothing of the write is kept.

use serde_json::Value;

use crate::StoreError;
use crate::boards::BoardWrite;
use crate::model::{ActionResult, JournalEntry, StepCommit, TaskStatus};

/// One write of a runner that holds a task's lease.
#[derive(Debug, Clone, Copy)]
pub enum LeasedWrite<'a> {
    /// `Journal::commit_step`.
    Step {
        expected_version: u64,
        commit: &'a StepCommit,
    },
    /// `Journal::record_rejection`.
    Rejection(&'a JournalEntry),
    /// `Journal::record_action_result`.
    ActionResult(&'a ActionResult),
    /// `Journal::set_status`.
    Status {
        status: TaskStatus,
        outcome: Option<&'a Value>,
    },
    /// `Boards::commit_step_with_board`.
    StepWithBoard {
        expected_task_version: u64,
        commit: &'a StepCommit,
        board: &'a str,
        expected_board_version: u64,
        write: &'a BoardWrite,
    },
}

/// The error for a lease `token` no longer holds, from the task's lease columns as they are
/// now: who holds it (`None`: nobody, it expired and was given up) and since when.
pub(crate) fn lease_lost(task: &str, holder: Option<String>, since: Option<i64>) -> StoreError {
    match holder {
        Some(holder) if !holder.is_empty() => StoreError::LeaseLost {
            task: task.to_owned(),
            holder,
            at: since.unwrap_or_else(crate::now_millis),
        },
        _ => StoreError::LeaseLost {
            task: task.to_owned(),
            holder: "nobody (the lease expired and was given up)".to_owned(),
            at: crate::now_millis(),
        },
    }
}
