//! Benchmark environments (SkillExecBench-style, see BENCHMARK.md) and the registry that builds
//! a skill's environment from its `[environment]` settings.

pub mod noise;
pub mod oracle;
mod params;
pub mod repository;
pub mod rng;
pub mod warehouse;

use skillstate_core::skill::EnvironmentSettings;
use skillstate_tools::{Environment, EnvironmentError};

/// Names of the built-in environments.
pub const ENVIRONMENTS: &[&str] = &[warehouse::KIND, repository::KIND];

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
        repository::KIND => Ok(Box::new(repository::Repository::new(
            repository::RepositoryConfig::from_params(&settings.params)?,
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
