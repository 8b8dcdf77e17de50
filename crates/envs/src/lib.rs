//! Benchmark environments (SkillExecBench-style; docs/example-skills.md, "The example skills" and "Reproducing the
//! paper") and the registry that builds a skill's environment from its `[environment]` settings.

pub mod admin_panel;
pub mod bugfix;
pub mod noise;
pub mod oracle;
pub mod params;
pub mod repository;
pub mod rng;
pub mod warehouse;
pub mod warehouse_archive;

use serde_json::{Value, json};
use skillstate_core::skill::EnvironmentSettings;
use skillstate_core::{SideEffect, ToolSpec};
use skillstate_tools::{Environment, EnvironmentError};

/// A simulated world's lock. Every mutation of a world happens after its checks, so a world
/// whose lock was poisoned by a panicking thread is still consistent and is used as it is.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Names of the built-in environments.
pub const ENVIRONMENTS: &[&str] = &[
    warehouse::KIND,
    warehouse_archive::KIND,
    repository::KIND,
    admin_panel::KIND,
    bugfix::coder::KIND,
    bugfix::reviewer::KIND,
];

/// The documented `[environment]` parameters of a built-in environment kind (empty for an
/// unknown kind): one table per kind, read by the environment itself, by the service's request
/// policy and by the property tests.
pub fn parameters(kind: &str) -> &'static [params::ParamSpec] {
    match kind {
        warehouse::KIND => warehouse::PARAMETERS,
        warehouse_archive::KIND => warehouse_archive::PARAMETERS,
        repository::KIND => repository::PARAMETERS,
        admin_panel::KIND => admin_panel::PARAMETERS,
        bugfix::coder::KIND | bugfix::reviewer::KIND => bugfix::PARAMETERS,
        _ => &[],
    }
}

/// The parameters of any built-in environment that name a file on the host
/// ([`params::ParamKind::Path`]): only the operator sets them, in skill.toml.
pub fn operator_only_parameters() -> Vec<&'static str> {
    let mut keys: Vec<&'static str> = ENVIRONMENTS
        .iter()
        .flat_map(|kind| parameters(kind))
        .filter(|spec| spec.kind == params::ParamKind::Path)
        .map(|spec| spec.key)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Whether an environment opens its task with the user's request (`run --input`), which it
/// receives as its `request` parameter.
pub fn takes_request(kind: &str) -> bool {
    kind == admin_panel::KIND
}

/// The drift scenarios an environment offers, by name.
pub fn drift_scenarios(kind: &str) -> Vec<&'static str> {
    match kind {
        warehouse::KIND => warehouse::Drift::ALL.iter().map(|d| d.as_str()).collect(),
        _ => Vec::new(),
    }
}

/// Builds the built-in environment a skill asks for.
pub fn build_environment(
    settings: &EnvironmentSettings,
) -> Result<Box<dyn Environment>, EnvironmentError> {
    match settings.kind.as_str() {
        warehouse::KIND => Ok(Box::new(warehouse::Warehouse::new(
            warehouse::WarehouseConfig::from_params(&settings.params)?,
        ))),
        warehouse_archive::KIND => Ok(Box::new(warehouse_archive::WarehouseArchive::new(
            warehouse_archive::ArchiveConfig::from_params(&settings.params)?,
        ))),
        repository::KIND => Ok(Box::new(repository::Repository::new(
            repository::RepositoryConfig::from_params(&settings.params)?,
        ))),
        admin_panel::KIND => Ok(Box::new(admin_panel::AdminPanel::new(
            admin_panel::AdminPanelConfig::from_params(&settings.params)?,
        ))),
        bugfix::coder::KIND => Ok(Box::new(bugfix::coder::Coder::new(
            bugfix::BugfixConfig::from_params(bugfix::coder::KIND, &settings.params)?,
        ))),
        bugfix::reviewer::KIND => Ok(Box::new(bugfix::reviewer::Reviewer::new(
            bugfix::BugfixConfig::from_params(bugfix::reviewer::KIND, &settings.params)?,
        ))),
        other => Err(EnvironmentError::Config {
            kind: other.to_owned(),
            message: format!(
                "no built-in environment of this kind; known: {}",
                ENVIRONMENTS.join(", ")
            ),
        }),
    }
}

/// A tool of a built-in environment whose arguments are exactly `properties`, all required.
pub(crate) fn env_tool(
    source: &str,
    name: &str,
    description: &str,
    properties: Value,
    side_effect: SideEffect,
) -> ToolSpec {
    let required: Vec<&String> = properties
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false
        }),
        side_effect,
        source: source.into(),
        needs_approval: false,
    }
}
