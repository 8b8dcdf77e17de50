//! The runner: drives one task through its steps, committing each accepted step atomically.
//! Here: the `Runner`, its builder methods and entry points (each holding the task's lease),
//! and the drive loop from step to step until the task stops; one step's answers are in
//! `step.rs`, committing an accepted answer and running its action in `act.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use skillstate_core::prompt::Turn;
use skillstate_core::secrets::Redactor;
use skillstate_providers::ModelProvider;
use skillstate_store::{ActionResult, LeasedWrite, Store, TaskRecord, TaskStatus};
use skillstate_tools::{DEFAULT_CALL_LIMIT, Environment, Tool, find_tool};
use tracing::Instrument;

use crate::board::BoardFrame;
use crate::frame::{TaskFrame, turns_from};
use crate::lease::{HeldLease, LeasePolicy, TaskWriter};
use crate::recovery::{Attempts, budget_start, check_continuity};
use crate::step::{StepBudget, StepEnd};
use crate::{RunObserver, RunOutcome, RuntimeError};

/// Drives tasks with one model and one environment. Every entry point (`run`, `retry`,
/// `approve`, `reject`, `reply`) holds the task's execution lease while it works, so only one
/// runner drives a task at a time.
pub struct Runner<'a> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) model: Arc<dyn ModelProvider>,
    pub(crate) env: &'a mut dyn Environment,
    pub(crate) observer: &'a mut dyn RunObserver,
    lease_policy: LeasePolicy,
    lease: Option<HeldLease>,
    /// Secret values (the model's key, the operator's secrets) replaced in every answer,
    /// result and outcome before it is validated, stored or shown.
    pub(crate) secrets: Redactor,
    /// The longest any tool call may take (a tool's own, longer limit wins).
    pub(crate) tool_limit: Duration,
    /// Set by a draining worker: stop at the next step boundary, the task left running.
    stop: Option<Arc<AtomicBool>>,
    /// The observation the last recorded action result opened `(task, step, text)`, as stored.
    pub(crate) next_observation: Option<(String, u64, String)>,
    /// A read-only or idempotent tool's result not written yet: it goes into the next step's
    /// commit, or is written on its own when the run stops first.
    pub(crate) held_result: Option<(String, ActionResult)>,
    /// `(task, version)` at which this run found no message waiting in the task's inbox (its
    /// read when the run began, or the commit of that version: `Written::messages_waiting`), so
    /// the inbox is not read again before the next step (`deliver_waiting`).
    pub(crate) inbox_empty_at: Option<(String, u64)>,
    /// Where the stored checkpoint of the task's world stands (`world`).
    pub(crate) world: crate::world::WorldClock,
    /// The W3C `traceparent` the task's run span continues (the request that queued it).
    trace_parent: Option<String>,
    /// The span of the run in progress (`spans::task`); disabled when telemetry is off.
    pub(crate) run_span: tracing::Span,
    /// Whether tool calls' spans may carry arguments and results (`spans::content_allowed`
    /// for the task being driven; `Err("")` until a drive decides).
    pub(crate) content: Result<(), &'static str>,
}

/// What a runner was asked to do with a stored task.
enum Entry<'s> {
    Run,
    Retry,
    Approve,
    Reject(&'s str),
    Reply(&'s str),
}

impl<'a> Runner<'a> {
    pub fn new(
        store: Arc<dyn Store>,
        model: Arc<dyn ModelProvider>,
        env: &'a mut dyn Environment,
        observer: &'a mut dyn RunObserver,
    ) -> Self {
        // Every prompt is counted: build the tokenizer while the task is looked up, leased and
        // checked (the first count waits for it; later runners find it built).
        skillstate_core::tokens::warm_up();
        Self {
            store,
            env,
            observer,
            lease_policy: LeasePolicy::default(),
            lease: None,
            secrets: Redactor::new(model.secret_values()),
            tool_limit: DEFAULT_CALL_LIMIT,
            stop: None,
            next_observation: None,
            held_result: None,
            inbox_empty_at: None,
            world: Default::default(),
            trace_parent: None,
            run_span: tracing::Span::none(),
            content: Err(""),
            model,
        }
    }

    /// Stops at the next step boundary once `stop` is set: the step in flight commits and its
    /// action's result is recorded, then `run` returns with the task still running (another
    /// runner continues it).
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The longest a tool call may take before it becomes a "timed out" observation.
    pub fn with_tool_limit(mut self, limit: Duration) -> Self {
        self.tool_limit = limit;
        self
    }

    /// Also keeps these secret values out of everything the runner stores.
    /// The model's provider redacts them too, from every body it receives.
    pub fn with_secrets(mut self, secrets: &Redactor) -> Self {
        self.secrets.extend(secrets);
        self.model.withhold(&self.secrets);
        self
    }

    /// Makes the run's span a child of this W3C `traceparent` (stored with a queued task by
    /// the request that created it); ignored when telemetry is off or it does not parse.
    pub fn with_trace_parent(mut self, traceparent: Option<String>) -> Self {
        self.trace_parent = traceparent;
        self
    }

    /// How this runner leases tasks (time to live, and who it says it is).
    pub fn with_lease_policy(mut self, policy: LeasePolicy) -> Self {
        self.lease_policy = policy;
        self
    }

    /// Runs `task_id` from wherever it stands until it completes, fails or pauses.
    pub async fn run(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        self.enter(task_id, Entry::Run).await
    }

    /// Continues a task that failed for a reason a retry can fix (the model server was down,
    /// every answer of a step was rejected), with a fresh retry budget for the failed step.
    pub async fn retry(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        self.enter(task_id, Entry::Retry).await
    }

    /// Runs the action waiting for approval, exactly once, and continues the task.
    pub async fn approve(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        self.enter(task_id, Entry::Approve).await
    }

    /// Refuses the action waiting for approval; the refusal and its reason become the next
    /// observation, and the task continues.
    pub async fn reject(
        &mut self,
        task_id: &str,
        reason: &str,
    ) -> Result<RunOutcome, RuntimeError> {
        self.enter(task_id, Entry::Reject(reason)).await
    }

    /// Answers a paused task — an `ask_user` question or an action whose outcome is unknown —
    /// and runs it on: the answer becomes the paused action's result and opens the next step.
    pub async fn reply(&mut self, task_id: &str, answer: &str) -> Result<RunOutcome, RuntimeError> {
        self.enter(task_id, Entry::Reply(answer)).await
    }

    /// Takes the task's lease, does what was asked, gives the lease back.
    async fn enter(&mut self, task_id: &str, entry: Entry<'_>) -> Result<RunOutcome, RuntimeError> {
        let id = self.store.task(task_id).await?.id;
        let lease = HeldLease::acquire(self.store.clone(), &id, &self.lease_policy).await?;
        self.lease = Some(lease);
        let result = match entry {
            Entry::Run => self.run_held(&id).await,
            Entry::Retry => self.retry_held(&id).await,
            Entry::Approve => self.approve_held(&id).await,
            Entry::Reject(reason) => self.reject_held(&id, reason).await,
            Entry::Reply(answer) => self.reply_held(&id, answer).await,
        };
        if let Some(lease) = self.lease.take() {
            lease.release().await;
        }
        result
    }

    /// Runs a task whose lease a worker's claim already took and whose heartbeat the worker
    /// started at the claim; `retry` continues a failed task with a fresh retry budget. The
    /// lease stays held when this returns, for the worker to settle the claim.
    pub(crate) async fn run_claimed(
        &mut self,
        task_id: &str,
        lease: HeldLease,
        retry: bool,
    ) -> Result<RunOutcome, RuntimeError> {
        self.lease = Some(lease);
        let result = if retry {
            self.retry_held(task_id).await
        } else {
            self.run_held(task_id).await
        };
        if let Some(lease) = self.lease.take() {
            lease.keep();
        }
        result
    }

    /// Whether the worker this runner drives for drains (stop at the next step boundary).
    pub(crate) fn draining(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// Where this runner's writes go: through its lease, checked with each write.
    pub(crate) fn writer(&self) -> TaskWriter<'_> {
        TaskWriter {
            store: self.store.as_ref(),
            lease: self.lease.as_ref(),
        }
    }

    /// `Err` when this runner no longer holds its task's lease.
    pub(crate) fn check_lease(&self) -> Result<(), RuntimeError> {
        match &self.lease {
            Some(lease) => lease.check(),
            None => Ok(()),
        }
    }

    /// `run` with the lease already held.
    pub(crate) async fn run_held(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        let task = self.store.task(task_id).await?;
        check_continuity(self.store.as_ref(), &task).await?;
        // An upgrade scheduled while the task waited on an action it settled (`approve`,
        // `reject`, `reply` directly) goes in before anything else.
        let task = match self.upgrade_scheduled(&task).await? {
            Some(upgraded) => upgraded,
            None => task,
        };
        let mut frame = self.frame_of(&task).await?;
        self.restore_world(&task).await?;
        let env_tools = crate::recall::with_recall(self.env.tools(), &self.store, &task);
        for spec in frame
            .catalog
            .specs()
            .iter()
            .filter(|s| s.source != "runtime")
        {
            if find_tool(&env_tools, &spec.name).is_none() {
                return Err(RuntimeError::MissingTool {
                    task: task.id.clone(),
                    tool: spec.name.clone(),
                });
            }
        }
        // Decisions and messages sent while the task was paused, finished or not running; a
        // decision that settles the waiting action lets a scheduled upgrade in. What an earlier
        // run's commit found in the inbox says nothing about it now.
        self.inbox_empty_at = None;
        let task = if self.open_inbox(&task, &env_tools).await? {
            let task = self.store.task(&task.id).await?;
            match self.upgrade_scheduled(&task).await? {
                Some(upgraded) => {
                    frame = self.frame_of(&upgraded).await?;
                    upgraded
                }
                None => task,
            }
        } else {
            task
        };
        // The journal is read once per run; from here on the runner keeps what the next steps
        // need (answers already given at the current step, transcript turns) in memory, so a
        // step's store work does not grow with the steps already taken. Only one runner drives
        // a task (the lease), so nothing else appends to the journal meanwhile.
        let journal = self.store.journal(&task.id).await?;
        // Only the model's own answers were calls to it (state written through the service is
        // journaled too, with its author).
        self.model
            .skip_calls(journal.iter().filter(|e| e.author.is_none()).count());
        let earlier = Attempts::at(&journal, task.version + 1);
        let journal = task.context.uses_turns().then_some(journal);

        let unknown = frame.skill.settings().run.on_unknown_outcome;
        if task.status == TaskStatus::Running
            && !self
                .settle_pending_intent(&task.id, task.version, &env_tools, unknown)
                .await?
        {
            let mut turns = match journal {
                Some(journal) => {
                    turns_from(self.store.as_ref(), &task.id, journal, task.version).await?
                }
                None => Vec::new(),
            };
            self.drive(&task, &frame, &env_tools, &mut turns, earlier)
                .await?;
        }
        let final_task = self.store.task(&task.id).await?;
        Ok(RunOutcome {
            task_id: final_task.id,
            status: final_task.status,
            steps: final_task.version,
            outcome: final_task.outcome,
        })
    }

    /// The frame `task`'s prompts are rendered from, with its board attached.
    async fn frame_of(&self, task: &TaskRecord) -> Result<TaskFrame, RuntimeError> {
        let mut frame = TaskFrame::new(task)?;
        let scope = frame.skill.settings().board.clone();
        if let Some(board) = BoardFrame::of(self.store.as_ref(), task, scope.as_ref()).await? {
            frame.attach(board);
        }
        Ok(frame)
    }

    /// Steps until the task stops running; a result still held back is written before this
    /// returns (unless the lease was lost: the task's next runner settles that intent).
    async fn drive(
        &mut self,
        task: &TaskRecord,
        frame: &TaskFrame,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
        earlier: Attempts,
    ) -> Result<(), RuntimeError> {
        let span = crate::spans::task(
            &task.id,
            &frame.skill.definition.name,
            self.trace_parent.as_deref(),
        );
        self.run_span = span.clone();
        self.content = crate::spans::content_allowed(frame.content_withheld());
        let driven = self
            .drive_steps(task, frame, env_tools, turns, earlier)
            .instrument(span)
            .await;
        if self.check_lease().is_err() {
            self.held_result = None;
            return driven;
        }
        let written = self.write_held_result().await;
        driven.and(written)
    }

    /// Writes the action result held back for the next commit, if any.
    pub(crate) async fn write_held_result(&mut self) -> Result<(), RuntimeError> {
        if let Some((task, result)) = self.held_result.take() {
            self.writer()
                .write(&task, LeasedWrite::ActionResult(&result))
                .await?;
        }
        Ok(())
    }

    async fn drive_steps(
        &mut self,
        task: &TaskRecord,
        frame: &TaskFrame,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
        earlier: Attempts,
    ) -> Result<(), RuntimeError> {
        // Only the run's first step can have answers from before this run.
        let mut earlier = Some(earlier);
        let mut state = task.state.clone();
        let mut version = task.version;
        let max_steps = u64::from(frame.skill.settings().run.max_steps);
        loop {
            if self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok(());
            }
            if self.env.episode_over() {
                let outcome = json!({"reason": "episode_over", "environment": self.env.outcome()});
                return self.finish(&task.id, TaskStatus::Completed, outcome).await;
            }
            if version >= max_steps {
                let outcome = json!({
                    "reason": "max_steps",
                    "message": format!("stopped after max_steps = {max_steps} without finishing; raise [run] max_steps in skill.toml"),
                });
                return self.finish(&task.id, TaskStatus::Failed, outcome).await;
            }
            // Messages that arrived join this step's observation.
            let step = version + 1;
            let shown = match &self.next_observation {
                Some((of, at, text)) if *of == task.id && *at == step => Some(text.clone()),
                _ => None,
            };
            if let Some(text) = self.deliver_waiting(&task.id, step, shown).await? {
                self.next_observation = Some((task.id.clone(), step, text));
            }
            let budget = StepBudget {
                first_counted: budget_start(task.outcome.as_ref(), version + 1),
                earlier: earlier
                    .take()
                    .filter(|a| a.step == version + 1)
                    .unwrap_or_default(),
            };
            if let StepEnd::Stop = self
                .step(
                    &task.id,
                    frame,
                    (&mut state, &mut version),
                    budget,
                    env_tools,
                    turns,
                )
                .instrument(crate::spans::step(&task.id, step))
                .await?
            {
                return Ok(());
            }
        }
    }

    pub(crate) async fn finish(
        &mut self,
        task: &str,
        status: TaskStatus,
        mut outcome: Value,
    ) -> Result<(), RuntimeError> {
        self.write_held_result().await?;
        self.run_span
            .record("skillstate.task.status", status.as_str());
        self.secrets.redact_json(&mut outcome);
        self.writer()
            .write(
                task,
                LeasedWrite::Status {
                    status,
                    outcome: Some(&outcome),
                },
            )
            .await?;
        Ok(())
    }
}

pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
