//! The runner: drives one task through its steps, committing each accepted step atomically.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skillstate_core::board::{BoardRules, mounted_view, validate_board_step};
use skillstate_core::json::text_hash;
use skillstate_core::prompt::Turn;
use skillstate_core::secrets::Redactor;
use skillstate_core::validate::Document;
use skillstate_core::{
    AcceptedStep, Action, ContextStrategy, RejectedStep, Rejection, RejectionKind, Skill,
    StepRules, ToolCatalog, ToolSpec, count_tokens, validate_step,
};
use skillstate_providers::{ModelProvider, ModelRequest};
use skillstate_store::{
    ActionResult, JournalEntry, NewIntent, NewTask, StepCommit, Store, TaskRecord, TaskStatus,
    Verdict,
};
use skillstate_tools::{
    CallContext, DEFAULT_CALL_LIMIT, Environment, Tool, ToolOutput, call_bounded, failpoint,
    find_tool,
};

use crate::RuntimeError;
use crate::board::{BoardCommitted, BoardFrame, BoardSeen};
use crate::frame::{TaskFrame, turns_from};
use crate::lease::{HeldLease, LeasePolicy};
use crate::recovery::{Attempts, budget_start, check_continuity};
use crate::select::select_tools;

/// Hooks for progress reporting; every method has a no-op default.
pub trait RunObserver: Send + Sync {
    fn attempt(
        &mut self,
        step: u64,
        attempt: u32,
        prompt_tokens: usize,
        result: Result<&AcceptedStep, &RejectedStep>,
    ) {
        let _ = (step, attempt, prompt_tokens, result);
    }
    fn action_done(&mut self, step: u64, output: &ToolOutput) {
        let _ = (step, output);
    }
}

/// An observer that reports nothing.
pub struct NoProgress;
impl RunObserver for NoProgress {}

/// Where a run left its task.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub task_id: String,
    pub status: TaskStatus,
    pub steps: u64,
    pub outcome: Option<Value>,
}

/// How a new task is run: which model, and what its prompts keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOptions {
    pub model: String,
    pub context: ContextStrategy,
    /// Token budget for `window` and `summary` (see `PromptInput::context_budget`).
    pub context_budget: Option<usize>,
    /// What to record as the task's environment, when it is not the skill's own
    /// `[environment]` (for example the work directory and MCP servers of a tool box).
    pub environment: Option<Value>,
    /// Secret values kept out of the stored opening observation.
    pub secrets: Redactor,
}

impl TaskOptions {
    pub fn new(model: impl Into<String>, context: ContextStrategy) -> Self {
        Self {
            model: model.into(),
            context,
            context_budget: None,
            environment: None,
            secrets: Redactor::default(),
        }
    }
}

/// Creates a task for `skill` in `env`: freezes the skill and the tools it may use, and records
/// the opening observation.
pub async fn start_task(
    store: &dyn Store,
    skill: &Skill,
    env: &mut dyn Environment,
    options: &TaskOptions,
) -> Result<TaskRecord, RuntimeError> {
    let task = prepare_task(skill, env, options)?;
    Ok(store
        .create_task(task, &skill.definition.initial_state)
        .await?)
}

/// What `start_task` stores, without storing it (a batch queues many at once).
pub fn prepare_task(
    skill: &Skill,
    env: &mut dyn Environment,
    options: &TaskOptions,
) -> Result<NewTask, RuntimeError> {
    let tools = select_tools(&env.tools(), &skill.settings().tools)?;
    let specs: Vec<ToolSpec> = tools.iter().map(|t| t.spec().clone()).collect();
    ToolCatalog::new(specs.clone())?;
    let opening_observation = options
        .secrets
        .redact(&env.opening_observation())
        .into_owned();
    let task = NewTask {
        skill: skill.definition.clone(),
        tools: specs,
        context: options.context,
        context_budget: options.context_budget,
        model: options.model.clone(),
        environment: options.environment.clone().or_else(|| {
            skill
                .settings()
                .environment
                .as_ref()
                .and_then(|e| serde_json::to_value(e).ok())
        }),
        env_checkpoint: Some(env.checkpoint()),
        opening_observation,
    };
    Ok(task)
}

/// Drives tasks with one model and one environment. Every entry point (`run`, `retry`,
/// `approve`, `reject`, `reply`) holds the task's execution lease while it works, so only one
/// runner drives a task at a time.
pub struct Runner<'a> {
    pub(crate) store: Arc<dyn Store>,
    model: Arc<dyn ModelProvider>,
    pub(crate) env: &'a mut dyn Environment,
    observer: &'a mut dyn RunObserver,
    lease_policy: LeasePolicy,
    lease: Option<HeldLease>,
    /// Secret values (the model's key, the operator's secrets) replaced in every answer,
    /// result and outcome before it is validated, stored or shown.
    secrets: Redactor,
    /// The longest any tool call may take (a tool's own, longer limit wins).
    tool_limit: Duration,
    /// Set by a draining worker: stop at the next step boundary, the task left running.
    stop: Option<Arc<AtomicBool>>,
    /// The observation the last recorded action result opened `(task, step, text)`, as stored.
    next_observation: Option<(String, u64, String)>,
    /// A read-only or idempotent tool's result not written yet: it goes into the next step's
    /// commit, or is written on its own when the run stops first.
    held_result: Option<(String, ActionResult)>,
}

/// What a runner was asked to do with a stored task.
enum Entry<'s> {
    Run,
    Retry,
    Approve,
    Reject(&'s str),
    Reply(&'s str),
}

/// The retry budget of one step.
struct StepBudget {
    /// The first attempt whose answer counts against the budget.
    first_counted: u32,
    /// The answers the step had before this run reached it.
    earlier: Attempts,
}

enum StepEnd {
    Continue,
    /// The task completed, failed or paused.
    Stop,
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
    pub fn with_secrets(mut self, secrets: &Redactor) -> Self {
        self.secrets.extend(secrets);
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
        let mut frame = TaskFrame::new(&task)?;
        let scope = frame.skill.settings().board.clone();
        if let Some(board) = BoardFrame::of(self.store.as_ref(), &task, scope.as_ref()).await? {
            frame.attach(board);
        }
        if let Some(checkpoint) = &task.env_checkpoint {
            self.env.restore(checkpoint)?;
        }
        let env_tools = self.env.tools();
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
        // Decisions and messages sent while the task was paused, finished or not running.
        let task = if self.open_inbox(&task, &env_tools).await? {
            self.store.task(&task.id).await?
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
        let driven = self
            .drive_steps(task, frame, env_tools, turns, earlier)
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
            self.store.record_action_result(&task, &result).await?;
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
                .await?
            {
                return Ok(());
            }
        }
    }

    async fn finish(
        &mut self,
        task: &str,
        status: TaskStatus,
        mut outcome: Value,
    ) -> Result<(), RuntimeError> {
        self.write_held_result().await?;
        self.secrets.redact_json(&mut outcome);
        self.store.set_status(task, status, Some(&outcome)).await?;
        Ok(())
    }

    /// One step: ask the model until an answer is accepted or retries run out, commit it, act.
    /// Answers from attempt `budget.first_counted` on count against the retry budget (1 unless
    /// a `retry` restarted it); `budget.earlier` are the answers the step already had.
    async fn step(
        &mut self,
        task: &str,
        frame: &TaskFrame,
        (state, version): (&mut Value, &mut u64),
        budget: StepBudget,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
    ) -> Result<StepEnd, RuntimeError> {
        let step = *version + 1;
        // The observation this runner just recorded is the stored one; only the first step of
        // a run reads it back.
        let observation = match self.next_observation.take() {
            Some((of, at, text)) if of == task && at == step => text,
            _ => self.store.observation(task, step).await?.ok_or_else(|| {
                RuntimeError::StoredTask {
                    task: task.to_owned(),
                    message: format!("no observation recorded for step {step}"),
                }
            })?,
        };
        let settings = frame.skill.settings();
        let rules = StepRules {
            schema: &frame.skill.schema,
            catalog: &frame.catalog,
            state_token_budget: settings.budgets.state_tokens,
        };
        let StepBudget {
            first_counted,
            earlier,
        } = budget;
        let first_attempt = earlier.made.saturating_add(1);
        let max_attempts = settings.run.max_retries.saturating_add(1);
        // Answers refused for meeting others' board writes before this run reached the step
        // (a crash in the middle of it) are free as they were then.
        let mut conflicts = earlier.board_conflicts_from(first_counted);
        let mut last_attempt = first_counted
            .saturating_sub(1)
            .saturating_add(max_attempts)
            .saturating_add(conflicts.min(MAX_CONFLICTS_PER_STEP));
        let mut retry: Vec<Rejection> = earlier.last_errors;
        let mut attempt = first_attempt;
        while attempt <= last_attempt {
            self.check_lease()?;
            // A board member's prompt shows the newest board through its reads, at `/board`.
            let seen = match &frame.board {
                Some(board) => Some(board.read(self.store.as_ref()).await?),
                None => None,
            };
            let shown = match (&frame.board, &seen) {
                (Some(board), Some(seen)) => {
                    std::borrow::Cow::Owned(mounted_view(state, &seen.state, &board.scope))
                }
                _ => std::borrow::Cow::Borrowed(&*state),
            };
            let prompt = frame.prompt(&shown, &observation, &retry, turns);
            let text = prompt.text();
            let prompt_tokens = count_tokens(&text);
            let started = Instant::now();
            failpoint("before_model");
            let response = match self
                .model
                .complete(&ModelRequest {
                    prompt,
                    prompt_tokens,
                    output_schema: Some(frame.output_schema.clone()),
                })
                .await
            {
                Ok(response) => response,
                Err(error) => {
                    crate::metrics::model_failed();
                    self.finish(
                        task,
                        TaskStatus::Failed,
                        json!({"reason": "provider", "message": error.to_string(), "step": step}),
                    )
                    .await?;
                    return Ok(StepEnd::Stop);
                }
            };
            let latency = started.elapsed();
            let latency_ms = latency.as_millis() as u64;
            crate::metrics::model_answered(latency, prompt_tokens, response.usage.as_ref());
            failpoint("after_model");
            // The answer is untrusted text: secrets it echoes are gone before anything reads it.
            let answer_text = self.secrets.redact(&response.text).into_owned();
            let mut verdict = match (&frame.board, &seen) {
                (Some(board), Some(seen)) => validate_board_step(
                    &rules,
                    &BoardRules {
                        schema: &board.schema,
                        scope: &board.scope,
                    },
                    state,
                    &seen.state,
                    &answer_text,
                ),
                _ => validate_step(&rules, state, &answer_text),
            };
            if let (true, Err(rejected)) = (response.truncated, &mut verdict) {
                rejected.rejections.insert(0, truncation_rejection());
            }

            self.observer
                .attempt(step, attempt, prompt_tokens, verdict.as_ref());
            crate::metrics::answer(verdict.as_ref());
            let output_tokens = Some(count_tokens(&answer_text) as u64);
            let mut entry = JournalEntry {
                step,
                attempt,
                verdict: Verdict::Rejected,
                output: answer_text,
                patch: None,
                action: None,
                errors: None,
                state_hash: None,
                prompt_tokens: prompt_tokens as u64,
                output_tokens,
                prompt_hash: text_hash(&text),
                usage: response.usage.and_then(|u| serde_json::to_value(u).ok()),
                latency_ms,
                created_at: now_millis(),
                author: None,
                board_version: seen.as_ref().map(|s| s.version),
            };
            match verdict {
                Err(rejected) => {
                    entry.errors = serde_json::to_value(&rejected.rejections).ok();
                    self.store.record_rejection(task, &entry).await?;
                    retry = rejected.rejections;
                    attempt += 1;
                }
                Ok(accepted) => {
                    let answer = entry.output.clone();
                    let action = accepted.action.summary();
                    let needs_approval = match &accepted.action {
                        Action::Tool { name, .. } => {
                            frame.catalog.get(name).is_some_and(|t| t.needs_approval)
                        }
                        _ => false,
                    };
                    let refusable = frame.board.is_some().then(|| entry.clone());
                    let board = frame.board.as_ref().zip(seen.as_ref());
                    let acted = self
                        .commit_and_act(
                            task,
                            step,
                            entry,
                            accepted,
                            (state, version),
                            board,
                            env_tools,
                            needs_approval,
                        )
                        .await?;
                    let (end, result) = match (acted, refusable) {
                        (Acted::Done(end, result), _) => (end, result),
                        (Acted::Refused(rejections), Some(mut entry)) => {
                            // Others' writes met this answer: not the model's mistake, so
                            // it does not spend the retry budget (up to a bound).
                            entry.errors = serde_json::to_value(&rejections).ok();
                            self.store.record_rejection(task, &entry).await?;
                            retry = rejections;
                            conflicts += 1;
                            if conflicts <= MAX_CONFLICTS_PER_STEP {
                                last_attempt = last_attempt.saturating_add(1);
                            }
                            attempt += 1;
                            continue;
                        }
                        (Acted::Refused(_), None) => unreachable_refusal(task)?,
                    };
                    if frame.context.uses_turns() {
                        turns.push(Turn {
                            step,
                            observation,
                            answer,
                            action,
                            result,
                        });
                    }
                    return Ok(end);
                }
            }
        }
        let summary: Vec<String> = retry.iter().map(ToString::to_string).collect();
        self.finish(
            task,
            TaskStatus::Failed,
            json!({
                "reason": "rejected",
                "message": format!("step {step}: every one of {max_attempts} answers was rejected; last errors: {}", summary.join("; ")),
                "step": step,
                "errors": retry,
            }),
        )
        .await?;
        Ok(StepEnd::Stop)
    }

    #[allow(clippy::too_many_arguments)]
    async fn commit_and_act(
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
        let commit = StepCommit {
            entry,
            new_state: accepted.new_state.clone(),
            intent,
            status: status.clone(),
            previous_result: self
                .held_result
                .take()
                .filter(|(of, _)| of == task)
                .map(|(_, result)| result),
            next_observation: None,
        };
        self.check_lease()?;
        match (board, &accepted.board) {
            (Some((board, seen)), Some(change)) => {
                let committed = board
                    .commit(self.store.as_ref(), task, *version, &commit, seen, change)
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
            _ => self.store.commit_step(task, *version, &commit).await?,
        }
        crate::metrics::step_committed();
        failpoint("after_commit");
        *state = accepted.new_state;
        *version = step;
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
            let action_result = self.action_result(task, step, output);
            if repeatable {
                self.held_result = Some((task.to_owned(), action_result));
            } else {
                self.store
                    .record_action_result(task, &action_result)
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
        let Some(tool) = find_tool(env_tools, name) else {
            crate::metrics::tool_called(name, false);
            return ToolOutput::failure(format!("Error: tool {name} is not available."));
        };
        // Every call is bounded: a tool stuck on a pipe, a device or a hung server becomes an
        // error observation instead of a step that never ends.
        let output = match call_bounded(
            tool.as_ref(),
            args,
            &CallContext::new(task, step),
            self.tool_limit,
        )
        .await
        {
            Ok(output) => output,
            Err(error) => ToolOutput::failure(format!("Error: {error}")),
        };
        crate::metrics::tool_called(name, output.ok);
        output
    }

    /// Records a finished action's result now.
    pub(crate) async fn record_result(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
    ) -> Result<(), RuntimeError> {
        self.record_delivering(task, step, output, Vec::new()).await
    }

    /// [`Self::record_result`], also marking the inbox entries `delivered` (the decision the
    /// result carries out, the messages its observation shows) in the same transaction.
    pub(crate) async fn record_delivering(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
        delivered: Vec<i64>,
    ) -> Result<(), RuntimeError> {
        let mut result = self.action_result(task, step, output);
        result.delivered = delivered;
        self.store.record_action_result(task, &result).await?;
        Ok(())
    }

    /// A finished action's result, redacted, with the observation the next step starts from
    /// (which this runner also keeps for that step).
    fn action_result(&mut self, task: &str, step: u64, output: ToolOutput) -> ActionResult {
        let output = ToolOutput {
            text: self.secrets.redact(&output.text).into_owned(),
            ok: output.ok,
        };
        self.observer.action_done(step, &output);
        let next_observation = match self.env.after_action() {
            Some(event) => format!("{}\n{}", output.text, self.secrets.redact(&event)),
            None => output.text.clone(),
        };
        self.next_observation = Some((task.to_owned(), step + 1, next_observation.clone()));
        ActionResult {
            step,
            ok: output.ok,
            result: output.text,
            next_observation,
            env_checkpoint: Some(self.env.checkpoint()),
            delivered: Vec::new(),
        }
    }
}

/// How many of one step's answers may be refused for meeting others' board writes without
/// spending its retry budget.
const MAX_CONFLICTS_PER_STEP: u32 = 32;

/// How an accepted answer ended.
enum Acted {
    /// Committed (and its action run, unless it paused or ended the task).
    Done(StepEnd, Option<String>),
    /// Its board part met others' writes: nothing was committed.
    Refused(Vec<Rejection>),
}

/// Only a board member's commit is refused; anything else is a defect, reported, not a panic.
fn unreachable_refusal<T>(task: &str) -> Result<T, RuntimeError> {
    Err(RuntimeError::StoredTask {
        task: task.to_owned(),
        message: "a commit without a board part was refused as a board conflict".into(),
    })
}

pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Fed back when the provider cut the answer off at its token limit.
fn truncation_rejection() -> Rejection {
    Rejection {
        kind: RejectionKind::Parse,
        document: Document::Output,
        pointer: String::new(),
        message:
            "the answer was cut off at the token limit before it was complete; answer more briefly"
                .into(),
    }
}
