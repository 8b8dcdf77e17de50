//! How skillstate acts on the world: the `Tool` trait, and `Environment`, the world a task runs
//! in (its tools, the observation that opens the task, and what happens after each action).

pub mod builtin;
pub mod mcp;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::secrets::Redactor;
pub use skillstate_core::{SideEffect, ToolSpec};

/// Passed to every tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallContext {
    pub task_id: String,
    pub step: u64,
    /// `<task id>:<step>`; stable across retries and resumes of the same step, so tools that
    /// accept an idempotency key can deduplicate.
    pub idempotency_key: String,
    /// The runtime's secrets: a tool turns what it read from outside (a command's output, a
    /// file, a server's answer: an `Outside`) into its result through them, redacting before
    /// any cap cuts it.
    pub secrets: Arc<Redactor>,
}

impl CallContext {
    pub fn new(task_id: &str, step: u64) -> Self {
        Self {
            task_id: task_id.to_owned(),
            step,
            idempotency_key: format!("{task_id}:{step}"),
            secrets: Arc::default(),
        }
    }

    pub fn with_secrets(mut self, secrets: Arc<Redactor>) -> Self {
        self.secrets = secrets;
        self
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
    #[error(
        "tool `{tool}` gave no result within {secs} s and was abandoned; if it has effects, they may or may not have happened"
    )]
    TimedOut { tool: String, secs: u64 },
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError>;
    /// The tool's own bound on one call, if it has one (an MCP server's `timeout_secs`, the
    /// shell's `timeout_secs`). [`call_bounded`] then waits at least that long, plus
    /// [`OWN_LIMIT_GRACE`], so the tool's own, more precise timeout answers first.
    fn own_time_limit(&self) -> Option<Duration> {
        None
    }
}

/// The bound on one tool call when nothing else is configured.
pub const DEFAULT_CALL_LIMIT: Duration = Duration::from_secs(300);

/// Added to a tool's own time limit before the outer bound gives up on it.
pub const OWN_LIMIT_GRACE: Duration = Duration::from_secs(5);

/// Calls `tool`, giving up after `limit` (or the tool's own limit plus [`OWN_LIMIT_GRACE`], if
/// longer) with [`ToolError::TimedOut`]. The call's future is dropped then: the built-in file
/// tools stop their work at the next chunk; what a tool already did, or a server still does,
/// stays done.
pub async fn call_bounded(
    tool: &dyn Tool,
    args: &Value,
    ctx: &CallContext,
    limit: Duration,
) -> Result<ToolOutput, ToolError> {
    let limit = match tool.own_time_limit() {
        Some(own) => limit.max(own.saturating_add(OWN_LIMIT_GRACE)),
        None => limit,
    };
    match tokio::time::timeout(limit, tool.call(args, ctx)).await {
        Ok(result) => result,
        Err(_) => Err(ToolError::TimedOut {
            tool: tool.spec().name.clone(),
            // Whole seconds, rounded up: a sub-second limit still reads as "1 s".
            secs: limit.as_secs() + u64::from(limit.subsec_nanos() > 0),
        }),
    }
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
    /// Whether replaying recorded actions in a fresh instance reproduces the world exactly and
    /// touches nothing outside it (simulations with no file, process or network effects).
    /// Only then can a fork rebuild the world as it was at an earlier step, and a resumed task
    /// run the actions since the world's last checkpoint again.
    fn replayable(&self) -> bool {
        false
    }
}

/// Name of the environment variable that arms a failpoint: `NAME:N` kills this process with
/// SIGKILL the N-th time the failpoint NAME is reached (1-based). For crash testing only.
pub const FAILPOINT_ENV: &str = "SKILLSTATE_FAILPOINT";

/// Dies by SIGKILL here if `SKILLSTATE_FAILPOINT` names this point and its hit count is due.
/// Crash tests use it to stop a real process at an exact point (before the model call, after
/// the commit, inside a tool, ...) without any cooperation from the code around it.
pub fn failpoint(name: &str) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    static ARMED: Mutex<Option<Option<(String, u64)>>> = Mutex::new(None);
    static HITS: AtomicU64 = AtomicU64::new(0);
    let armed = {
        let mut guard = ARMED.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .get_or_insert_with(|| {
                let spec = std::env::var(FAILPOINT_ENV).ok()?;
                let (point, count) = spec.split_once(':')?;
                Some((point.to_owned(), count.parse().ok()?))
            })
            .clone()
    };
    let Some((point, count)) = armed else {
        return;
    };
    if point != name || HITS.fetch_add(1, Ordering::SeqCst) + 1 != count {
        return;
    }
    // A real SIGKILL, as an operator's `kill -9` or the OOM killer would send.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Finds the tool named `name` among `tools`.
pub fn find_tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> Option<&'a Arc<dyn Tool>> {
    tools.iter().find(|t| t.spec().name == name)
}

/// The world of a skill without a built-in environment: the user's request as the opening
/// observation, and whatever tools the skill was given (built-in file and shell tools, MCP
/// servers).
pub struct UserRequest {
    request: String,
    tools: Vec<Arc<dyn Tool>>,
}

impl UserRequest {
    pub fn new(request: impl Into<String>) -> Self {
        Self {
            request: request.into(),
            tools: Vec::new(),
        }
    }

    pub fn with_tools(mut self, tools: Vec<Arc<dyn Tool>>) -> Self {
        self.tools = tools;
        self
    }
}

/// A tool whose description the operator changed (today: whether it needs approval).
pub struct WithPolicy {
    inner: Arc<dyn Tool>,
    spec: ToolSpec,
}

impl WithPolicy {
    pub fn new(inner: Arc<dyn Tool>, needs_approval: bool) -> Self {
        let mut spec = inner.spec().clone();
        spec.needs_approval = needs_approval;
        Self { inner, spec }
    }
}

#[async_trait]
impl Tool for WithPolicy {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        self.inner.call(args, ctx).await
    }

    fn own_time_limit(&self) -> Option<Duration> {
        self.inner.own_time_limit()
    }
}

impl Environment for UserRequest {
    fn kind(&self) -> &str {
        "user_request"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
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
