//! The tools of a skill without a built-in environment: the built-in file and shell tools in a
//! work directory, and MCP servers from skillstate.toml — each only if the skill allows it —
//! with the approval policy applied.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use skillstate_core::skill::SkillSettings;
use skillstate_tools::builtin::{Sandbox, ShellTool, WorkDir, fs_tools};
use skillstate_tools::mcp::McpServer;
use skillstate_tools::{Tool, WithPolicy};

use crate::config::{CONFIG_FILE, Config};

pub const KIND: &str = "toolbox";

/// Started tools; MCP servers must be shut down with `shutdown`.
pub struct Toolbox {
    pub tools: Vec<Arc<dyn Tool>>,
    pub servers: Vec<Arc<McpServer>>,
    /// What a task records so that `resume` can rebuild the same tool box.
    pub record: Value,
}

fn wants(settings: &SkillSettings, source: &str) -> bool {
    settings.tools.allow.iter().any(|entry| {
        entry == source
            || entry
                .strip_prefix(source)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Where the fs and shell tools work: `--work-dir`, else `[tools] work_dir` relative to the
/// skill directory, else the current directory.
pub fn work_dir(
    settings: &SkillSettings,
    skill_dir: Option<&Path>,
    flag: Option<&Path>,
) -> Result<PathBuf> {
    let dir = match (flag, &settings.tools.work_dir, skill_dir) {
        (Some(flag), _, _) => flag.to_path_buf(),
        (None, Some(relative), Some(skill_dir)) => skill_dir.join(relative),
        (None, Some(relative), None) => PathBuf::from(relative),
        (None, None, _) => PathBuf::from("."),
    };
    dir.canonicalize()
        .with_context(|| format!("the work directory {} does not exist", dir.display()))
}

/// Starts every tool source the skill allows.
pub async fn build(settings: &SkillSettings, work_dir: &Path, config: &Config) -> Result<Toolbox> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let needs_dir = wants(settings, "fs") || wants(settings, "shell");
    let root = if needs_dir {
        Some(WorkDir::new(work_dir).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    if let Some(root) = &root {
        if wants(settings, "fs") {
            tools.extend(
                fs_tools(root)
                    .into_iter()
                    .map(|t| Arc::new(t) as Arc<dyn Tool>),
            );
        }
        if wants(settings, "shell") {
            tools.push(Arc::new(
                ShellTool::with_sandbox(
                    root,
                    settings.tools.shell.clone(),
                    Sandbox::new(config.tools.sandbox_config()),
                )
                .withholding(config.secrets()),
            ));
        }
    }
    let mut servers = Vec::new();
    let mut destructive: Vec<String> = Vec::new();
    for (name, server_config) in &config.mcp.servers {
        if !wants(settings, name) {
            continue;
        }
        let (server, server_tools) = match McpServer::start(name, server_config).await {
            Ok(started) => started,
            Err(error) => {
                shutdown_all(&servers).await;
                return Err(error.into());
            }
        };
        servers.push(server);
        for tool in server_tools {
            if tool.destructive {
                destructive.push(tool.spec().name.clone());
            }
            tools.push(Arc::new(tool));
        }
    }
    for entry in &settings.tools.allow {
        let source = entry.split('.').next().unwrap_or(entry);
        if !matches!(source, "fs" | "shell") && !config.mcp.servers.contains_key(source) {
            shutdown_all(&servers).await;
            bail!(
                "skill.toml [tools] allow lists `{entry}`, but `{source}` is neither a built-in tool set (fs, shell) nor an MCP server under [mcp.servers] in {CONFIG_FILE}"
            );
        }
    }
    let policy = &config.tools.policy;
    let tools = tools
        .into_iter()
        .map(|tool| {
            let name = tool.spec().name.clone();
            let approval = policy.require_approval.contains(&name)
                || (policy.approve_destructive && destructive.contains(&name));
            Arc::new(WithPolicy::new(tool, approval)) as Arc<dyn Tool>
        })
        .collect();
    let record = json!({
        "kind": KIND,
        "work_dir": work_dir,
        "mcp_servers": servers.iter().map(|s| s.name()).collect::<Vec<_>>(),
    });
    Ok(Toolbox {
        tools,
        servers,
        record,
    })
}

/// Rebuilds the tool box a task recorded, for `resume`, `approve` and friends.
pub async fn rebuild(record: &Value, settings: &SkillSettings, config: &Config) -> Result<Toolbox> {
    let work_dir = record
        .get("work_dir")
        .and_then(Value::as_str)
        .context("the task's tool box has no work directory")?;
    build(settings, Path::new(work_dir), config).await
}

async fn shutdown_all(servers: &[Arc<McpServer>]) {
    for server in servers {
        server.shutdown().await;
    }
}

impl Toolbox {
    pub async fn shutdown(&self) {
        shutdown_all(&self.servers).await;
    }
}
