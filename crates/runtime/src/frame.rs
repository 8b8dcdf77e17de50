//! What every prompt of a task is rendered from, and rebuilding any past prompt exactly from
//! the journal: both go through `TaskFrame::prompt`, so a rebuilt prompt is byte-identical.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;
use skillstate_core::prompt::Turn;
use skillstate_core::{
    Action, ContextStrategy, Prompt, PromptInput, Rejection, Skill, ToolCatalog, ToolSpec, render,
    step_output_schema,
};
use skillstate_store::{JournalEntry, Store, TaskRecord, Verdict, state_at};

use crate::RuntimeError;

/// What every prompt of a task is rendered from, besides the per-step inputs. Public so that
/// an embedding (the Python package) renders prompts and checks answers with the runner's own
/// frame.
pub struct TaskFrame {
    pub(crate) skill: Skill,
    pub(crate) catalog: ToolCatalog,
    read_only: Vec<String>,
    pub(crate) context: ContextStrategy,
    context_budget: Option<usize>,
    /// The schema of a whole step answer, for providers that constrain decoding.
    pub(crate) output_schema: Arc<Value>,
    /// The board the task is attached to, if any (`attach`).
    pub(crate) board: Option<crate::board::BoardFrame>,
    /// The state schema mentions `writeOnly`: its values appear in prompts and answers.
    write_only: bool,
}

impl TaskFrame {
    pub(crate) fn new(task: &TaskRecord) -> Result<Self, RuntimeError> {
        let skill = Skill::from_definition(task.skill.clone()).map_err(|message| {
            RuntimeError::StoredTask {
                task: task.id.clone(),
                message,
            }
        })?;
        Self::for_skill(skill, task.tools.clone(), task.context, task.context_budget)
    }

    /// The frame a task of `skill` offered `tools` (in presentation order; the control actions
    /// are added) would run with.
    pub fn for_skill(
        skill: Skill,
        tools: Vec<ToolSpec>,
        context: ContextStrategy,
        context_budget: Option<usize>,
    ) -> Result<Self, RuntimeError> {
        let catalog = ToolCatalog::new(tools)?;
        let read_only = skill.schema.declared_read_only_properties();
        let output_schema = Arc::new(step_output_schema(&skill.schema, catalog.specs()));
        let write_only = skillstate_core::write_only::mentions_write_only(&skill.definition.schema);
        Ok(Self {
            skill,
            catalog,
            read_only,
            context,
            context_budget,
            write_only,
            output_schema,
            board: None,
        })
    }

    /// Why this task's prompts and answers never go into a span, whatever
    /// `capture_content` says: write-only values in its state, or a board (whose schemas may
    /// have some).
    pub(crate) fn content_withheld(&self) -> Option<&'static str> {
        if self.write_only {
            Some("write_only")
        } else if self.board.is_some() {
            Some("board")
        } else {
            None
        }
    }

    /// Attaches the task's board: its prompts show it at `/board`, and the answer form lets
    /// the patch write there.
    pub(crate) fn attach(&mut self, board: crate::board::BoardFrame) {
        let mut schema = (*self.output_schema).clone();
        if let Some(Value::Object(properties)) =
            schema.pointer_mut("/properties/state_patch/properties")
        {
            properties.insert(
                skillstate_core::board::MOUNT.to_owned(),
                serde_json::json!({
                    "type": "object",
                    "description": "A merge patch of the board, within the skill's [board] writes."
                }),
            );
        }
        self.output_schema = Arc::new(schema);
        self.board = Some(board);
    }

    pub fn skill(&self) -> &Skill {
        &self.skill
    }

    /// The tools offered, control actions last.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.catalog
    }

    /// The JSON Schema of a whole step answer (what constrained decoding uses).
    pub fn output_schema(&self) -> &Arc<Value> {
        &self.output_schema
    }

    /// The prompt of a step: the one function every runner and every rebuilt prompt uses.
    pub fn prompt(
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
    // The skill version the step ran on: the newest that began at it or before (an upgrade's
    // own step begins its version; steps before it rebuild with the one they ran on).
    let versions = store.task_versions(&task.id).await?;
    let ran = versions.iter().rev().find(|v| v.from_step <= step);
    let earlier;
    let task = match ran {
        Some(version)
            if version.hash != skillstate_store::spec_hash_of(&task.skill, &task.tools) =>
        {
            let change = store.skill_version(&version.hash).await?;
            earlier = TaskRecord {
                skill: change.skill,
                tools: change.tools,
                ..task.clone()
            };
            &earlier
        }
        _ => task,
    };
    let frame = TaskFrame::new(task)?;
    let journal = store.journal(&task.id).await?;
    let (recorded_hash, board_version) = journal
        .iter()
        .find(|e| e.step == step && e.attempt == attempt)
        .map(|e| (e.prompt_hash.clone(), e.board_version))
        .ok_or_else(|| RuntimeError::StoredTask {
            task: task.id.clone(),
            message: format!("the journal has no attempt {attempt} at step {step}"),
        })?;
    let mut state = state_at(store, &task.id, step - 1, task.version).await?;
    // A board member's prompt showed the board at the version recorded with the attempt.
    if let Some(version) = board_version {
        let scope = frame.skill.settings().board.clone();
        if let Some(board) = crate::board::BoardFrame::of(store, task, scope.as_ref()).await? {
            let shown = skillstate_store::board_state_at(store, &board.id, version).await?;
            state = skillstate_core::board::mounted_view(&state, &shown, &board.scope);
        }
    }
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
        turns_from(store, &task.id, journal, step - 1).await?
    } else {
        Vec::new()
    };
    Ok((
        frame.prompt(&state, &observation, &retry, &turns),
        recorded_hash,
    ))
}

/// The accepted steps up to `up_to` as transcript turns, from the task's journal (read by the
/// caller, once), its observations and its action results.
pub(crate) async fn turns_from(
    store: &dyn Store,
    task: &str,
    journal: Vec<JournalEntry>,
    up_to: u64,
) -> Result<Vec<Turn>, RuntimeError> {
    let observations: BTreeMap<u64, String> = store.observations(task).await?.into_iter().collect();
    let results: BTreeMap<u64, Option<String>> = store
        .intents(task)
        .await?
        .into_iter()
        .map(|i| (i.step, i.result))
        .collect();
    Ok(journal
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

pub(crate) fn rejections_of(entry: &JournalEntry) -> Vec<Rejection> {
    entry
        .errors
        .as_ref()
        .and_then(|e| serde_json::from_value(e.clone()).ok())
        .unwrap_or_default()
}
