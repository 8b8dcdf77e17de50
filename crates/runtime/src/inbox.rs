//! Delivering a task's inbox (the store's `Inbox`): what people sent the task from outside the
//! runner — messages, and decisions on a pause (approve, reject, reply) — becomes part of the
//! task at a step boundary, each entry marked delivered in the same transaction as what it
//! became. A user's message comes first (`voice.rs`): it opens the observation it joins.
//!
//! - A message to a running task opens the observation of its next step, before the last
//!   action's result (and that observation is stored as shown, so "prompt at step N" stays
//!   exact).
//! - A task waiting for approval runs the action on `approve` and records the refusal on
//!   `reject`; a message instead of a decision refuses the action and shows the message (the
//!   person wrote rather than approved), and so does a message that waits with an approval:
//!   the message may change what was approved, so the action does not run and the agent asks
//!   again (`pauses.rs::settle_pause`).
//! - A task waiting for a reply takes a `reply`, or a message, as the answer.
//! - A completed or failed task is reopened by a message: the message opens its next step.
//! - A decision that no longer matches the task (it was decided otherwise meanwhile) and
//!   anything sent to a cancelled task (failed for `canceled`) are marked delivered without effect, so a task's queue
//!   claim never loops on entries nobody can use.

use std::sync::Arc;

use skillstate_store::{MessageKind, MessageRecord, TaskRecord, TaskStatus};
use skillstate_tools::Tool;

use crate::RuntimeError;
use crate::pauses::PauseDecision;
use crate::step_loop::Runner;
use crate::voice::messages_first;

/// Whether the task was cancelled (a failure whose reason is `canceled`): nothing reopens it.
pub fn is_canceled(task: &TaskRecord) -> bool {
    task.status == TaskStatus::Failed
        && task
            .outcome
            .as_ref()
            .and_then(|o| o.get("reason"))
            .and_then(serde_json::Value::as_str)
            == Some("canceled")
}

impl Runner<'_> {
    /// Before a run drives `task`: applies what waits in its inbox to a paused, finished or
    /// cancelled task. Returns `true` when the task changed (read it again).
    pub(crate) async fn open_inbox(
        &mut self,
        task: &TaskRecord,
        env_tools: &[Arc<dyn Tool>],
    ) -> Result<bool, RuntimeError> {
        let waiting = self.store.pending_messages(&task.id).await?;
        if waiting.is_empty() {
            // Nothing to read again before the first step (`deliver_waiting`).
            self.inbox_empty_at = Some((task.id.clone(), task.version));
            return Ok(false);
        }
        let step = task.version + 1;
        let messages: Vec<&MessageRecord> = waiting
            .iter()
            .filter(|m| m.kind == MessageKind::Message)
            .collect();
        let decision = |kinds: &[MessageKind]| waiting.iter().find(|m| kinds.contains(&m.kind));
        match task.status {
            TaskStatus::Running => {
                // Messages join the next step's observation (`deliver_waiting`); decisions
                // about a pause that is over are stale.
                self.discard(task, |m| m.kind.is_decision(), &waiting)
                    .await?;
                Ok(false)
            }
            TaskStatus::AwaitingApproval => {
                let Some(intent) = self.pending_intent(task).await? else {
                    return Ok(false);
                };
                self.discard(task, |m| m.kind == MessageKind::Reply, &waiting)
                    .await?;
                let (decision, entry) = match decision(&[MessageKind::Approve, MessageKind::Reject])
                {
                    Some(e) if e.kind == MessageKind::Approve => {
                        (PauseDecision::Approve, Some(e.id))
                    }
                    Some(e) => (PauseDecision::Reject(&e.text), Some(e.id)),
                    None if !messages.is_empty() => (PauseDecision::Wrote, None),
                    None => return Ok(true),
                };
                self.settle_pause(task, &intent, decision, entry, env_tools)
                    .await?;
                Ok(true)
            }
            TaskStatus::AwaitingInput => {
                let Some(intent) = self.pending_intent(task).await? else {
                    return Ok(false);
                };
                self.discard(
                    task,
                    |m| matches!(m.kind, MessageKind::Approve | MessageKind::Reject),
                    &waiting,
                )
                .await?;
                let (decision, entry) = match decision(&[MessageKind::Reply]) {
                    Some(reply) => (PauseDecision::Reply(&reply.text), Some(reply.id)),
                    None if !messages.is_empty() => (PauseDecision::Wrote, None),
                    None => return Ok(true),
                };
                self.settle_pause(task, &intent, decision, entry, env_tools)
                    .await?;
                Ok(true)
            }
            TaskStatus::Failed if is_canceled(task) => {
                self.discard(task, |_| true, &waiting).await?;
                Ok(true)
            }
            TaskStatus::Completed | TaskStatus::Failed => {
                self.discard(task, |m| m.kind.is_decision(), &waiting)
                    .await?;
                if messages.is_empty() {
                    return Ok(true);
                }
                let before = self
                    .store
                    .observation(&task.id, step)
                    .await?
                    .unwrap_or_default();
                let observation = messages_first(&messages, &before);
                let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
                self.store
                    .deliver_messages(&task.id, step, Some(&observation), &ids)
                    .await?;
                Ok(true)
            }
        }
    }

    /// At the boundary before step `step` of a running task: messages that arrived open the
    /// step's observation (before what was there), which is stored as the prompt will show it. Returns the new
    /// observation, or `None` when nothing arrived.
    pub(crate) async fn deliver_waiting(
        &mut self,
        task: &str,
        step: u64,
        observation: Option<String>,
    ) -> Result<Option<String>, RuntimeError> {
        // The previous step's commit in this run found the inbox empty: nothing to read (a
        // message that arrived since is shown one step later, as one arriving during the model
        // call would be).
        if let Some((of, version)) = self.inbox_empty_at.take()
            && of == task
            && version + 1 == step
        {
            return Ok(None);
        }
        let waiting = self.store.pending_messages(task).await?;
        if waiting.is_empty() {
            return Ok(None);
        }
        let messages: Vec<&MessageRecord> = waiting
            .iter()
            .filter(|m| m.kind == MessageKind::Message)
            .collect();
        let stale: Vec<i64> = waiting
            .iter()
            .filter(|m| m.kind.is_decision())
            .map(|m| m.id)
            .collect();
        if messages.is_empty() {
            self.store
                .deliver_messages(task, step, None, &stale)
                .await?;
            return Ok(None);
        }
        // The observation must be stored before it is extended (a held-back result carries it).
        self.write_held_result().await?;
        let before = match observation {
            Some(text) => text,
            None => self
                .store
                .observation(task, step)
                .await?
                .unwrap_or_default(),
        };
        let text = messages_first(&messages, &before);
        let mut ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
        ids.extend(stale);
        self.check_lease()?;
        self.store
            .deliver_messages(task, step, Some(&text), &ids)
            .await?;
        Ok(Some(text))
    }

    /// Marks the waiting entries `which` selects delivered, with no effect.
    async fn discard(
        &self,
        task: &TaskRecord,
        which: impl Fn(&MessageRecord) -> bool,
        waiting: &[MessageRecord],
    ) -> Result<(), RuntimeError> {
        let ids: Vec<i64> = waiting.iter().filter(|m| which(m)).map(|m| m.id).collect();
        if ids.is_empty() {
            return Ok(());
        }
        tracing::info!(
            task = %task.id,
            status = task.status.as_str(),
            entries = ?ids,
            "inbox entries that no longer apply to the task were set aside"
        );
        self.store
            .deliver_messages(&task.id, task.version + 1, None, &ids)
            .await?;
        Ok(())
    }

    /// The action the paused task waits on.
    pub(crate) async fn pending_intent(
        &self,
        task: &TaskRecord,
    ) -> Result<Option<skillstate_store::IntentRecord>, RuntimeError> {
        Ok(self
            .store
            .intent(&task.id, task.version)
            .await?
            .filter(|i| !i.done))
    }
}
