use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde_json::Value;
use skillstate_core::board::{Pointer, ScopeList, join_problem, undeclared};
use skillstate_core::skill::{Severity, board_entries};
use skillstate_core::{Skill, StateSchema, ToolCatalog};
use skillstate_runtime::select_tools;

use super::board::read_json;
use crate::config::{CONFIG_FILE, load_config, open_existing};
use crate::toolbox::work_place;

pub async fn run(
    dir: &Path,
    config_path: Option<&Path>,
    db: &str,
    board: Option<&str>,
) -> Result<ExitCode> {
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
    let config = load_config(config_path)?;
    if let Err(error) = crate::toolbox::check_skill_paths(settings, &config) {
        outln!("error: {}: {error:#}", skill_toml.display());
        return Ok(ExitCode::FAILURE);
    }
    let names: Vec<String> = match &settings.environment {
        Some(environment) => {
            let env = match skillstate_envs::build_environment(environment) {
                Ok(env) => env,
                Err(error) => {
                    outln!("error: {}: {error}", skill_toml.display());
                    return Ok(ExitCode::FAILURE);
                }
            };
            let selected = match select_tools(
                &skillstate_runtime::available_tools(env.tools()),
                &settings.tools,
            ) {
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
            let mut problems = Vec::new();
            for entry in &settings.tools.allow {
                let source = entry.split('.').next().unwrap_or(entry);
                if !matches!(source, "fs" | "shell" | "recall")
                    && !config.mcp.servers.contains_key(source)
                {
                    problems.push(format!(
                        "[tools] allow lists `{entry}`, but `{source}` is neither a built-in tool set (fs, shell, recall) nor an MCP server under [mcp.servers] in {CONFIG_FILE}"
                    ));
                }
            }
            let uses_dir = settings
                .tools
                .allow
                .iter()
                .any(|e| e.starts_with("fs") || e.starts_with("shell"));
            if uses_dir && let Err(error) = work_place(settings, Some(dir), None, &config) {
                problems.push(format!("{error:#}"));
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
    let board_line = match board {
        Some(board) => {
            let (schema, origin) = board_schema(db, board).await?;
            let problems = board_problems(dir, &skill, &schema, &origin)?;
            if !problems.is_empty() {
                for problem in &problems {
                    outln!("error: {problem}");
                }
                outln!("{}: {} error(s)", dir.display(), problems.len());
                return Ok(ExitCode::FAILURE);
            }
            format!("\n  board: every [board] pointer names a part of {origin}")
        }
        None => String::new(),
    };
    let environment = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.clone())
        .unwrap_or_else(|| "none (the task input is the first observation)".into());
    outln!(
        "ok: skill `{}` is valid\n  tools: {}\n  environment: {environment}\n  state budget: {} tokens, observation budget: {} tokens{board_line}",
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

/// The board schema `board` names: a schema file, else a board of the database (by name or
/// id), with the words that name it in messages.
async fn board_schema(db: &str, board: &str) -> Result<(Value, String)> {
    let path = Path::new(board);
    if path.is_file() {
        let schema = read_json(path, "board schema")?;
        return Ok((schema, format!("the board schema {}", path.display())));
    }
    let store = open_existing(db).await.with_context(|| {
        format!("`{board}` is not a schema file, and the database {db} cannot be read to find a board of that name")
    })?;
    let record = store.board(board, None).await.with_context(|| {
        format!("`{board}` is neither a schema file nor a board in {db}; give the board's schema file or its name (skillstate board list)")
    })?;
    Ok((record.schema, format!("board `{}`'s schema", record.name)))
}

/// What keeps `skill` from working on a board with `schema`: a schema that is not usable, a
/// skill that cannot join, and each `[board]` pointer that names nothing in the schema, with
/// its line in skill.toml.
fn board_problems(dir: &Path, skill: &Skill, schema: &Value, origin: &str) -> Result<Vec<String>> {
    let skill_toml = dir.join("skill.toml");
    if let Err(defects) = StateSchema::compile_all(schema.clone()) {
        return Ok(defects
            .iter()
            .map(|d| {
                format!(
                    "{origin} is not usable at {}: {}",
                    pointer_text(&d.pointer),
                    d.message
                )
            })
            .collect());
    }
    let mut problems = Vec::new();
    if let Some(message) = join_problem(skill) {
        problems.push(format!("{}: {message}", skill_toml.display()));
        return Ok(problems);
    }
    let text = std::fs::read_to_string(&skill_toml)
        .with_context(|| format!("cannot read {}", skill_toml.display()))?;
    let Some((table, positions)) = board_entries(&text) else {
        return Ok(problems);
    };
    for (list, index, (line, column)) in positions {
        let entries = match list {
            ScopeList::Reads => &table.reads,
            ScopeList::Writes => &table.writes,
        };
        let Some(Ok(pointer)) = entries.get(index).map(|text| Pointer::parse(text)) else {
            continue;
        };
        if let Some(reason) = undeclared(schema, &pointer) {
            problems.push(format!(
                "{}:{line}:{column}: board.{}[{index}]: \"{pointer}\" names nothing in {origin}: {reason}; fix the pointer, or give the board the part it names",
                skill_toml.display(),
                list.as_str()
            ));
        }
    }
    Ok(problems)
}

fn pointer_text(pointer: &str) -> &str {
    if pointer.is_empty() {
        "(root)"
    } else {
        pointer
    }
}
