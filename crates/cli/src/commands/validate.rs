use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use skillstate_core::skill::Severity;
use skillstate_core::{Skill, ToolCatalog};
use skillstate_runtime::select_tools;

pub fn run(dir: &Path) -> Result<ExitCode> {
    let loaded = match Skill::load(dir) {
        Ok(loaded) => loaded,
        Err(errors) => {
            for problem in &errors.problems {
                println!("{problem}");
            }
            let count = errors
                .problems
                .iter()
                .filter(|p| p.severity == Severity::Error)
                .count();
            println!("{}: {count} error(s)", dir.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    for warning in &loaded.warnings {
        println!("{warning}");
    }
    let skill = loaded.skill;
    let tools = match &skill.settings().environment {
        Some(settings) => {
            let env = match skillstate_envs::build_environment(settings) {
                Ok(env) => env,
                Err(error) => {
                    println!("error: {}: {error}", dir.join("skill.toml").display());
                    return Ok(ExitCode::FAILURE);
                }
            };
            env.tools()
        }
        None => Vec::new(),
    };
    let selected = match select_tools(&tools, &skill.settings().tools) {
        Ok(selected) => selected,
        Err(error) => {
            println!("error: {}: {error}", dir.join("skill.toml").display());
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Err(error) = ToolCatalog::new(selected.iter().map(|t| t.spec().clone()).collect()) {
        println!("error: {}: {error}", dir.join("skill.toml").display());
        return Ok(ExitCode::FAILURE);
    }
    let names: Vec<&str> = selected.iter().map(|t| t.spec().name.as_str()).collect();
    let environment = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.clone())
        .unwrap_or_else(|| "none (the task input is the first observation)".into());
    println!(
        "ok: skill `{}` is valid\n  tools: {}\n  environment: {environment}\n  state budget: {} tokens, observation budget: {} tokens",
        skill.name(),
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        },
        skill.settings().budgets.state_tokens,
        skill.settings().budgets.observation_tokens,
    );
    Ok(ExitCode::SUCCESS)
}
