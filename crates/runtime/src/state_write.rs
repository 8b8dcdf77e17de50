//! State written by someone other than the model: an API client, an operator.
//!
//! Such a write is a step like any other: it names the version it replaces (`If-Match`), goes
//! through the same checks as a model's `state_patch` (patch shape, read-only locations,
//! schema, state budget), and is journaled as an accepted step with its author, so time
//! travel, replay and hash checks cover it. It never interleaves with a runner: the writer
//! takes the task's execution lease for the write, so a task that a live runner is driving
//! (mid-step, between steps, waiting on its model) is refused with `Busy` instead of racing
//! it; so is a task whose last action is still in flight or waiting for a human (`Pending`).
//! The observation the task's next step would have started from carries over to the step
//! after the write, with a note that the state was changed.

use std::sync::Arc;

use serde_json::Value;
use skillstate_core::{Rejection, validate_patch};
use skillstate_store::{JournalEntry, StepCommit, Store, StoreError, TaskRecord, Verdict};

use crate::frame::TaskFrame;
use crate::lease::{HeldLease, LeasePolicy};
use crate::step_loop::now_millis;

/// Added to the observation the task's next step starts from.
const CHANGED_NOTE: &str =
    "(The state was changed outside this task since the last step; the state shown is current.)";

/// How state writers name themselves as lease holders.
const WRITER_LABEL: &str = "state write by";
/// How long a state write waits for another state write of the same task.
const WRITER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One state write.
#[derive(Debug, Clone)]
pub struct StateWrite<'a> {
    /// Full task id.
    pub task: &'a str,
    /// The version the writer read; the write applies only on top of it.
    pub if_match: u64,
    /// An RFC 7396 merge patch (object) or RFC 6902 operations (array).
    pub patch: &'a Value,
    /// Who writes, recorded in the journal (an API key id).
    pub author: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum StateWriteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The task is at another version than `If-Match` named.
    #[error(
        "task {task} is at version {current}, not {expected}: read the state again and reapply the change"
    )]
    Stale {
        task: String,
        expected: u64,
        current: u64,
    },
    /// The patch fails validation; each rejection has its kind and JSON pointer.
    #[error("the patch was rejected: {}", .rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Rejected { rejections: Vec<Rejection> },
    /// A runner holds the task's lease.
    #[error(
        "task {task} is being run by {holder}; its state changes with every step: send a message instead, or write once it stops"
    )]
    Busy { task: String, holder: String },
    /// An action of the task is in flight or waits for a human.
    #[error(
        "task {task} has an action at step {step} that is {what}; settle it first (approve, reject or reply)"
    )]
    Pending {
        task: String,
        step: u64,
        what: &'static str,
    },
    /// The task's stored skill cannot be rebuilt.
    #[error("task {task}: {message}")]
    StoredTask { task: String, message: String },
}

/// Applies `write` and returns the task as it is after it.
pub async fn write_state(
    store: &Arc<dyn Store>,
    write: &StateWrite<'_>,
) -> Result<TaskRecord, StateWriteError> {
    let policy = LeasePolicy {
        label: format!("{WRITER_LABEL} {}", write.author),
        ..LeasePolicy::default()
    };
    // Another state write holds the lease only for the moment of its write: wait for it (then
    // the version check decides), but never for a runner.
    let deadline = tokio::time::Instant::now() + WRITER_WAIT;
    let lease = loop {
        match HeldLease::acquire(store.clone(), write.task, &policy).await {
            Ok(lease) => break lease,
            Err(crate::RuntimeError::Store(StoreError::Leased { lease, .. }))
                if lease.holder.starts_with(&format!("`{WRITER_LABEL} "))
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Err(crate::RuntimeError::Store(StoreError::Leased { lease, .. })) => {
                return Err(StateWriteError::Busy {
                    task: write.task.to_owned(),
                    holder: lease.holder,
                });
            }
            Err(crate::RuntimeError::Store(error)) => return Err(error.into()),
            Err(other) => {
                return Err(StateWriteError::StoredTask {
                    task: write.task.to_owned(),
                    message: other.to_string(),
                });
            }
        }
    };
    let result = write_held(store.as_ref(), write).await;
    lease.release().await;
    result
}

async fn write_held(
    store: &dyn Store,
    write: &StateWrite<'_>,
) -> Result<TaskRecord, StateWriteError> {
    let task = store.task(write.task).await?;
    if task.version != write.if_match {
        return Err(StateWriteError::Stale {
            task: task.id,
            expected: write.if_match,
            current: task.version,
        });
    }
    if let Some(intent) = store
        .intents(&task.id)
        .await?
        .into_iter()
        .find(|i| i.step == task.version && !i.done)
    {
        let what = match task.status {
            skillstate_store::TaskStatus::AwaitingApproval => "waiting for approval",
            skillstate_store::TaskStatus::AwaitingInput => "waiting for a reply",
            _ => "in flight",
        };
        return Err(StateWriteError::Pending {
            task: task.id,
            step: intent.step,
            what,
        });
    }
    let frame = TaskFrame::new(&task).map_err(|e| StateWriteError::StoredTask {
        task: task.id.clone(),
        message: e.to_string(),
    })?;
    let budget = frame.skill.settings().budgets.state_tokens;
    let accepted = validate_patch(&frame.skill.schema, budget, &task.state, write.patch)
        .map_err(|rejections| StateWriteError::Rejected { rejections })?;
    let step = task.version + 1;
    // The observation the next model step would have read, plus a note; it opens the step
    // after this one.
    let carried = store.observation(&task.id, step).await?.unwrap_or_default();
    let next_observation = if carried.ends_with(CHANGED_NOTE) {
        carried
    } else {
        format!("{carried}\n\n{CHANGED_NOTE}")
    };
    let commit = StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: write.patch.to_string(),
            patch: Some(accepted.patch.to_value()),
            action: None,
            errors: None,
            state_hash: Some(accepted.state_hash.clone()),
            prompt_tokens: 0,
            output_tokens: None,
            prompt_hash: String::new(),
            usage: None,
            latency_ms: 0,
            created_at: now_millis(),
            author: Some(write.author.to_owned()),
        },
        new_state: accepted.new_state,
        intent: None,
        status: None,
        previous_result: None,
        next_observation: Some(next_observation),
    };
    match store.commit_step(&task.id, task.version, &commit).await {
        Ok(()) => {}
        Err(StoreError::Conflict { actual, .. }) => {
            return Err(StateWriteError::Stale {
                task: task.id,
                expected: write.if_match,
                current: actual,
            });
        }
        Err(other) => return Err(other.into()),
    }
    Ok(store.task(&task.id).await?)
}
