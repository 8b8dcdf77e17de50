//! Continuing a task after a crash, a kill or a failure: the journal is checked before anything
//! runs on it, an action left in flight is settled without repeating it blindly, and a failure
//! worth retrying can be retried on request.

use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::skill::UnknownOutcome;
use skillstate_core::{Rejection, RejectionKind};
use skillstate_store::{JournalEntry, LeasedWrite, Store, StoreError, TaskRecord, TaskStatus};
use skillstate_tools::{Tool, ToolOutput};

use crate::frame::rejections_of;
use crate::step_loop::Runner;
use crate::{RunOutcome, RuntimeError};

/// Failure reasons that a retry can fix: the model server was unreachable or failing, or every
/// answer of a step was rejected (another try may be accepted).
const RETRYABLE: &[&str] = &["provider", "rejected"];

/// Checks, cheaply, that the journal can carry the task on: accepted steps form one unbroken
/// run up to the task's version (from step 1, or from the snapshot gc left), and the last one
/// recorded the hash of the stored current state. Errors name the first step that is wrong.
pub async fn check_continuity(store: &dyn Store, task: &TaskRecord) -> Result<(), RuntimeError> {
    let corrupt = |step: u64, message: String| StoreError::Corrupt {
        task: task.id.clone(),
        step,
        message,
    };
    let extent = store.journal_extent(&task.id).await?;
    let base = extent.base.unwrap_or(0);
    if let Some(last) = extent.last
        && last > task.version
    {
        return Err(corrupt(
            last,
            format!(
                "the journal has an accepted step {last} beyond the task's version {}",
                task.version
            ),
        )
        .into());
    }
    if task.version <= base {
        return Ok(());
    }
    let expected = task.version - base;
    if extent.accepted != expected || extent.first != Some(base + 1) {
        // Find the first missing step for the message.
        let present: Vec<u64> = store
            .accepted_patches(&task.id, base + 1, task.version)
            .await?
            .into_iter()
            .map(|(step, _, _)| step)
            .collect();
        let missing = (base + 1..=task.version)
            .zip(present.iter().copied().chain(std::iter::repeat(u64::MAX)))
            .find(|(wanted, found)| wanted != found)
            .map(|(wanted, _)| wanted)
            .unwrap_or(task.version);
        return Err(corrupt(
            missing,
            format!(
                "no accepted journal entry for this step (the journal holds {} of the {expected} accepted steps after step {base}); the task cannot continue on a broken journal — fork it from an earlier step with `skillstate fork`",
                extent.accepted
            ),
        )
        .into());
    }
    let current = state_hash(&task.state);
    if extent.last_hash.as_deref() != Some(current.as_str()) {
        return Err(corrupt(
            task.version,
            format!(
                "the stored current state (hash {current}) is not the state this step recorded ({}); check it with `skillstate replay`",
                extent.last_hash.as_deref().unwrap_or("none")
            ),
        )
        .into());
    }
    Ok(())
}

/// The answers a step already had when a run reached it: read from the journal once, when the
/// run starts (a resume in the middle of a step), and kept in memory from then on, so answers
/// rejected before a crash still count against the step's retries and the last one's errors
/// are still shown to the model.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    pub(crate) step: u64,
    /// Answers recorded for the step (all rejected: an accepted one ends the step).
    pub(crate) made: u32,
    /// The errors of the last of them.
    pub(crate) last_errors: Vec<Rejection>,
    /// The attempt numbers of those refused only because others' board writes met them: not
    /// the model's mistakes, so (up to a bound) they do not spend the step's retry budget,
    /// before a crash or after it.
    pub(crate) board_conflicts: Vec<u32>,
}

impl Attempts {
    /// The answers `journal` holds for `step`.
    pub(crate) fn at(journal: &[JournalEntry], step: u64) -> Self {
        let answers: Vec<&JournalEntry> = journal.iter().filter(|e| e.step == step).collect();
        let board_conflicts = answers
            .iter()
            .filter(|e| {
                let errors = rejections_of(e);
                !errors.is_empty()
                    && errors
                        .iter()
                        .all(|r| r.kind == RejectionKind::BoardConflict)
            })
            .map(|e| e.attempt)
            .collect();
        Self {
            step,
            made: u32::try_from(answers.len()).unwrap_or(u32::MAX),
            last_errors: answers.last().map(|e| rejections_of(e)).unwrap_or_default(),
            board_conflicts,
        }
    }

    /// How many of the answers from attempt `first_counted` on were board conflicts.
    pub(crate) fn board_conflicts_from(&self, first_counted: u32) -> u32 {
        let counted = self
            .board_conflicts
            .iter()
            .filter(|attempt| **attempt >= first_counted)
            .count();
        u32::try_from(counted).unwrap_or(u32::MAX)
    }
}

/// The first attempt number whose answers count against the current step's retry budget: 1,
/// or where `retry` restarted the budget.
pub(crate) fn budget_start(outcome: Option<&Value>, step: u64) -> u32 {
    match outcome {
        Some(o)
            if o.get("reason").and_then(Value::as_str) == Some("retrying")
                && o.get("step").and_then(Value::as_u64) == Some(step) =>
        {
            o.get("from_attempt")
                .and_then(Value::as_u64)
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or(1)
        }
        _ => 1,
    }
}

impl Runner<'_> {
    /// After a crash between committing a step and recording its action's result, the intent
    /// is pending. Read-only and idempotent tools run again (same idempotency key); anything
    /// else is never repeated blindly: the model is told what is known — the action was
    /// committed, whether it started and whether it took effect is not.
    /// Returns `true` when the task paused for a human instead.
    pub(crate) async fn settle_pending_intent(
        &mut self,
        task: &str,
        version: u64,
        env_tools: &[Arc<dyn Tool>],
        unknown: UnknownOutcome,
    ) -> Result<bool, RuntimeError> {
        if version == 0 || self.store.observation(task, version + 1).await?.is_some() {
            return Ok(false);
        }
        let Some(intent) = self.store.intent(task, version).await?.filter(|i| !i.done) else {
            return Ok(false);
        };
        let known = format!(
            "`{}` with args {} (step {}) was committed, but the runtime stopped before recording its result: whether it started, and whether it took effect, is unknown",
            intent.tool, intent.args, intent.step
        );
        let output = if intent.side_effect == "read_only" || intent.side_effect == "idempotent" {
            self.execute(task, version, &intent.tool, &intent.args, env_tools)
                .await
        } else if unknown == UnknownOutcome::Ask {
            let question = format!("{known}. What happened?");
            let outcome =
                json!({"reason": "unknown_outcome", "question": question, "step": intent.step});
            self.writer()
                .write(
                    task,
                    LeasedWrite::Status {
                        status: TaskStatus::AwaitingInput,
                        outcome: Some(&outcome),
                    },
                )
                .await?;
            return Ok(true);
        } else {
            let output = ToolOutput::failure(format!(
                "Outcome unknown: {known}. Check before repeating it."
            ));
            self.record_unknown_outcome(task, version, output).await?;
            return Ok(false);
        };
        self.record_result(task, version, output).await?;
        Ok(false)
    }

    /// Continues a task that failed for a reason a retry can fix (the model server was down,
    /// every answer of a step was rejected): the failed step gets a fresh retry budget and the
    /// task carries on from its journal like any resume.
    pub(crate) async fn retry_held(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        let task = self.store.task(task_id).await?;
        if task.status != TaskStatus::Failed {
            return Err(RuntimeError::NotResumable {
                task: task.id,
                message: format!(
                    "it is {}; a retry continues failed tasks only",
                    task.status.as_str()
                ),
            });
        }
        let reason = task
            .outcome
            .as_ref()
            .and_then(|o| o.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        if !RETRYABLE.contains(&reason) {
            return Err(RuntimeError::NotResumable {
                task: task.id,
                message: format!(
                    "it failed for `{reason}`, which a retry cannot change (retryable: {}); fork it from an earlier step with `skillstate fork` instead",
                    RETRYABLE.join(", ")
                ),
            });
        }
        let step = task.version + 1;
        let made = Attempts::at(&self.store.journal(&task.id).await?, step).made;
        let outcome = json!({
            "reason": "retrying",
            "step": step,
            "from_attempt": made + 1,
            "after": task.outcome,
        });
        self.writer()
            .write(
                &task.id,
                LeasedWrite::Status {
                    status: TaskStatus::Running,
                    outcome: Some(&outcome),
                },
            )
            .await?;
        self.run_held(&task.id).await
    }
}

/// Whether a failed task's outcome is one `retry` accepts.
pub fn is_retryable(outcome: Option<&Value>) -> bool {
    outcome
        .and_then(|o| o.get("reason"))
        .and_then(Value::as_str)
        .is_some_and(|reason| RETRYABLE.contains(&reason))
}
