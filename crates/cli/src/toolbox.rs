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

use crate::config::{CONFIG_FILE, Config, create_private_dir};

mod seed;

pub const KIND: &str = "toolbox";

/// Started tools; MCP servers must be shut down with `shutdown`.
pub struct Toolbox {
    pub tools: Vec<Arc<dyn Tool>>,
    pub servers: Vec<Arc<McpServer>>,
    /// What a task records so that `resume` can rebuild the same tool box.
    pub record: Value,
    /// Where the fs and shell tools work, when the skill allows either.
    pub work: Option<(WorkPlace, PathBuf)>,
}

fn wants(settings: &SkillSettings, source: &str) -> bool {
    settings.tools.allow.iter().any(|entry| {
        entry == source
            || entry
                .strip_prefix(source)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Where a task's fs and shell tools work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkPlace {
    /// A directory the operator chose (`--work-dir`, or a skill's absolute `[tools] work_dir`
    /// under one of the operator's work roots); every task that names it shares it.
    Shared(PathBuf),
    /// A directory of the task's own, `work/<name>` in the data directory of the process that
    /// runs it, made fresh on first use: empty, or a copy of `seed` (a directory inside the
    /// skill, named by a relative `[tools] work_dir`).
    Own { name: String, seed: Option<PathBuf> },
}

/// Where a new task's fs and shell tools work: `--work-dir` (the operator's), else the skill's
/// `[tools] work_dir` as far as the operator allows it, else a fresh directory of its own.
/// A skill may only narrow what the operator allowed: an absolute directory must lie under a
/// work root of the configuration, a relative one inside the skill (it seeds the task's own).
pub fn work_place(
    settings: &SkillSettings,
    skill_dir: Option<&Path>,
    flag: Option<&Path>,
    config: &Config,
) -> Result<WorkPlace> {
    if let Some(flag) = flag {
        let dir = flag
            .canonicalize()
            .with_context(|| format!("--work-dir {}: no such directory", flag.display()))?;
        return Ok(WorkPlace::Shared(dir));
    }
    let Some(named) = &settings.tools.work_dir else {
        return Ok(WorkPlace::Own {
            name: own_name(),
            seed: None,
        });
    };
    let named_path = Path::new(named);
    if named_path.is_absolute() {
        let dir = named_path.canonicalize().with_context(|| {
            format!("[tools] work_dir = \"{named}\": the directory does not exist")
        })?;
        under_work_roots(&dir, config)
            .map_err(|roots| anyhow::anyhow!("[tools] work_dir = \"{named}\" lies outside every work root the operator allows ({roots}). {NOT_THE_SKILLS}, or drop work_dir to give each task a fresh directory of its own"))?;
        return Ok(WorkPlace::Shared(dir));
    }
    let skill_dir = skill_dir.with_context(|| {
        format!("[tools] work_dir = \"{named}\" is relative to the skill directory, which is unknown here")
    })?;
    let seed = seed_dir(skill_dir, named)?;
    Ok(WorkPlace::Own {
        name: own_name(),
        seed: Some(seed),
    })
}

/// How a skill's author learns that a host path is the operator's to allow.
const NOT_THE_SKILLS: &str = "A skill cannot choose a host directory: the operator adds it to [tools] work_roots in skillstate.toml (or `serve --work-root`, a batch file's `work_roots:`)";

/// `Ok` when `path` (absolute, canonical where it exists) lies under one of the operator's work
/// roots; else the roots, for the message.
fn under_work_roots(path: &Path, config: &Config) -> Result<(), String> {
    let roots: Vec<PathBuf> = config
        .tools
        .work_roots
        .iter()
        .filter_map(|root| root.canonicalize().ok())
        .collect();
    if roots.iter().any(|root| path.starts_with(root)) {
        return Ok(());
    }
    Err(if roots.is_empty() {
        "none are configured".to_owned()
    } else {
        roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Checks the paths a skill's own `[environment]` names (settings such as `audit_log`, which
/// the environment writes to): like an absolute `work_dir`, each must lie under a work root of
/// the operator's and apart from the runtime's own files. The same settings given by the
/// operator (a batch input line, a flag) are the operator's own choice.
pub fn check_skill_paths(settings: &SkillSettings, config: &Config) -> Result<()> {
    let Some(environment) = &settings.environment else {
        return Ok(());
    };
    for key in skillstate_envs::operator_only_parameters() {
        let Some(value) = environment.params.get(key) else {
            continue;
        };
        let Some(named) = value.as_str() else {
            continue;
        };
        let path = std::path::absolute(named)
            .with_context(|| format!("[environment] {key} = \"{named}\""))?;
        let path = skillstate_tools::builtin::resolved_path(&path);
        if let Err(roots) = under_work_roots(&path, config) {
            bail!(
                "[environment] {key} = \"{named}\" lies outside every work root the operator allows ({roots}). {NOT_THE_SKILLS}, or drop {key} from skill.toml and let the operator set it"
            );
        }
        config
            .site
            .protected
            .check(&path, &format!("[environment] {key}"))
            .map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// The skill's seed directory `named` (relative), which must lie inside the skill directory.
fn seed_dir(skill_dir: &Path, named: &str) -> Result<PathBuf> {
    let outside = || {
        anyhow::anyhow!(
            "[tools] work_dir = \"{named}\" leads outside the skill directory {}: a relative work_dir names a directory inside the skill, copied into each task's own work directory",
            skill_dir.display()
        )
    };
    if Path::new(named)
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(outside());
    }
    let skill_dir = skill_dir
        .canonicalize()
        .with_context(|| format!("the skill directory {}", skill_dir.display()))?;
    let seed = skill_dir.join(named).canonicalize().with_context(|| {
        format!(
            "[tools] work_dir = \"{named}\": no such directory in {}",
            skill_dir.display()
        )
    })?;
    if !seed.starts_with(&skill_dir) {
        return Err(outside());
    }
    if !seed.is_dir() {
        bail!("[tools] work_dir = \"{named}\" is not a directory");
    }
    seed::check(&seed).map_err(|e| anyhow::anyhow!("[tools] work_dir = \"{named}\": {e}"))?;
    Ok(seed)
}

/// A fresh name for a task's own work directory: unique per process and time.
fn own_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    format!("{:x}-{:016x}", nanos / 1_000_000_000, hasher.finish())
}

impl WorkPlace {
    /// The directory itself, made (and seeded) on first use in `config`'s data directory.
    pub fn materialise(&self, config: &Config) -> Result<PathBuf> {
        match self {
            WorkPlace::Shared(dir) => Ok(dir.clone()),
            WorkPlace::Own { name, seed } => {
                if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
                    bail!("the task's work directory name `{name}` is not a plain name");
                }
                let parent = config.site.work_parent();
                create_private_dir(&parent).with_context(|| {
                    format!(
                        "cannot create the work directories' parent {}",
                        parent.display()
                    )
                })?;
                let dir = parent.join(name);
                if !dir.exists() {
                    seed::make_fresh(&dir, seed.as_deref())?;
                }
                Ok(dir)
            }
        }
    }

    /// What a task records so that `resume` finds the same place again.
    fn record(&self) -> Value {
        match self {
            WorkPlace::Shared(dir) => json!({ "work_dir": dir }),
            WorkPlace::Own { name, seed } => json!({ "own_work_dir": name, "seed": seed }),
        }
    }

    fn from_record(record: &Value) -> Result<Self> {
        if let Some(dir) = record.get("work_dir").and_then(Value::as_str) {
            return Ok(WorkPlace::Shared(PathBuf::from(dir)));
        }
        let name = record
            .get("own_work_dir")
            .and_then(Value::as_str)
            .context("the task's tool box has no work directory")?;
        Ok(WorkPlace::Own {
            name: name.to_owned(),
            seed: record
                .get("seed")
                .and_then(Value::as_str)
                .map(PathBuf::from),
        })
    }

    /// The same place for another task: a shared directory stays, an own one gets a new name.
    pub fn for_another_task(&self) -> Self {
        match self {
            WorkPlace::Shared(dir) => WorkPlace::Shared(dir.clone()),
            WorkPlace::Own { seed, .. } => WorkPlace::Own {
                name: own_name(),
                seed: seed.clone(),
            },
        }
    }
}

/// Starts every tool source the skill allows.
pub async fn build(
    settings: &SkillSettings,
    place: &WorkPlace,
    config: &Config,
) -> Result<Toolbox> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let needs_dir = wants(settings, "fs") || wants(settings, "shell");
    let mut work = None;
    let root = if needs_dir {
        let dir = place.materialise(config)?;
        let root = WorkDir::new(&dir, &config.site.protected).map_err(anyhow::Error::msg)?;
        work = Some((place.clone(), root.root().to_path_buf()));
        Some(root)
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
                    Sandbox::new(config.sandbox_config()),
                )
                .withholding(config.secrets()),
            ));
        }
    }
    let mut servers = Vec::new();
    let mut destructive: Vec<String> = Vec::new();
    let secrets = config.secrets();
    for (name, server_config) in &config.mcp.servers {
        if !wants(settings, name) {
            continue;
        }
        let started = McpServer::start_withholding(name, server_config, &secrets).await;
        let (server, server_tools) = match started {
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
    let mut record = json!({
        "kind": KIND,
        "mcp_servers": servers.iter().map(|s| s.name()).collect::<Vec<_>>(),
    });
    if let (Some(map), Value::Object(place)) = (record.as_object_mut(), place.record()) {
        map.extend(place);
    }
    Ok(Toolbox {
        tools,
        servers,
        record,
        work,
    })
}

/// Rebuilds the tool box a task recorded, for `resume`, `approve` and friends.
pub async fn rebuild(record: &Value, settings: &SkillSettings, config: &Config) -> Result<Toolbox> {
    build(settings, &WorkPlace::from_record(record)?, config).await
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

    /// The record of the same tool box for another task: a work directory of the operator's is
    /// shared, one of a task's own is another one (made when that task first runs).
    pub fn record_for_another_task(&self) -> Value {
        let mut record = self.record.clone();
        if let (Some((place, _)), Some(map)) = (&self.work, record.as_object_mut())
            && let Value::Object(other) = place.for_another_task().record()
        {
            map.extend(other);
        }
        record
    }

    /// Removes the work directory of the tool box's own, made only to look at its tools (a
    /// batch's tasks each get their own when they run; `skillstate tools` keeps none).
    pub fn discard_own_work_dir(&self) {
        if let Some((WorkPlace::Own { .. }, dir)) = &self.work {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
