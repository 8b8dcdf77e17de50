//! Submitting a batch: every input becomes a task (checked against the skill first, so a bad
//! line is refused before anything is stored), spooled to a temporary file; then the batch and
//! its tasks are queued in one transaction, read back from the spool a chunk at a time.
//! Memory stays bounded whatever the number of tasks.

use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_core::{ContextStrategy, Skill, SkillDefinition, ToolSpec};
use skillstate_runtime::{TaskOptions, prepare_task};
use skillstate_store::{BatchRecord, NewBatch, NewTask, QueuedTask, Store};
use skillstate_tools::UserRequest;

use super::inputs::{TaskInput, stream_inputs};
use super::pin::{Directory, Pin, Pinner};
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

/// Every task of a batch file, checked and built, not stored yet: spooled, one JSON line per
/// task, to a temporary file that no path names (it goes away with the process), so a batch
/// of any size is held in bounded memory.
pub struct Prepared {
    batch: NewBatch,
    spool: std::fs::File,
    tenant: Option<String>,
}

/// One prepared task as the spool keeps it.
#[derive(Serialize, Deserialize)]
struct Spooled {
    skill: SkillDefinition,
    tools: Vec<ToolSpec>,
    context: ContextStrategy,
    context_budget: Option<usize>,
    model: String,
    environment: Option<Value>,
    env_checkpoint: Option<Value>,
    opening_observation: String,
    initial_state: Value,
    labels: Value,
}

impl Spooled {
    fn of(task: QueuedTask) -> Self {
        let NewTask {
            skill,
            tools,
            context,
            context_budget,
            model,
            environment,
            env_checkpoint,
            opening_observation,
        } = task.task;
        Self {
            skill,
            tools,
            context,
            context_budget,
            model,
            environment,
            env_checkpoint,
            opening_observation,
            initial_state: task.initial_state,
            labels: task.labels,
        }
    }

    fn queued(self, tenant: Option<String>) -> QueuedTask {
        QueuedTask {
            task: NewTask {
                skill: self.skill,
                tools: self.tools,
                context: self.context,
                context_budget: self.context_budget,
                model: self.model,
                environment: self.environment,
                env_checkpoint: self.env_checkpoint,
                opening_observation: self.opening_observation,
            },
            initial_state: self.initial_state,
            labels: self.labels,
            tenant,
        }
    }
}

impl Prepared {
    /// The tasks owned by `tenant` (`None`: by no tenant).
    pub fn for_tenant(mut self, tenant: Option<&str>) -> Self {
        self.tenant = tenant.map(str::to_owned);
        self
    }

    /// Creates the batch and queues its tasks in one transaction (`Queue::submit_batch`): a
    /// submit that fails or is killed half-way leaves neither the batch nor any task.
    pub async fn submit(self, store: &dyn Store) -> Result<Submitted> {
        let Prepared {
            batch,
            mut spool,
            tenant,
        } = self;
        spool
            .seek(SeekFrom::Start(0))
            .context("cannot read back the prepared tasks")?;
        let mut lines = BufReader::new(spool).lines();
        let mut feed = std::iter::from_fn(move || {
            let line = lines.next()?;
            // A kill here, with the transaction open, is what crash tests aim at.
            skillstate_tools::failpoint("submit_task");
            Some(
                line.map_err(|e| format!("cannot read back the prepared tasks: {e}"))
                    .and_then(|line| {
                        serde_json::from_str::<Spooled>(&line)
                            .map_err(|e| format!("cannot read back a prepared task: {e}"))
                    })
                    .map(|spooled| spooled.queued(tenant.clone())),
            )
        });
        let (batch, tasks) = store.submit_batch(&batch, &mut feed).await?;
        Ok(Submitted { batch, tasks })
    }
}

/// A temporary file no path names: created, then unlinked while open.
fn anonymous_file() -> Result<std::fs::File> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let path =
        std::env::temp_dir().join(format!("skillstate-submit-{}-{nanos}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("cannot create a temporary file in {}", path.display()))?;
    std::fs::remove_file(&path)
        .with_context(|| format!("cannot remove the temporary file {}", path.display()))?;
    Ok(file)
}

/// Reads and checks every input of `spec` against its skill. Inputs are read and tasks built
/// one at a time; the first bad input ends it with an error naming it. The database at
/// `location` is only read, and only when a line pins a skill version (`skill_version`, or
/// `default_pin` from `--skill-version` for lines without one) that the skill directory does
/// not hold.
pub async fn prepare(
    spec: &BatchSpec,
    config: &Config,
    location: &str,
    default_pin: Option<Pin>,
) -> Result<Prepared> {
    let skill = load_skill(&spec.skill)?;
    let mut config = config.clone();
    config
        .tools
        .work_roots
        .extend(spec.work_roots.iter().cloned());
    let config = &config;
    toolbox::check_skill_paths(skill.settings(), config)
        .with_context(|| format!("{}", spec.skill.join("skill.toml").display()))?;
    let inputs = stream_inputs(&spec.inputs)?;
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
            let place = toolbox::work_place(skill.settings(), Some(&spec.skill), None, config)?;
            Some(toolbox::build(skill.settings(), &place, config).await?)
        }
    };
    let directory = Directory {
        skill: &skill,
        environment: environment.as_ref(),
        toolbox: toolbox.as_ref(),
    };
    let mut pins = Pinner::new(
        config,
        location,
        spec.skill.display().to_string(),
        default_pin,
    );
    let spooled = async {
        let mut spool = Spool::new()?;
        for input in inputs {
            let task = pins.task(&directory, &options, &input?).await?;
            spool.push(task)?;
        }
        spool.finish()
    }
    .await;
    pins.close().await;
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
        spool: spooled?,
        tenant: None,
    })
}

/// Built tasks appended, one JSON line each, to a fresh temporary file.
struct Spool {
    out: BufWriter<std::fs::File>,
}

impl Spool {
    fn new() -> Result<Self> {
        Ok(Self {
            out: BufWriter::new(anonymous_file()?),
        })
    }

    fn push(&mut self, task: QueuedTask) -> Result<()> {
        serde_json::to_writer(&mut self.out, &Spooled::of(task))
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"))
            .context("cannot write the prepared tasks to a temporary file")
    }

    fn finish(self) -> Result<std::fs::File> {
        self.out
            .into_inner()
            .map_err(|e| e.into_error())
            .context("cannot write the prepared tasks to a temporary file")
    }
}

/// The task one input describes, without storing it.
pub(crate) fn prepare_one(
    skill: &Skill,
    environment: Option<&EnvironmentSettings>,
    toolbox: Option<&Toolbox>,
    options: &TaskOptions,
    input: &TaskInput,
) -> Result<QueuedTask> {
    let mut task = prepare_unlimited(skill, environment, toolbox, options, input)?;
    apply_limits(&mut task, input);
    Ok(task)
}

/// The task one input describes, before its own `limits` (which change its skill's settings,
/// so the version it runs).
pub(crate) fn prepare_unlimited(
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
    let task =
        prepare_task(skill, env.as_mut(), &options).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
    Ok(QueuedTask {
        task,
        initial_state,
        labels: Value::Object(input.labels.clone()),
        tenant: None,
    })
}

/// The input's own `limits`, in its task's skill settings.
pub(crate) fn apply_limits(task: &mut QueuedTask, input: &TaskInput) {
    if let Some(max_steps) = input.max_steps {
        task.task.skill.settings.run.max_steps = max_steps;
    }
    if let Some(max_retries) = input.max_retries {
        task.task.skill.settings.run.max_retries = max_retries;
    }
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
