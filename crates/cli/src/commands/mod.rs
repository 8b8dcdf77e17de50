pub mod bench;
pub mod lineage;
pub mod run;
pub mod show;
pub mod tasks;
pub mod validate;

use std::path::Path;

use anyhow::{Context, Result};
use skillstate_core::Skill;
use skillstate_core::skill::{LoadedSkill, Severity};
use skillstate_tools::{Environment, UserRequest};

/// Loads a skill, printing warnings; errors come back as one message listing every problem.
pub fn load_skill(dir: &Path) -> Result<Skill> {
    let LoadedSkill { skill, warnings } =
        Skill::load(dir).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    for warning in warnings.iter().filter(|w| w.severity == Severity::Warning) {
        eprintln!("{warning}");
    }
    Ok(skill)
}

/// The world a skill runs in: its built-in environment, or the user's request.
pub fn environment_for(skill: &Skill, input: Option<&str>) -> Result<Box<dyn Environment>> {
    match &skill.settings().environment {
        Some(settings) => {
            if input.is_some() {
                anyhow::bail!(
                    "skill `{}` runs in the `{}` environment, which supplies its own observations; drop --input",
                    skill.name(),
                    settings.kind
                );
            }
            skillstate_envs::build_environment(settings).context("skill.toml [environment]")
        }
        None => {
            let request = input.with_context(|| {
                format!(
                    "skill `{}` has no [environment] in skill.toml, so the task needs a request: pass --input \"...\"",
                    skill.name()
                )
            })?;
            Ok(Box::new(UserRequest::new(request)))
        }
    }
}
