//! The bugfix team's world: one seeded repository whose CI on main is red, worked on by two
//! agents that share a board (`boards/bugfix`) and nothing else. Each agent has an environment
//! of its own, built from the same seed, so both see the same code:
//!
//! - the coder ([`coder`], kind `bugfix_coder`) inspects a failing test, edits its working
//!   copy, runs that test, and proposes the change on the board;
//! - the reviewer ([`reviewer`], kind `bugfix_reviewer`) applies each proposed change to its
//!   own copy, runs the whole suite (a change that fixes nothing or breaks another test is
//!   refused and reverted), records its verdict on the board, and releases a patch version
//!   once the suite is green.
//!
//! A proposal reaches the reviewer only through the board: the two environments never share
//! memory. [`codebase`] holds the seeded code and its test suite.

pub mod codebase;
pub mod coder;
pub mod reviewer;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_tools::{
    CallContext, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use crate::params::{ParamSpec, Params};

/// The longest a `wait` call sleeps.
pub const MAX_WAIT_SECONDS: f64 = 10.0;

/// The seed and size of the repository both agents work on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BugfixConfig {
    pub seed: u64,
    /// Failing tests on main, one seeded bug each (1 to 5).
    pub bugs: u32,
    /// Tests in the suite (at least `bugs`; the others pass and must keep passing).
    pub tests: u32,
}

/// The `[environment]` parameters of both bug-fix environments (`tests` defaults to
/// `bugs + 3`).
pub const PARAMETERS: &[ParamSpec] = &[
    ParamSpec::whole("seed", 0, 0, u64::MAX),
    ParamSpec::whole("bugs", 3, 1, codebase::TEMPLATES.len() as u64),
    ParamSpec::whole("tests", 6, 1, codebase::NAMES.len() as u64),
];

impl BugfixConfig {
    pub fn new(seed: u64, bugs: u32) -> Self {
        Self {
            seed,
            bugs,
            tests: bugs + 3,
        }
    }

    pub fn from_params(kind: &str, params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let p = Params::new(kind, PARAMETERS, params);
        let seed = p.u64("seed")?;
        let bugs = p.u64("bugs")? as u32;
        let tests = p.u64_or("tests", u64::from(bugs) + 3)? as u32;
        p.finish()?;
        if tests < bugs {
            return Err(EnvironmentError::Config {
                kind: kind.to_owned(),
                message: format!(
                    "[environment] tests = {tests} is less than bugs = {bugs}; every bug fails a test of its own, so use tests >= bugs"
                ),
            });
        }
        Ok(Self { seed, bugs, tests })
    }
}

/// `wait {seconds}`: sleeps (at most [`MAX_WAIT_SECONDS`]) so that the other agent can move;
/// the board is read again for the next step's prompt.
pub(crate) struct WaitTool {
    spec: ToolSpec,
}

impl WaitTool {
    pub(crate) fn tool(kind: &str) -> Arc<dyn Tool> {
        Arc::new(Self {
            spec: crate::env_tool(
                kind,
                "wait",
                "Sleep for a while (seconds, at most 10) while the other agent works; the next step shows the board as it is then.",
                json!({"seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS}}),
                SideEffect::ReadOnly,
            ),
        })
    }
}

#[async_trait]
impl Tool for WaitTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let seconds = args
            .get("seconds")
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite())
            .unwrap_or(0.0)
            .clamp(0.0, MAX_WAIT_SECONDS);
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        Ok(ToolOutput::success(format!("Waited {seconds} s.")))
    }
}

/// A tool's answer: its text as a success, or as a failed call the model sees.
pub(crate) fn output(result: Result<String, String>) -> ToolOutput {
    match result {
        Ok(text) => ToolOutput::success(text),
        Err(text) => ToolOutput::failure(text),
    }
}

/// The text argument `key` of a tool call (schema-checked before the call).
pub(crate) fn text_arg(args: &Value, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The line argument of a tool call.
pub(crate) fn line_arg(args: &Value) -> u64 {
    args.get("line").and_then(Value::as_u64).unwrap_or(0)
}

pub(crate) fn test_schema() -> Value {
    json!({"type": "string", "pattern": "^tests::[a-z_]+$"})
}

pub(crate) fn file_schema() -> Value {
    json!({"type": "string", "pattern": "^src/[a-z_]+\\.rs$"})
}

pub(crate) fn code_schema() -> Value {
    json!({"type": "string", "maxLength": 200})
}

pub(crate) fn restore_error(kind: &str, e: serde_json::Error) -> EnvironmentError {
    EnvironmentError::Restore {
        kind: kind.into(),
        message: e.to_string(),
    }
}
