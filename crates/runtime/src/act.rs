//! Acting on an accepted answer: its step committed (with its board part, when the task is on a
//! board), then its action run and the action's result recorded, or held back for the next
//! commit when running the tool again would be harmless.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_core::outside::Outside;
use skillstate_core::{AcceptedStep, Action, Rejection};
use skillstate_store::{
    ActionResult, JournalEntry, LeasedWrite, MessageRecord, NewIntent, StepCommit, TaskStatus,
    Verdict,
};
use skillstate_tools::{CallContext, Tool, ToolOutput, call_bounded, failpoint, find_tool};

use crate::RuntimeError;
use crate::board::{BoardCommitted, BoardFrame, BoardSeen};
use crate::step::StepEnd;
use crate::step_loop::Runner;
use crate::voice::{messages_first, not_the_user};
use crate::world::WorldChange;
use tracing::Instrument;

impl Runner<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn commit_and_act(
        &mut self,
        task: &str,
        step: u64,
        mut entry: JournalEntry,
        accepted: AcceptedStep,
        (state, version): (&mut Value, &mut u64),
        board: Option<(&BoardFrame, &BoardSeen)>,
        env_tools: &[Arc<dyn Tool>],
        needs_approval: bool,
    ) -> Result<Acted, RuntimeError> {
        entry.verdict = Verdict::Accepted;
        entry.patch = Some(accepted.patch.to_value());
        entry.action = Some(accepted.action.to_call_json());
        entry.state_hash = Some(accepted.state_hash.clone());
        let (intent, status) = match &accepted.action {
            Action::Tool { name, args } => {
                let side_effect = find_tool(env_tools, name)
                    .map(|t| t.spec().side_effect.as_str())
                    .unwrap_or("effectful");
                let pause = needs_approval.then(|| {
                    (
                        TaskStatus::AwaitingApproval,
                        Some(
                            json!({"reason": "approval", "tool": name, "args": args, "step": step}),
                        ),
                    )
                });
                (
                    Some(NewIntent {
                        tool: name.clone(),
                        args: args.clone(),
                        idempotency_key: CallContext::new(task, step).idempotency_key,
                        side_effect: side_effect.to_owned(),
                    }),
                    pause,
                )
            }
            Action::Finish { result } => (
                None,
                Some((
                    TaskStatus::Completed,
                    Some(json!({"reason": "finish", "result": result})),
                )),
            ),
            // The question is an intent too: `reply` records the answer as its result, so a
            // pause survives restarts like any other action in flight.
            Action::AskUser { question } => (
                Some(NewIntent {
                    tool: skillstate_core::tool::ASK_USER.to_owned(),
                    args: json!({"question": question}),
                    idempotency_key: CallContext::new(task, step).idempotency_key,
                    side_effect: "read_only".to_owned(),
                }),
                Some((
                    TaskStatus::AwaitingInput,
                    Some(json!({"reason": "ask_user", "question": question})),
                )),
            ),
        };
        let previous_result = self
            .held_result
            .take()
            .filter(|(of, _)| of == task)
            .map(|(_, result)| result);
        // A stopped or paused task's stored world is its last one.
        let world = match status {
            Some(_) => self.checkpoint_at_stop(*version),
            None => None,
        };
        let commit = StepCommit {
            entry,
            new_state: accepted.new_state.clone(),
            intent,
            status: status.clone(),
            previous_result,
            next_observation: None,
            world,
            upgrade: None,
        };
        self.check_lease()?;
        match (board, &accepted.board) {
            (Some((board, seen)), Some(change)) => {
                let committed = board
                    .commit(
                        &self.writer(),
                        task,
                        *version,
                        &commit,
                        seen,
                        change,
                        &self.secrets,
                    )
                    .await?;
                if let BoardCommitted::Refused(rejections) = committed {
                    // Nothing was written: a result held back for this commit waits for the
                    // next one.
                    if let Some(result) = commit.previous_result {
                        self.held_result = Some((task.to_owned(), result));
                    }
                    return Ok(Acted::Refused(rejections));
                }
            }
            _ => {
                let written = self
                    .writer()
                    .write(
                        task,
                        LeasedWrite::Step {
                            expected_version: *version,
                            commit: &commit,
                        },
                    )
                    .await?;
                self.inbox_empty_at =
                    (written.messages_waiting == Some(false)).then(|| (task.to_owned(), step));
            }
        }
        crate::metrics::step_committed();
        failpoint("after_commit");
        *state = accepted.new_state;
        *version = step;
        if let Some((status, _)) = &status {
            self.run_span
                .record("skillstate.task.status", status.as_str());
        }
        if status.is_some() {
            return Ok(Acted::Done(StepEnd::Stop, None));
        }
        let mut result = None;
        if let Action::Tool { name, args } = &accepted.action {
            self.check_lease()?;
            let output = self.execute(task, step, name, args, env_tools).await;
            failpoint("after_tool");
            result = Some(output.text.clone());
            // Running a read-only or idempotent tool again is harmless, so its result may wait
            // for the next commit; anything else is durable before the next model call.
            let repeatable = find_tool(env_tools, name).is_some_and(|t| {
                matches!(t.spec().side_effect.as_str(), "read_only" | "idempotent")
            });
            let action_result = self.action_result(task, step, output, WorldChange::Ran, &[]);
            if repeatable {
                self.held_result = Some((task.to_owned(), action_result));
            } else {
                self.writer()
                    .write(task, LeasedWrite::ActionResult(&action_result))
                    .await?;
            }
        }
        Ok(Acted::Done(StepEnd::Continue, result))
    }

    pub(crate) async fn execute(
        &mut self,
        task: &str,
        step: u64,
        name: &str,
        args: &Value,
        env_tools: &[Arc<dyn Tool>],
    ) -> ToolOutput {
        let span = crate::spans::tool_call(task, step, name);
        let output = self
            .execute_traced(task, step, name, args, env_tools)
            .instrument(span.clone())
            .await;
        if !span.is_disabled() {
            span.record("skillstate.tool.ok", output.ok);
            if !output.ok {
                span.record("error.type", "tool_error");
            }
            match self.content {
                Ok(()) => {
                    span.record(
                        "gen_ai.tool.call.arguments",
                        crate::spans::clip(&args.to_string()),
                    );
                    span.record("gen_ai.tool.call.result", crate::spans::clip(&output.text));
                }
                Err("") => {}
                Err(reason) => {
                    span.record("skillstate.content_withheld", reason);
                }
            }
        }
        output
    }

    async fn execute_traced(
        &mut self,
        task: &str,
        step: u64,
        name: &str,
        args: &Value,
        env_tools: &[Arc<dyn Tool>],
    ) -> ToolOutput {
        let Some(tool) = find_tool(env_tools, name) else {
            crate::metrics::tool_called(name, false);
            return ToolOutput::failure(format!("Error: tool {name} is not available."));
        };
        // Every call is bounded: a tool stuck on a pipe, a device or a hung server becomes an
        // error observation instead of a step that never ends.
        let output = match call_bounded(
            tool.as_ref(),
            args,
            &CallContext::new(task, step).with_secrets(Arc::new(self.secrets.clone())),
            self.tool_limit,
        )
        .await
        {
            Ok(output) => output,
            Err(error) => ToolOutput::failure(format!("Error: {error}")),
        };
        // The tool cut what it read only after redacting it (its `CallContext` holds these
        // secrets); the whole result and its error text are redacted here once more, before
        // anything else reads them.
        let output = ToolOutput {
            text: Outside::new(output.text).redacted(&self.secrets),
            ok: output.ok,
        };
        crate::metrics::tool_called(name, output.ok);
        // A tool's result never speaks with the user's voice.
        match not_the_user(&output.text) {
            Cow::Borrowed(_) => output,
            Cow::Owned(text) => ToolOutput { text, ..output },
        }
    }

    /// Records now the result of an action that ran.
    pub(crate) async fn record_result(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
    ) -> Result<(), RuntimeError> {
        self.record_delivering(task, step, output, WorldChange::Ran, Vec::new(), &[])
            .await
    }

    /// Records that a committed action's outcome is unknown (the runtime stopped before its
    /// result was recorded, and it is not one to repeat): `output` tells the model so, and
    /// the store keeps it apart from tool errors.
    pub(crate) async fn record_unknown_outcome(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
    ) -> Result<(), RuntimeError> {
        let result = ActionResult {
            outcome_unknown: true,
            ..self.action_result(task, step, output, WorldChange::NotRun, &[])
        };
        self.writer()
            .write(task, LeasedWrite::ActionResult(&result))
            .await?;
        Ok(())
    }

    /// [`Self::record_result`], also marking the inbox entries `delivered` (the decision the
    /// result carries out, the messages its observation shows) in the same transaction; the
    /// messages `shown` open the next observation, before the result.
    pub(crate) async fn record_delivering(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
        change: WorldChange,
        delivered: Vec<i64>,
        shown: &[&MessageRecord],
    ) -> Result<(), RuntimeError> {
        let mut result = self.action_result(task, step, output, change, shown);
        result.delivered = delivered;
        self.writer()
            .write(task, LeasedWrite::ActionResult(&result))
            .await?;
        Ok(())
    }

    /// A finished action's result, redacted, with the observation the next step starts from
    /// (which this runner also keeps for that step): the user's messages `shown`, if any, then
    /// the result and the environment's event; with the world's checkpoint when one is due
    /// (`world`).
    fn action_result(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
        change: WorldChange,
        shown: &[&MessageRecord],
    ) -> ActionResult {
        let output = ToolOutput {
            text: Outside::new(output.text).redacted(&self.secrets),
            ok: output.ok,
        };
        self.observer.action_done(step, &output);
        let observed = match self.env.after_action() {
            Some(event) => format!(
                "{}\n{}",
                output.text,
                not_the_user(&Outside::new(event).redacted(&self.secrets))
            ),
            None => output.text.clone(),
        };
        let next_observation = messages_first(shown, &observed);
        self.next_observation = Some((task.to_owned(), step + 1, next_observation.clone()));
        ActionResult {
            step,
            ok: output.ok,
            result: output.text,
            outcome_unknown: false,
            next_observation,
            env_checkpoint: self.checkpoint_with_result(step, change),
            delivered: Vec::new(),
        }
    }
}

/// How an accepted answer ended.
pub(crate) enum Acted {
    /// Committed (and its action run, unless it paused or ended the task).
    Done(StepEnd, Option<String>),
    /// Its board part met others' writes: nothing was committed.
    Refused(Vec<Rejection>),
}

/// Only a board member's commit is refused; anything else is a defect, reported, not a panic.
pub(crate) fn unreachable_refusal<T>(task: &str) -> Result<T, RuntimeError> {
    Err(RuntimeError::StoredTask {
        task: task.to_owned(),
        message: "a commit without a board part was refused as a board conflict".into(),
    })
}
