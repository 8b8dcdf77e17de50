//! How skillstate acts on the world: the `Tool` trait, and `Environment`, the world a task runs
//! in (its tools, the observation that opens the task, and what happens after each action).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
pub use skillstate_core::{SideEffect, ToolSpec};

/// Passed to every tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallContext {
    pub task_id: String,
    pub step: u64,
    /// `<task id>:<step>`; stable across retries and resumes of the same step, so tools that
    /// accept an idempotency key can deduplicate.
    pub idempotency_key: String,
}

impl CallContext {
    pub fn new(task_id: &str, step: u64) -> Self {
        Self {
            task_id: task_id.to_owned(),
            step,
            idempotency_key: format!("{task_id}:{step}"),
        }
    }
}

/// What a tool call produced. `ok = false` is a failure the model should see and react to
/// (an occupied shelf, a missing file); it is not a runtime error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub ok: bool,
}

impl ToolOutput {
    pub fn success(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ok: true,
        }
    }

    pub fn failure(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ok: false,
        }
    }
}

/// A tool could not be called at all (crashed server, timeout). The runtime decides whether
/// that fails the task or becomes an observation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("tool `{0}` is not available in this environment")]
    Unknown(String),
    #[error("tool `{tool}` failed: {message}")]
    Failed { tool: String, message: String },
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError>;
}

/// Why an environment cannot be built or restored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvironmentError {
    #[error("environment `{kind}`: {message}")]
    Config { kind: String, message: String },
    #[error("cannot restore environment `{kind}` from its checkpoint: {message}")]
    Restore { kind: String, message: String },
}

/// The world one task acts on.
pub trait Environment: Send + Sync {
    fn kind(&self) -> &str;
    fn tools(&self) -> Vec<Arc<dyn Tool>>;
    /// The observation that opens the task (the first event, or the user's request).
    fn opening_observation(&mut self) -> String;
    /// Called after every executed action; returns the text that follows the tool's output in
    /// the next observation (the next event), or `None` when nothing new happened.
    fn after_action(&mut self) -> Option<String>;
    /// `true` once the world has nothing more for the agent to do.
    fn episode_over(&self) -> bool;
    /// A description of the outcome for the task record (a score, a summary).
    fn outcome(&self) -> Value;
    /// Everything needed to continue this world in another process.
    fn checkpoint(&self) -> Value;
    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError>;
}

/// Finds the tool named `name` among `tools`.
pub fn find_tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> Option<&'a Arc<dyn Tool>> {
    tools.iter().find(|t| t.spec().name == name)
}

/// The world of a skill without a built-in environment: no tools of its own, and the user's
/// request as the opening observation.
pub struct UserRequest {
    request: String,
}

impl UserRequest {
    pub fn new(request: impl Into<String>) -> Self {
        Self {
            request: request.into(),
        }
    }
}

impl Environment for UserRequest {
    fn kind(&self) -> &str {
        "user_request"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        Vec::new()
    }

    fn opening_observation(&mut self) -> String {
        self.request.clone()
    }

    fn after_action(&mut self) -> Option<String> {
        None
    }

    fn episode_over(&self) -> bool {
        false
    }

    fn outcome(&self) -> Value {
        Value::Null
    }

    fn checkpoint(&self) -> Value {
        Value::Null
    }

    fn restore(&mut self, _checkpoint: &Value) -> Result<(), EnvironmentError> {
        Ok(())
    }
}
