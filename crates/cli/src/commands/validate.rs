use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use skillstate_core::skill::Severity;
use skillstate_core::{Skill, ToolCatalog};
use skillstate_runtime::select_tools;

use crate::config::{CONFIG_FILE, load_config};
use crate::toolbox::work_dir;

pub fn run(dir: &Path, config_path: Option<&Path>) -> Result<ExitCode> {
    let loaded = match Skill::load(dir) {
        Ok(loaded) => loaded,
        Err(errors) => {
            for problem in &errors.problems {
                outln!("{problem}");
            }
            let count = errors
                .problems
                .iter()
                .filter(|p| p.severity == Severity::Error)
                .count();
            outln!("{}: {count} error(s)", dir.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    for warning in &loaded.warnings {
        outln!("{warning}");
    }
    let skill = loaded.skill;
    let settings = skill.settings();
    let skill_toml = dir.join("skill.toml");
    let names: Vec<String> = match &settings.environment {
        Some(environment) => {
            let env = match skillstate_envs::build_environment(environment) {
                Ok(env) => env,
                Err(error) => {
                    outln!("error: {}: {error}", skill_toml.display());
                    return Ok(ExitCode::FAILURE);
                }
            };
            let selected = match select_tools(&env.tools(), &settings.tools) {
                Ok(selected) => selected,
                Err(error) => {
                    outln!("error: {}: {error}", skill_toml.display());
                    return Ok(ExitCode::FAILURE);
                }
            };
            if let Err(error) =
                ToolCatalog::new(selected.iter().map(|t| t.spec().clone()).collect())
            {
                outln!("error: {}: {error}", skill_toml.display());
                return Ok(ExitCode::FAILURE);
            }
            selected.iter().map(|t| t.spec().name.clone()).collect()
        }
        None => {
            // Tool sources are checked without starting MCP servers; `skillstate tools` starts them.
            let config = load_config(config_path)?;
            let mut problems = Vec::new();
            for entry in &settings.tools.allow {
                let source = entry.split('.').next().unwrap_or(entry);
                if !matches!(source, "fs" | "shell") && !config.mcp.servers.contains_key(source) {
                    problems.push(format!(
                        "[tools] allow lists `{entry}`, but `{source}` is neither a built-in tool set (fs, shell) nor an MCP server under [mcp.servers] in {CONFIG_FILE}"
                    ));
                }
            }
            let uses_dir = settings
                .tools
                .allow
                .iter()
                .any(|e| e.starts_with("fs") || e.starts_with("shell"));
            if uses_dir && let Err(error) = work_dir(settings, Some(dir), None) {
                problems.push(format!("[tools] work_dir: {error:#}"));
            }
            if !problems.is_empty() {
                for problem in problems {
                    outln!("error: {}: {problem}", skill_toml.display());
                }
                return Ok(ExitCode::FAILURE);
            }
            settings.tools.allow.clone()
        }
    };
    let environment = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.clone())
        .unwrap_or_else(|| "none (the task input is the first observation)".into());
    outln!(
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
