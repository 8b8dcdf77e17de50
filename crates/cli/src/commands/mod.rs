pub mod batch;
pub mod bench;
pub mod board;
pub mod keys;
pub mod lineage;
pub mod run;
pub mod say;
pub mod search;
pub mod serve;
pub mod show;
pub mod tasks;
pub mod tools;
pub mod upgrade;
pub mod validate;
pub mod view;
pub mod why;
pub mod worker;

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;
use skillstate_core::Skill;
use skillstate_core::skill::{EnvironmentSettings, LoadedSkill, Severity};
use skillstate_store::TaskRecord;
use skillstate_tools::{Environment, UserRequest};

use crate::config::Config;
use crate::toolbox::{self, Toolbox};

/// Loads a skill, printing warnings; errors come back as one message listing every problem.
pub fn load_skill(dir: &Path) -> Result<Skill> {
    let LoadedSkill { skill, warnings } =
        Skill::load(dir).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    for warning in warnings.iter().filter(|w| w.severity == Severity::Warning) {
        errln!("{warning}");
    }
    Ok(skill)
}

/// The world a task acts on, and the MCP servers to shut down afterwards.
pub struct World {
    pub env: Box<dyn Environment>,
    pub toolbox: Option<Toolbox>,
}

impl World {
    /// What to record as the task's environment, for a tool box.
    pub fn record(&self) -> Option<Value> {
        self.toolbox.as_ref().map(|t| t.record.clone())
    }

    pub async fn shutdown(&self) {
        if let Some(toolbox) = &self.toolbox {
            toolbox.shutdown().await;
        }
    }
}

/// The world a new task of `skill` runs in: its built-in environment, or the user's request
/// with the tools the skill allows.
pub async fn world_for(
    skill: &Skill,
    skill_dir: &Path,
    input: Option<&str>,
    work_dir_flag: Option<&Path>,
    config: &Config,
) -> Result<World> {
    toolbox::check_skill_paths(skill.settings(), config)
        .with_context(|| format!("{}", skill_dir.join("skill.toml").display()))?;
    match &skill.settings().environment {
        Some(settings) => {
            let takes_request = skillstate_envs::takes_request(&settings.kind);
            if input.is_some() && !takes_request {
                anyhow::bail!(
                    "skill `{}` runs in the `{}` environment, which supplies its own observations; drop --input",
                    skill.name(),
                    settings.kind
                );
            }
            // An environment that opens with the user's request gets it as a parameter (its
            // checkpoints carry it from then on).
            let mut settings = settings.clone();
            match input {
                Some(request) if !request.trim().is_empty() => {
                    settings
                        .params
                        .insert("request".into(), Value::String(request.to_owned()));
                }
                // An empty request: the world is only looked at (`skillstate tools`).
                Some(_) => {}
                None if takes_request && !settings.params.contains_key("request") => {
                    anyhow::bail!(
                        "skill `{}` runs in the `{}` environment, which opens with the user's request: pass --input \"...\"",
                        skill.name(),
                        settings.kind
                    );
                }
                None => {}
            }
            let env = skillstate_envs::build_environment(&settings)
                .context("skill.toml [environment]")?;
            Ok(World { env, toolbox: None })
        }
        None => {
            let request = input.with_context(|| {
                format!(
                    "skill `{}` has no [environment] in skill.toml, so the task needs a request: pass --input \"...\"",
                    skill.name()
                )
            })?;
            let place =
                toolbox::work_place(skill.settings(), Some(skill_dir), work_dir_flag, config)?;
            let toolbox = toolbox::build(skill.settings(), &place, config).await?;
            let env = Box::new(UserRequest::new(request).with_tools(toolbox.tools.clone()));
            Ok(World {
                env,
                toolbox: Some(toolbox),
            })
        }
    }
}

/// The world a stored task continues in, rebuilt from what it recorded. `for_replay` leaves
/// out side channels of simulations (the audit log) so replaying cannot touch them.
pub async fn world_of_task(task: &TaskRecord, config: &Config, for_replay: bool) -> Result<World> {
    let record = task.environment.clone().unwrap_or(Value::Null);
    if record.get("kind").and_then(Value::as_str) == Some(toolbox::KIND) {
        let toolbox = toolbox::rebuild(&record, &task.skill.settings, config).await?;
        let env = Box::new(UserRequest::new(String::new()).with_tools(toolbox.tools.clone()));
        return Ok(World {
            env,
            toolbox: Some(toolbox),
        });
    }
    if record.is_null() {
        return Ok(World {
            env: Box::new(UserRequest::new(String::new())),
            toolbox: None,
        });
    }
    let mut settings: EnvironmentSettings =
        serde_json::from_value(record).context("the task's stored environment settings")?;
    if for_replay {
        settings.params.remove("audit_log");
    }
    Ok(World {
        env: skillstate_envs::build_environment(&settings)?,
        toolbox: None,
    })
}
