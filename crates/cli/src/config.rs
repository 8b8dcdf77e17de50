//! `skillstate.toml`: model settings, prices, MCP servers, the approval policy and store
//! options. Secrets never live here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use skillstate_providers::{Price, ProviderSettings, Usage};
use skillstate_tools::builtin::{ProtectedPaths, SandboxConfig, SandboxLimits, SandboxMode};
use skillstate_tools::mcp::McpServerConfig;

pub const CONFIG_FILE: &str = "skillstate.toml";

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub model: ProviderSettings,
    /// Prices by model spec (`[prices."openai:gpt-4.1-mini"]`). No built-in prices: they go stale.
    pub prices: BTreeMap<String, Price>,
    pub mcp: McpConfig,
    pub tools: ToolsConfig,
    /// `[store]`: `snapshot_every = 100`, `lease_secs = 30`, `transaction_pooler = true`,
    /// `max_connections = 16`.
    pub store: skillstate_store::StoreOptions,
    pub secrets: SecretsConfig,
    /// `[telemetry]`: OpenTelemetry traces over OTLP/HTTP (off unless an endpoint is given).
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// Where this process keeps its files (not read from the file: `--data-dir`, `--db` and
    /// the configuration's own path, set by [`load_config`]).
    #[serde(skip)]
    pub site: Site,
}

/// The data directory (default `.skillstate`): the database directory `db/` (unless `--db`
/// names another database) and `work/`, where each task that names no work directory of the
/// operator's gets one of its own.
pub const DEFAULT_DATA_DIR: &str = ".skillstate";

/// Where this process keeps its files, and which of them no confined root may reach.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Site {
    pub data_dir: PathBuf,
    /// The runtime's own files: the database's directory, the configuration file.
    pub protected: ProtectedPaths,
}

/// The data directory and database of this process, set once by `main` before any command
/// loads its configuration.
static PROCESS_SITE: std::sync::OnceLock<(PathBuf, String)> = std::sync::OnceLock::new();

/// Records the data directory and the database location every later [`load_config`] attaches.
pub fn set_process_site(data_dir: PathBuf, db: String) {
    let _ = PROCESS_SITE.set((data_dir, db));
}

impl Site {
    /// The site of a process with `data_dir`, database `db` (as `--db` takes it) and
    /// configuration file `config_file`.
    pub fn new(data_dir: &Path, db: &str, config_file: Option<&Path>) -> Self {
        let mut protected = ProtectedPaths::nothing();
        if let Some(file) = skillstate_store::database_file(db) {
            let dir = match file.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
                _ => PathBuf::from("."),
            };
            protected.add(
                &dir,
                "the database directory (its -wal, -shm and -journal files too)",
            );
        }
        if let Some(file) = config_file {
            protected.add(file, "the configuration file");
        }
        Self {
            data_dir: data_dir.to_path_buf(),
            protected,
        }
    }

    /// Where tasks' own work directories are made.
    pub fn work_parent(&self) -> PathBuf {
        self.data_dir.join("work")
    }
}

/// `[secrets]`: environment variables whose values are secret, besides the model's API key.
/// Their values are replaced with `[redacted]` in everything skillstate stores or prints.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    pub env: Vec<String>,
}

/// Variables that hold model API keys unless `[model] api_key_env` names another.
const KEY_VARIABLES: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

impl Config {
    /// Every secret value this process can know of: the model API keys (the usual variables
    /// and `[model] api_key_env`) and the variables listed under `[secrets] env`.
    pub fn secrets(&self) -> skillstate_core::secrets::Redactor {
        let names = KEY_VARIABLES
            .iter()
            .map(|n| (*n).to_owned())
            .chain(self.model.api_key_env.clone())
            .chain(self.secrets.env.iter().cloned());
        skillstate_core::secrets::Redactor::new(names.filter_map(|name| std::env::var(name).ok()))
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// `[mcp.servers.NAME]`: servers started as child processes; their tools are `NAME.tool`.
    pub servers: BTreeMap<String, McpServerConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    pub policy: ApprovalPolicy,
    /// How `shell.exec` is confined: `"bubblewrap"` (default; it refuses to run where bwrap
    /// cannot make a sandbox) or `"off"` (unconfined, the operator's explicit choice). Only here,
    /// never in skill.toml: a skill cannot turn its sandbox off.
    pub sandbox: SandboxMode,
    /// Extra absolute paths sandboxed commands may read (`["/opt/toolchain"]`).
    pub sandbox_read_paths: Vec<PathBuf>,
    /// The bubblewrap binary (default: `bwrap` on PATH, then /usr/bin/bwrap).
    pub sandbox_bwrap: Option<PathBuf>,
    /// Processes at once in one sandbox (RLIMIT_NPROC in its user namespace; not enforced by
    /// the kernel when the runtime runs as root).
    pub sandbox_max_processes: u64,
    /// Address space of each sandboxed process, in bytes (RLIMIT_AS).
    pub sandbox_memory_bytes: u64,
    /// Largest file a sandboxed process may write, in bytes (RLIMIT_FSIZE).
    pub sandbox_max_file_bytes: u64,
    /// CPU seconds of each sandboxed process (RLIMIT_CPU).
    pub sandbox_cpu_secs: u64,
    /// Directories under which a skill's absolute `[tools] work_dir` may lie (the operator's
    /// choice; `serve`/`worker --work-root` and a batch file's `work_roots:` add to it). A skill
    /// naming any other absolute directory is refused by `validate` and at run time.
    pub work_roots: Vec<PathBuf>,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        let limits = SandboxLimits::default();
        Self {
            policy: ApprovalPolicy::default(),
            sandbox: SandboxMode::default(),
            sandbox_read_paths: Vec::new(),
            sandbox_bwrap: None,
            sandbox_max_processes: limits.max_processes,
            sandbox_memory_bytes: limits.memory_bytes,
            sandbox_max_file_bytes: limits.max_file_bytes,
            sandbox_cpu_secs: limits.cpu_secs,
            work_roots: Vec::new(),
        }
    }
}

impl Config {
    /// The sandbox settings `shell.exec` is built with.
    pub fn sandbox_config(&self) -> SandboxConfig {
        let tools = &self.tools;
        SandboxConfig {
            protected: self.site.protected.clone(),
            ..tools.sandbox_config()
        }
    }
}

impl ToolsConfig {
    /// The sandbox settings of this section alone (nothing protected: see
    /// [`Config::sandbox_config`]).
    fn sandbox_config(&self) -> SandboxConfig {
        SandboxConfig {
            protected: ProtectedPaths::nothing(),
            mode: self.sandbox,
            bwrap: self.sandbox_bwrap.clone(),
            read_paths: self.sandbox_read_paths.clone(),
            limits: SandboxLimits {
                max_processes: self.sandbox_max_processes,
                memory_bytes: self.sandbox_memory_bytes,
                max_file_bytes: self.sandbox_max_file_bytes,
                cpu_secs: self.sandbox_cpu_secs,
            },
            util_linux: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalPolicy {
    /// Tools (`files.write_file`, `shell.exec`) whose every call waits for `skillstate approve`.
    pub require_approval: Vec<String>,
    /// Also every MCP tool annotated destructive.
    pub approve_destructive: bool,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        Self {
            require_approval: Vec::new(),
            approve_destructive: true,
        }
    }
}

impl Config {
    /// Parses `skillstate.toml` text; errors name the file and line.
    pub fn from_toml(text: &str, file: &str) -> Result<Self, String> {
        if let Some(errors) = crate::limits::config_range_errors(text, file) {
            return Err(errors);
        }
        toml::from_str::<Config>(text).map_err(|e| {
            let Some(line) = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            else {
                return format!("{file}: {}", e.message());
            };
            // The line itself, so the message names the key whose value was refused.
            match text.lines().nth(line - 1).map(str::trim) {
                Some(shown) if !shown.is_empty() && shown.chars().count() <= 120 => {
                    format!("{file}:{line}: `{shown}`: {}", e.message())
                }
                _ => format!("{file}:{line}: {}", e.message()),
            }
        })
    }

    /// The estimated cost in USD of `usage` under `spec`, if a price is configured.
    pub fn cost(&self, spec: &str, usage: &Usage) -> Option<f64> {
        self.prices.get(spec).map(|price| price.cost(usage))
    }
}

/// Reads `path`, or ./skillstate.toml when it exists, or the defaults; with the site of this
/// process (its data directory, database and configuration file) attached.
pub fn load_config(path: Option<&Path>) -> Result<Config> {
    let path = match path {
        Some(path) => Some(path.to_path_buf()),
        None if Path::new(CONFIG_FILE).is_file() => Some(Path::new(CONFIG_FILE).to_path_buf()),
        None => None,
    };
    let mut config = match &path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Config::from_toml(&text, &path.display().to_string())
                .map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => Config::default(),
    };
    let (data_dir, db) = PROCESS_SITE.get().cloned().unwrap_or_else(|| {
        (
            PathBuf::from(DEFAULT_DATA_DIR),
            skillstate_store::DEFAULT_DB.to_owned(),
        )
    });
    // The default configuration file is protected even before it exists: a command must not
    // be able to create it inside a work directory.
    let config_file = path.unwrap_or_else(|| PathBuf::from(CONFIG_FILE));
    config.site = Site::new(&data_dir, &db, Some(&config_file));
    Ok(config)
}

/// Opens the database named by `--db` for a command that only looks: nothing is created or
/// migrated (the `[store]` options do not matter for reading).
pub async fn open_existing(db: &str) -> Result<std::sync::Arc<dyn skillstate_store::Store>> {
    Ok(skillstate_store::open_existing(db, &skillstate_store::StoreOptions::default()).await?)
}

/// How a command's runner leases the tasks it drives: `[store] lease_secs`, and the command's
/// name so that a second process is told who holds the task.
pub fn lease_policy(config: &Config, command: &str) -> skillstate_runtime::LeasePolicy {
    skillstate_runtime::LeasePolicy {
        ttl: std::time::Duration::from_secs(config.store.lease_secs.max(1)),
        label: command.to_owned(),
    }
}

/// Creates `dir` and its missing parents, readable and writable by the owner only.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Opens the database named by `--db` with the `[store]` options of the configuration.
pub async fn open_store(
    db: &str,
    config: &Config,
) -> Result<std::sync::Arc<dyn skillstate_store::Store>> {
    if let Some(dir) =
        skillstate_store::database_file(db).and_then(|f| f.parent().map(Path::to_path_buf))
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        create_private_dir(&dir)
            .with_context(|| format!("cannot create the database directory {}", dir.display()))?;
    }
    Ok(skillstate_store::open_with(db, &config.store).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillstate_providers::Constrain;

    #[test]
    fn every_section_parses_and_bad_keys_name_their_line() {
        let config = Config::from_toml(
            "[model]\nspec = \"openai:m\"\nconstrain = \"json-object\"\n[prices.\"openai:m\"]\ninput = 2.0\noutput = 8.0\n\
             [mcp.servers.files]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-filesystem\", \"./data\"]\n\
             [tools.policy]\nrequire_approval = [\"files.write_file\", \"shell.exec\"]\n",
            CONFIG_FILE,
        )
        .unwrap();
        assert_eq!(config.model.constrain, Constrain::JsonObject);
        assert_eq!(config.mcp.servers["files"].args.len(), 3);
        assert_eq!(config.mcp.servers["files"].timeout_secs, 60);
        assert!(config.tools.policy.approve_destructive);
        assert_eq!(
            config.tools.policy.require_approval,
            ["files.write_file", "shell.exec"]
        );
        let error = Config::from_toml("[model]\napi_key = \"sk-123\"\n", CONFIG_FILE).unwrap_err();
        assert!(error.starts_with("skillstate.toml:2"), "{error}");
    }

    #[test]
    fn a_transaction_pooler_is_declared_under_store() {
        let defaults = Config::from_toml("", CONFIG_FILE).unwrap();
        assert!(!defaults.store.transaction_pooler);
        let config = Config::from_toml(
            "[store]\nlease_secs = 30\ntransaction_pooler = true\n",
            CONFIG_FILE,
        )
        .unwrap();
        assert!(config.store.transaction_pooler);
        assert_eq!(config.store.lease_secs, 30);
    }

    /// Every numeric setting (`CONFIG_RANGES`), given a string: the refusal names the file,
    /// the line and the key, whichever section it is in.
    #[test]
    fn a_value_of_the_wrong_type_is_named_by_its_key() {
        for range in crate::limits::CONFIG_RANGES {
            let path: Vec<&str> = range
                .key
                .split('.')
                .map(|part| if part == "*" { "x" } else { part })
                .collect();
            let (key, section) = path.split_last().unwrap();
            // An MCP server needs its command before any of its numbers.
            let extra = if section.first() == Some(&"mcp") {
                "command = \"npx\"\n"
            } else {
                ""
            };
            let text = format!("[{}]\n{extra}{key} = \"many\"\n", section.join("."));
            let line = 2 + extra.lines().count();
            let error = Config::from_toml(&text, CONFIG_FILE).unwrap_err();
            assert!(
                error.starts_with(&format!("skillstate.toml:{line}")) && error.contains(key),
                "{}: {error}",
                range.key
            );
        }
    }

    #[test]
    fn the_store_connection_count_is_set_under_store() {
        let defaults = Config::from_toml("", CONFIG_FILE).unwrap();
        assert_eq!(defaults.store.max_connections, None);
        let config = Config::from_toml(
            "[store]
max_connections = 64
",
            CONFIG_FILE,
        )
        .unwrap();
        assert_eq!(config.store.max_connections, Some(64));
        let error = Config::from_toml(
            "[store]
max_connections = \"many\"\n",
            CONFIG_FILE,
        )
        .unwrap_err();
        assert!(
            error.starts_with("skillstate.toml:2") && error.contains("max_connections"),
            "{error}"
        );
    }

    #[test]
    fn sandbox_limits_are_on_by_default_and_set_in_tools() {
        let defaults = Config::from_toml("", CONFIG_FILE).unwrap();
        assert_eq!(
            defaults.tools.sandbox_config().limits,
            SandboxLimits::default()
        );
        let config = Config::from_toml(
            "[tools]\nsandbox_max_processes = 64\nsandbox_memory_bytes = 536870912\nsandbox_max_file_bytes = 1048576\nsandbox_cpu_secs = 5\n",
            CONFIG_FILE,
        )
        .unwrap();
        assert_eq!(
            config.tools.sandbox_config().limits,
            SandboxLimits {
                max_processes: 64,
                memory_bytes: 536_870_912,
                max_file_bytes: 1_048_576,
                cpu_secs: 5,
            }
        );
        let error =
            Config::from_toml("[tools]\nsandbox_memory_bytes = 1024\n", CONFIG_FILE).unwrap_err();
        assert!(
            error.starts_with("skillstate.toml:2:") && error.contains("from 67108864 to"),
            "{error}"
        );
    }
}
