//! Starting a task: how it is run (`TaskOptions`), what a run reports (`RunObserver`) and
//! where it leaves the task (`RunOutcome`); `start_task` and `prepare_task` freeze the skill and
//! its tools and record the opening observation.

use serde_json::Value;
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use skillstate_core::{AcceptedStep, ContextStrategy, RejectedStep, Skill, ToolCatalog, ToolSpec};
use skillstate_store::{NewTask, Store, TaskRecord, TaskStatus};
use skillstate_tools::{Environment, ToolOutput};

use crate::RuntimeError;
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

/// Creates a task for `skill` in `env`, attached to `board` (a board record's id; `name` for
/// messages), as `start_task` does. Whether the skill can join is checked before anything is
/// stored (`board::join_problem`), and the task and its membership are written in one
/// transaction (`Boards::create_board_task`): a refused join stores nothing.
pub async fn start_board_task(
    store: &dyn Store,
    skill: &Skill,
    env: &mut dyn Environment,
    options: &TaskOptions,
    board: &str,
    name: &str,
) -> Result<TaskRecord, RuntimeError> {
    if let Some(message) = skillstate_core::board::join_problem(skill) {
        return Err(RuntimeError::CannotJoin {
            board: name.to_owned(),
            message,
        });
    }
    let task = prepare_task(skill, env, options)?;
    Ok(store
        .create_board_task(board, task, &skill.definition.initial_state)
        .await?)
}

/// The tools a task of `skill` presents to the model in `env`, as `prepare_task` chooses them
/// (also the tools of a version a task is upgraded to).
pub fn presented_tools(
    skill: &Skill,
    env: &dyn Environment,
) -> Result<Vec<ToolSpec>, RuntimeError> {
    let tools = select_tools(
        &crate::recall::available_tools(env.tools()),
        &skill.settings().tools,
    )?;
    let specs: Vec<ToolSpec> = tools.iter().map(|t| t.spec().clone()).collect();
    ToolCatalog::new(specs.clone())?;
    Ok(specs)
}

/// What `start_task` stores, without storing it (a batch queues many at once).
pub fn prepare_task(
    skill: &Skill,
    env: &mut dyn Environment,
    options: &TaskOptions,
) -> Result<NewTask, RuntimeError> {
    let specs = presented_tools(skill, env)?;
    let opening = env.opening_observation();
    let opening_observation =
        crate::voice::not_the_user(&Outside::new(opening).redacted(&options.secrets)).into_owned();
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
