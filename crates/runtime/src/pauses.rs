//! Human pauses: an action waiting for approval, a question waiting for an answer, an action
//! of unknown outcome waiting for a report. The decision is recorded as the paused action's
//! result in the one transaction that also writes the next observation, then the task runs on.
//! Every decision, from the inbox or given directly, is settled by [`Runner::settle_pause`],
//! where a user's message that waits with it comes first.

use std::sync::Arc;

use skillstate_store::{
    IntentRecord, LeasedWrite, MessageKind, MessageRecord, TaskRecord, TaskStatus,
};
use skillstate_tools::{Tool, ToolOutput, failpoint};

use crate::step_loop::Runner;
use crate::voice::ANSWERED;
use crate::world::WorldChange;
use crate::{RunOutcome, RuntimeError};

impl Runner<'_> {
    /// Runs the action waiting for approval, exactly once, and continues the task — unless a
    /// user's message waits in the inbox: it comes first, and the action does not run.
    pub(crate) async fn approve_held(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        let (task, intent) = self.waiting(task_id, TaskStatus::AwaitingApproval).await?;
        self.restore_world(&task).await?;
        let env_tools = crate::recall::with_recall(self.env.tools(), &self.store, &task);
        self.settle_pause(&task, &intent, PauseDecision::Approve, None, &env_tools)
            .await?;
        self.run_held(&task.id).await
    }

    /// Refuses the action waiting for approval; the refusal and its reason become the next
    /// observation, and the task continues.
    pub(crate) async fn reject_held(
        &mut self,
        task_id: &str,
        reason: &str,
    ) -> Result<RunOutcome, RuntimeError> {
        let (task, intent) = self.waiting(task_id, TaskStatus::AwaitingApproval).await?;
        self.restore_world(&task).await?;
        self.settle_pause(&task, &intent, PauseDecision::Reject(reason), None, &[])
            .await?;
        self.run_held(&task.id).await
    }

    /// The task and its pending intent, if the task is in `status`.
    async fn waiting(
        &self,
        task_id: &str,
        status: TaskStatus,
    ) -> Result<(TaskRecord, IntentRecord), RuntimeError> {
        let task = self.store.task(task_id).await?;
        let pending = self
            .store
            .intent(&task.id, task.version)
            .await?
            .filter(|i| !i.done);
        match pending {
            Some(intent) if task.status == status => Ok((task, intent)),
            _ => Err(RuntimeError::StoredTask {
                task: task.id.clone(),
                message: format!("it is {}, not {}", task.status.as_str(), status.as_str()),
            }),
        }
    }

    /// Answers a paused task — an `ask_user` question or an action whose outcome is unknown —
    /// and runs it on: the answer becomes the paused action's result and opens the next step.
    pub(crate) async fn reply_held(
        &mut self,
        task_id: &str,
        answer: &str,
    ) -> Result<RunOutcome, RuntimeError> {
        let (task, intent) = self.waiting(task_id, TaskStatus::AwaitingInput).await?;
        self.restore_world(&task).await?;
        self.settle_pause(&task, &intent, PauseDecision::Reply(answer), None, &[])
            .await?;
        self.run_held(&task.id).await
    }

    /// Settles the pause of `task` on `intent` with `decision` — `entry` is the inbox entry it
    /// came as, if it did — and sets the task running. A user's message comes first: every
    /// message waiting in the inbox opens the observation this writes, and an approval that
    /// meets one does not run the action, since the message may change what was approved (the
    /// agent proposes it again if it still stands, and a human approves that). The entries
    /// shown or carried out are marked delivered in the transaction that records the result.
    /// Every decision on a pause goes through here, from the inbox or from `approve`,
    /// `reject` and `reply` directly, so none can pass a waiting message by.
    pub(crate) async fn settle_pause(
        &mut self,
        task: &TaskRecord,
        intent: &IntentRecord,
        decision: PauseDecision<'_>,
        entry: Option<i64>,
        env_tools: &[Arc<dyn Tool>],
    ) -> Result<(), RuntimeError> {
        let waiting = self.store.pending_messages(&task.id).await?;
        let messages: Vec<&MessageRecord> = waiting
            .iter()
            .filter(|m| m.kind == MessageKind::Message)
            .collect();
        let mut delivered: Vec<i64> = entry.into_iter().collect();
        delivered.extend(messages.iter().map(|m| m.id));
        let call = format!("`{}` with args {}", intent.tool, intent.args);
        let (output, shown) = match decision {
            PauseDecision::Approve if messages.is_empty() => {
                // Running first: dying inside the tool leaves an ordinary interrupted action,
                // never a second approval.
                self.writer()
                    .write(
                        &task.id,
                        LeasedWrite::Status {
                            status: TaskStatus::Running,
                            outcome: None,
                        },
                    )
                    .await?;
                self.check_lease()?;
                let output = self
                    .execute(&task.id, intent.step, &intent.tool, &intent.args, env_tools)
                    .await;
                failpoint("after_tool");
                return self
                    .record_delivering(
                        &task.id,
                        intent.step,
                        output,
                        WorldChange::Ran,
                        delivered,
                        &[],
                    )
                    .await;
            }
            PauseDecision::Approve => (
                ToolOutput::failure(format!(
                    "{call} was not run: a message from the user came with the approval, and a message comes first. Propose it again if it still stands; it runs only when approved again."
                )),
                messages,
            ),
            PauseDecision::Reject(reason) => (
                ToolOutput::failure(format!("A human rejected {call}: {reason}")),
                messages,
            ),
            PauseDecision::Wrote if task.status == TaskStatus::AwaitingApproval => (
                ToolOutput::failure(format!(
                    "{call} was not run: a human wrote instead of approving it."
                )),
                messages,
            ),
            PauseDecision::Reply(answer) => {
                (ToolOutput::success(answer_text(intent, answer)), messages)
            }
            // Waiting for a reply, the messages are the answer.
            PauseDecision::Wrote => {
                let answer = messages
                    .iter()
                    .map(|m| m.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                (
                    ToolOutput::success(answer_text(intent, &answer)),
                    Vec::new(),
                )
            }
        };
        self.record_delivering(
            &task.id,
            intent.step,
            output,
            WorldChange::NotRun,
            delivered,
            &shown,
        )
        .await?;
        self.writer()
            .write(
                &task.id,
                LeasedWrite::Status {
                    status: TaskStatus::Running,
                    outcome: None,
                },
            )
            .await?;
        Ok(())
    }
}

/// How a human decided a pause.
pub(crate) enum PauseDecision<'a> {
    /// Run the action waiting for approval.
    Approve,
    /// Refuse it, for this reason.
    Reject(&'a str),
    /// The answer to the question (or the report on the action of unknown outcome).
    Reply(&'a str),
    /// No decision: only messages wait (the human wrote instead of deciding).
    Wrote,
}

/// The observation an answer to `intent` makes.
fn answer_text(intent: &IntentRecord, answer: &str) -> String {
    if intent.tool == skillstate_core::tool::ASK_USER {
        format!("{ANSWERED}{answer}")
    } else {
        format!(
            "A human reported on `{}` (step {}): {answer}",
            intent.tool, intent.step
        )
    }
}
