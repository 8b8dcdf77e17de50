//! Human pauses: an action waiting for approval, a question waiting for an answer, an action
//! of unknown outcome waiting for a report. The decision is recorded as the paused action's
//! result in the one transaction that also writes the next observation, then the task runs on.

use skillstate_store::{IntentRecord, TaskRecord, TaskStatus};
use skillstate_tools::{ToolOutput, failpoint};

use crate::step_loop::Runner;
use crate::{RunOutcome, RuntimeError};

impl Runner<'_> {
    /// Runs the action waiting for approval, exactly once, and continues the task.
    pub(crate) async fn approve_held(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        let (task, intent) = self.waiting(task_id, TaskStatus::AwaitingApproval).await?;
        if let Some(checkpoint) = &task.env_checkpoint {
            self.env.restore(checkpoint)?;
        }
        // Running first: if this process dies inside the tool, a restart treats the action as
        // any interrupted one (never re-run blindly) instead of asking for approval again.
        self.store
            .set_status(&task.id, TaskStatus::Running, None)
            .await?;
        let env_tools = self.env.tools();
        self.check_lease()?;
        let output = self
            .execute(
                &task.id,
                intent.step,
                &intent.tool,
                &intent.args,
                &env_tools,
            )
            .await;
        failpoint("after_tool");
        self.record_result(&task.id, intent.step, output).await?;
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
        if let Some(checkpoint) = &task.env_checkpoint {
            self.env.restore(checkpoint)?;
        }
        let text = format!(
            "A human rejected `{}` with args {}: {reason}",
            intent.tool, intent.args
        );
        self.record_result(&task.id, intent.step, ToolOutput::failure(text))
            .await?;
        self.store
            .set_status(&task.id, TaskStatus::Running, None)
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
            .intents(&task.id)
            .await?
            .into_iter()
            .find(|i| i.step == task.version && !i.done);
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
        if let Some(checkpoint) = &task.env_checkpoint {
            self.env.restore(checkpoint)?;
        }
        let text = if intent.tool == skillstate_core::tool::ASK_USER {
            format!("The user answered: {answer}")
        } else {
            format!(
                "A human reported on `{}` (step {}): {answer}",
                intent.tool, intent.step
            )
        };
        self.record_result(&task.id, intent.step, ToolOutput::success(text))
            .await?;
        self.store
            .set_status(&task.id, TaskStatus::Running, None)
            .await?;
        self.run_held(&task.id).await
    }
}
