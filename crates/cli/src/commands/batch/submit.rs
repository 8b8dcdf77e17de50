//! Submitting a batch: every input becomes a task (checked against the skill first, so a bad
//! line is refused before anything is stored), then the batch and its tasks are queued.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skillstate_core::Skill;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_runtime::{TaskOptions, prepare_task};
use skillstate_store::{BatchRecord, NewBatch, QueuedTask, Store};
use skillstate_tools::UserRequest;

use super::inputs::{TaskInput, read_inputs};
use super::spec::BatchSpec;
use crate::commands::load_skill;
use crate::config::Config;
use crate::model::build_model;
use crate::toolbox::{self, Toolbox};

/// A submitted batch and the ids of its tasks, in input order.
pub struct Submitted {
    pub batch: BatchRecord,
    pub tasks: Vec<String>,
}

/// Every task of a batch file, checked and built, not stored yet.
pub struct Prepared {
    batch: NewBatch,
    tasks: Vec<QueuedTask>,
}

impl Prepared {
    /// The tasks owned by `tenant` (`None`: by no tenant).
    pub fn for_tenant(mut self, tenant: Option<&str>) -> Self {
        for task in &mut self.tasks {
            task.tenant = tenant.map(str::to_owned);
        }
        self
    }

    /// Creates the batch and queues its tasks.
    pub async fn submit(self, store: &dyn Store) -> Result<Submitted> {
        let batch = store.create_batch(&self.batch).await?;
        let tasks = store.enqueue_tasks(&batch.id, self.tasks).await?;
        Ok(Submitted { batch, tasks })
    }
}

/// Reads and checks every input of `spec` against its skill, without touching a database.
pub async fn prepare(spec: &BatchSpec, config: &Config) -> Result<Prepared> {
    let skill = load_skill(&spec.skill)?;
    let mut config = config.clone();
    config
        .tools
        .work_roots
        .extend(spec.work_roots.iter().cloned());
    let config = &config;
    toolbox::check_skill_paths(skill.settings(), config)
        .with_context(|| format!("{}", spec.skill.join("skill.toml").display()))?;
    let inputs = read_inputs(&spec.inputs)?;
    let environment = skill.settings().environment.clone();
    let model = build_model(
        &spec.model,
        &config.model,
        environment.as_ref().map(|e| e.kind.as_str()),
    )
    .with_context(|| format!("{}: model", spec.file.display()))?;
    let options = TaskOptions {
        model: model.spec(),
        context: spec.context,
        context_budget: spec.budget,
        environment: None,
        secrets: config.secrets(),
    };
    // Skills without a built-in environment share one tool box: its record is what each task
    // rebuilds its tools from when a worker runs it.
    let toolbox = match &environment {
        Some(_) => None,
        None => {
            let mut config = config.clone();
            config
                .tools
                .work_roots
                .extend(spec.work_roots.iter().cloned());
            let place = toolbox::work_place(skill.settings(), Some(&spec.skill), None, &config)?;
            Some(toolbox::build(skill.settings(), &place, &config).await?)
        }
    };
    let prepared: Result<Vec<QueuedTask>> = inputs
        .iter()
        .map(|input| {
            prepare_one(
                &skill,
                environment.as_ref(),
                toolbox.as_ref(),
                &options,
                input,
            )
        })
        .collect();
    if let Some(toolbox) = &toolbox {
        toolbox.shutdown().await;
        toolbox.discard_own_work_dir();
    }
    Ok(Prepared {
        batch: NewBatch {
            name: spec.name(),
            spec: spec.to_value(),
            on_error: spec.on_error,
            max_retry: spec.max_retry,
            rate_limit: spec.rate_limit,
        },
        tasks: prepared?,
    })
}

/// The task one input describes, without storing it.
pub(crate) fn prepare_one(
    skill: &Skill,
    environment: Option<&EnvironmentSettings>,
    toolbox: Option<&Toolbox>,
    options: &TaskOptions,
    input: &TaskInput,
) -> Result<QueuedTask> {
    let at = &input.at;
    let mut options = options.clone();
    let mut env: Box<dyn skillstate_tools::Environment> = match (environment, toolbox) {
        (Some(settings), _) => {
            if input.input.is_some() {
                bail!(
                    "{at}: input: skill `{}` runs in the `{}` environment, which supplies its own observations; give `environment` parameters instead (inputs as a .jsonl file)",
                    skill.name(),
                    settings.kind
                );
            }
            let mut settings = settings.clone();
            for (key, value) in &input.environment {
                if key == "kind" {
                    bail!(
                        "{at}: environment.kind cannot change; the skill's [environment] decides it"
                    );
                }
                settings.params.insert(key.clone(), value.clone());
            }
            let env = skillstate_envs::build_environment(&settings)
                .map_err(|e| anyhow::anyhow!("{at}: environment: {e}"))?;
            options.environment = Some(serde_json::to_value(&settings)?);
            env
        }
        (None, Some(toolbox)) => {
            if !input.environment.is_empty() {
                bail!(
                    "{at}: environment: skill `{}` has no [environment] in skill.toml, so there are no environment parameters to set",
                    skill.name()
                );
            }
            let request = input.input.as_deref().with_context(|| {
                format!(
                    "{at}: skill `{}` has no [environment] in skill.toml, so each task needs an `input` (the request that opens it)",
                    skill.name()
                )
            })?;
            options.environment = Some(toolbox.record_for_another_task());
            Box::new(UserRequest::new(request).with_tools(toolbox.tools.clone()))
        }
        (None, None) => bail!("{at}: the skill has neither an environment nor tools"),
    };
    let initial_state = match &input.state {
        Some(state) => {
            check_state(skill, state).map_err(|e| anyhow::anyhow!("{at}: state{e}"))?;
            state.clone()
        }
        None => skill.definition.initial_state.clone(),
    };
    let mut task =
        prepare_task(skill, env.as_mut(), &options).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
    if let Some(max_steps) = input.max_steps {
        task.skill.settings.run.max_steps = max_steps;
    }
    if let Some(max_retries) = input.max_retries {
        task.skill.settings.run.max_retries = max_retries;
    }
    Ok(QueuedTask {
        task,
        initial_state,
        labels: Value::Object(input.labels.clone()),
        tenant: None,
    })
}

/// A task's own initial state must satisfy the schema and fit the state budget, as
/// state.init.json must. The error starts with the JSON pointer.
fn check_state(skill: &Skill, state: &Value) -> Result<(), String> {
    if let Some(problem) = skill.schema.violations(state).first() {
        let violation = problem.render(&skill.schema.whole_view());
        return Err(format!(
            "{}: does not satisfy the skill's state.schema.json: {}",
            violation.pointer, violation.message
        ));
    }
    let budget = skill.settings().budgets.state_tokens;
    let compact = serde_json::to_string(state).unwrap_or_default();
    if !skillstate_core::tokens::fits_in_tokens(&compact, budget) {
        return Err(format!(
            ": is over [budgets] state_tokens = {budget} of the skill; give a smaller state"
        ));
    }
    Ok(())
}
