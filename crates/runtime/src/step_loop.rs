//! The runner: drives one task through its steps, committing each accepted step atomically.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use skillstate_core::json::text_hash;
use skillstate_core::prompt::Turn;
use skillstate_core::skill::UnknownOutcome;
use skillstate_core::tool::CatalogError;
use skillstate_core::validate::Document;
use skillstate_core::{
    AcceptedStep, Action, ContextStrategy, Prompt, PromptInput, RejectedStep, Rejection,
    RejectionKind, Skill, StepRules, ToolCatalog, ToolSpec, count_tokens, render,
    step_output_schema, validate_step,
};
use skillstate_providers::{ModelProvider, ModelRequest};
use skillstate_store::{
    ActionResult, JournalEntry, NewIntent, NewTask, StepCommit, Store, StoreError, TaskRecord,
    TaskStatus, Verdict, state_at,
};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, Tool, ToolOutput, failpoint, find_tool,
};

use crate::select::{SelectError, select_tools};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    #[error(transparent)]
    Tools(#[from] SelectError),
    #[error("the skill's tools cannot be offered: {0}")]
    Catalog(#[from] CatalogError),
    #[error("task {task}: {message}")]
    StoredTask { task: String, message: String },
    #[error("task {task} needs tool `{tool}`, which this environment does not provide")]
    MissingTool { task: String, tool: String },
}

/// Hooks for progress reporting; every method has a no-op default.
pub trait RunObserver: Send {
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
}

impl TaskOptions {
    pub fn new(model: impl Into<String>, context: ContextStrategy) -> Self {
        Self {
            model: model.into(),
            context,
            context_budget: None,
            environment: None,
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
    let tools = select_tools(&env.tools(), &skill.settings().tools)?;
    let specs: Vec<ToolSpec> = tools.iter().map(|t| t.spec().clone()).collect();
    ToolCatalog::new(specs.clone())?;
    let opening_observation = env.opening_observation();
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
    Ok(store
        .create_task(task, &skill.definition.initial_state)
        .await?)
}

/// What every prompt of a task is rendered from, besides the per-step inputs.
struct TaskFrame {
    skill: Skill,
    catalog: ToolCatalog,
    read_only: Vec<String>,
    context: ContextStrategy,
    context_budget: Option<usize>,
    /// The schema of a whole step answer, for providers that constrain decoding.
    output_schema: Arc<Value>,
}

impl TaskFrame {
    fn new(task: &TaskRecord) -> Result<Self, RuntimeError> {
        let skill = Skill::from_definition(task.skill.clone()).map_err(|message| {
            RuntimeError::StoredTask {
                task: task.id.clone(),
                message,
            }
        })?;
        let catalog = ToolCatalog::new(task.tools.clone())?;
        let read_only = skill.schema.declared_read_only_properties();
        let output_schema = Arc::new(step_output_schema(&skill.schema, catalog.specs()));
        Ok(Self {
            skill,
            catalog,
            read_only,
            context: task.context,
            context_budget: task.context_budget,
            output_schema,
        })
    }

    fn prompt(
        &self,
        state: &Value,
        observation: &str,
        retry: &[Rejection],
        turns: &[Turn],
    ) -> Prompt {
        render(
            self.context,
            &PromptInput {
                skill: &self.skill.definition,
                tools: self.catalog.specs(),
                read_only: &self.read_only,
                state,
                observation,
                observation_budget: self.skill.settings().budgets.observation_tokens,
                retry,
                turns,
                context_budget: self.context_budget,
            },
        )
    }
}

/// Rebuilds the exact prompt of `step`/`attempt` from the journal, with the hash recorded when
/// the model received it.
pub async fn rebuild_prompt(
    store: &dyn Store,
    task: &TaskRecord,
    step: u64,
    attempt: u32,
) -> Result<(Prompt, String), RuntimeError> {
    let frame = TaskFrame::new(task)?;
    let journal = store.journal(&task.id).await?;
    let entry = journal
        .iter()
        .find(|e| e.step == step && e.attempt == attempt)
        .ok_or_else(|| RuntimeError::StoredTask {
            task: task.id.clone(),
            message: format!("the journal has no attempt {attempt} at step {step}"),
        })?;
    let state = state_at(store, &task.id, step - 1, task.version).await?;
    let observation =
        store
            .observation(&task.id, step)
            .await?
            .ok_or_else(|| RuntimeError::StoredTask {
                task: task.id.clone(),
                message: format!("no observation recorded for step {step}"),
            })?;
    let retry = match journal
        .iter()
        .find(|e| e.step == step && e.attempt + 1 == attempt)
    {
        Some(previous) => rejections_of(previous),
        None => Vec::new(),
    };
    let turns = if task.context.uses_turns() {
        load_turns(store, &task.id, step - 1).await?
    } else {
        Vec::new()
    };
    Ok((
        frame.prompt(&state, &observation, &retry, &turns),
        entry.prompt_hash.clone(),
    ))
}

/// The accepted steps up to `up_to` as transcript turns, from the journal, observations and
/// action results.
async fn load_turns(store: &dyn Store, task: &str, up_to: u64) -> Result<Vec<Turn>, RuntimeError> {
    let observations: BTreeMap<u64, String> = store.observations(task).await?.into_iter().collect();
    let results: BTreeMap<u64, Option<String>> = store
        .intents(task)
        .await?
        .into_iter()
        .map(|i| (i.step, i.result))
        .collect();
    Ok(store
        .journal(task)
        .await?
        .into_iter()
        .filter(|e| e.verdict == Verdict::Accepted && e.step <= up_to)
        .map(|e| Turn {
            step: e.step,
            observation: observations.get(&e.step).cloned().unwrap_or_default(),
            action: e
                .action
                .as_ref()
                .and_then(Action::from_call_json)
                .map(|a| a.summary())
                .unwrap_or_default(),
            answer: e.output,
            result: results.get(&e.step).cloned().flatten(),
        })
        .collect())
}

fn rejections_of(entry: &JournalEntry) -> Vec<Rejection> {
    entry
        .errors
        .as_ref()
        .and_then(|e| serde_json::from_value(e.clone()).ok())
        .unwrap_or_default()
}

/// Drives tasks with one model and one environment.
pub struct Runner<'a> {
    store: Arc<dyn Store>,
    model: Arc<dyn ModelProvider>,
    env: &'a mut dyn Environment,
    observer: &'a mut dyn RunObserver,
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
        Self {
            store,
            model,
            env,
            observer,
        }
    }

    /// Runs `task_id` from wherever it stands until it completes, fails or pauses.
    pub async fn run(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
        let task = self.store.task(task_id).await?;
        let frame = TaskFrame::new(&task)?;
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
        let journal = self.store.journal(&task.id).await?;
        self.model.skip_calls(journal.len());

        let unknown = frame.skill.settings().run.on_unknown_outcome;
        if task.status == TaskStatus::Running
            && !self
                .settle_pending_intent(&task.id, task.version, &env_tools, unknown)
                .await?
        {
            let mut turns = if task.context.uses_turns() {
                load_turns(self.store.as_ref(), &task.id, task.version).await?
            } else {
                Vec::new()
            };
            self.drive(&task, &frame, &env_tools, &mut turns).await?;
        }
        let final_task = self.store.task(&task.id).await?;
        Ok(RunOutcome {
            task_id: final_task.id,
            status: final_task.status,
            steps: final_task.version,
            outcome: final_task.outcome,
        })
    }

    /// Steps until the task stops running.
    async fn drive(
        &mut self,
        task: &TaskRecord,
        frame: &TaskFrame,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
    ) -> Result<(), RuntimeError> {
        let mut state = task.state.clone();
        let mut version = task.version;
        let max_steps = u64::from(frame.skill.settings().run.max_steps);
        loop {
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
            if let StepEnd::Stop = self
                .step(&task.id, frame, &mut state, &mut version, env_tools, turns)
                .await?
            {
                return Ok(());
            }
        }
    }

    async fn finish(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Value,
    ) -> Result<(), RuntimeError> {
        self.store.set_status(task, status, Some(&outcome)).await?;
        Ok(())
    }

    /// One step: ask the model until an answer is accepted or retries run out, commit it, act.
    async fn step(
        &mut self,
        task: &str,
        frame: &TaskFrame,
        state: &mut Value,
        version: &mut u64,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
    ) -> Result<StepEnd, RuntimeError> {
        let step = *version + 1;
        let observation =
            self.store
                .observation(task, step)
                .await?
                .ok_or_else(|| RuntimeError::StoredTask {
                    task: task.to_owned(),
                    message: format!("no observation recorded for step {step}"),
                })?;
        let settings = frame.skill.settings();
        let rules = StepRules {
            schema: &frame.skill.schema,
            catalog: &frame.catalog,
            state_token_budget: settings.budgets.state_tokens,
        };
        let journal = self.store.journal(task).await?;
        let done_attempts: Vec<&JournalEntry> = journal.iter().filter(|e| e.step == step).collect();
        let mut retry: Vec<Rejection> = done_attempts
            .last()
            .map(|e| rejections_of(e))
            .unwrap_or_default();
        let first_attempt = done_attempts.len() as u32 + 1;
        let max_attempts = settings.run.max_retries + 1;

        for attempt in first_attempt..=max_attempts {
            let prompt = frame.prompt(state, &observation, &retry, turns);
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
                    self.finish(
                        task,
                        TaskStatus::Failed,
                        json!({"reason": "provider", "message": error.to_string(), "step": step}),
                    )
                    .await?;
                    return Ok(StepEnd::Stop);
                }
            };
            let latency_ms = started.elapsed().as_millis() as u64;
            failpoint("after_model");
            let mut verdict = validate_step(&rules, state, &response.text);
            if let (true, Err(rejected)) = (response.truncated, &mut verdict) {
                rejected.rejections.insert(0, truncation_rejection());
            }

            self.observer
                .attempt(step, attempt, prompt_tokens, verdict.as_ref());
            let mut entry = JournalEntry {
                step,
                attempt,
                verdict: Verdict::Rejected,
                output: response.text,
                patch: None,
                action: None,
                errors: None,
                state_hash: None,
                prompt_tokens: prompt_tokens as u64,
                prompt_hash: text_hash(&text),
                usage: response.usage.and_then(|u| serde_json::to_value(u).ok()),
                latency_ms,
                created_at: now_millis(),
            };
            match verdict {
                Err(rejected) => {
                    entry.errors = serde_json::to_value(&rejected.rejections).ok();
                    self.store.record_rejection(task, &entry).await?;
                    retry = rejected.rejections;
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
                    let (end, result) = self
                        .commit_and_act(
                            task,
                            step,
                            entry,
                            accepted,
                            state,
                            version,
                            env_tools,
                            needs_approval,
                        )
                        .await?;
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
        state: &mut Value,
        version: &mut u64,
        env_tools: &[Arc<dyn Tool>],
        needs_approval: bool,
    ) -> Result<(StepEnd, Option<String>), RuntimeError> {
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
        };
        self.store.commit_step(task, *version, &commit).await?;
        failpoint("after_commit");
        *state = accepted.new_state;
        *version = step;
        if status.is_some() {
            return Ok((StepEnd::Stop, None));
        }
        let mut result = None;
        if let Action::Tool { name, args } = &accepted.action {
            let output = self.execute(task, step, name, args, env_tools).await;
            failpoint("after_tool");
            result = Some(output.text.clone());
            self.record_result(task, step, output).await?;
        }
        Ok((StepEnd::Continue, result))
    }

    async fn execute(
        &mut self,
        task: &str,
        step: u64,
        name: &str,
        args: &Value,
        env_tools: &[Arc<dyn Tool>],
    ) -> ToolOutput {
        let Some(tool) = find_tool(env_tools, name) else {
            return ToolOutput::failure(format!("Error: tool {name} is not available."));
        };
        match tool.call(args, &CallContext::new(task, step)).await {
            Ok(output) => output,
            Err(error) => ToolOutput::failure(format!("Error: {error}")),
        }
    }

    async fn record_result(
        &mut self,
        task: &str,
        step: u64,
        output: ToolOutput,
    ) -> Result<(), RuntimeError> {
        self.observer.action_done(step, &output);
        let next_observation = match self.env.after_action() {
            Some(event) => format!("{}\n{event}", output.text),
            None => output.text.clone(),
        };
        self.store
            .record_action_result(
                task,
                &ActionResult {
                    step,
                    ok: output.ok,
                    result: output.text,
                    next_observation,
                    env_checkpoint: Some(self.env.checkpoint()),
                },
            )
            .await?;
        Ok(())
    }

    /// After a crash between committing a step and recording its action's result, the intent
    /// is pending. Read-only and idempotent tools run again (same idempotency key); anything
    /// else is never repeated blindly: the model is told the outcome is unknown.
    /// Returns `true` when the task paused for a human instead.
    async fn settle_pending_intent(
        &mut self,
        task: &str,
        version: u64,
        env_tools: &[Arc<dyn Tool>],
        unknown: UnknownOutcome,
    ) -> Result<bool, RuntimeError> {
        if version == 0 || self.store.observation(task, version + 1).await?.is_some() {
            return Ok(false);
        }
        let intents = self.store.intents(task).await?;
        let Some(intent) = intents.iter().find(|i| i.step == version && !i.done) else {
            return Ok(false);
        };
        let output = if intent.side_effect == "read_only" || intent.side_effect == "idempotent" {
            self.execute(task, version, &intent.tool, &intent.args, env_tools)
                .await
        } else if unknown == UnknownOutcome::Ask {
            let question = format!(
                "The runtime stopped while `{}` with args {} (step {}) was running, so it may or may not have taken effect. What happened?",
                intent.tool, intent.args, intent.step
            );
            let outcome =
                json!({"reason": "unknown_outcome", "question": question, "step": intent.step});
            self.store
                .set_status(task, TaskStatus::AwaitingInput, Some(&outcome))
                .await?;
            return Ok(true);
        } else {
            ToolOutput::failure(format!(
                "Outcome unknown: the runtime stopped while `{}` with args {} (step {}) was running, so it may or may not have taken effect. Check before repeating it.",
                intent.tool, intent.args, intent.step
            ))
        };
        self.record_result(task, version, output).await?;
        Ok(false)
    }

    /// Runs the action waiting for approval, exactly once, and continues the task.
    pub async fn approve(&mut self, task_id: &str) -> Result<RunOutcome, RuntimeError> {
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
        self.run(&task.id).await
    }

    /// Refuses the action waiting for approval; the refusal and its reason become the next
    /// observation, and the task continues.
    pub async fn reject(
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
        self.run(&task.id).await
    }

    /// The task and its pending intent, if the task is in `status`.
    async fn waiting(
        &self,
        task_id: &str,
        status: TaskStatus,
    ) -> Result<(TaskRecord, skillstate_store::IntentRecord), RuntimeError> {
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
    pub async fn reply(&mut self, task_id: &str, answer: &str) -> Result<RunOutcome, RuntimeError> {
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
        self.run(&task.id).await
    }
}

fn now_millis() -> i64 {
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
