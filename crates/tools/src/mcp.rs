//! MCP servers over stdio as tool sources. All of the MCP SDK (rmcp) stays in this module:
//! its API changes between major versions, so the rest of skillstate sees only `Tool`s.
//!
//! Results and tool lists are read through their JSON form rather than the SDK's Rust types,
//! which keeps this adapter small and tolerant of protocol additions.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use skillstate_core::{SideEffect, ToolSpec};
use tokio::sync::Mutex;

use crate::{CallContext, Tool, ToolError, ToolOutput};

/// `[mcp.servers.NAME]` in skillstate.toml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables for the server process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of the server process.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Longest one tool call may take, in seconds.
    #[serde(default = "default_call_timeout")]
    pub timeout_secs: u64,
    /// Longest start-up and tool listing may take, in seconds.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_secs: u64,
    /// Side-effect class per tool (by its name on the server), overriding its annotations.
    #[serde(default)]
    pub side_effects: BTreeMap<String, SideEffect>,
}

fn default_call_timeout() -> u64 {
    60
}

fn default_start_timeout() -> u64 {
    30
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("MCP server `{server}`: cannot start `{command}`: {message}")]
    Spawn {
        server: String,
        command: String,
        message: String,
    },
    #[error("MCP server `{server}`: {message}")]
    Protocol { server: String, message: String },
    #[error("MCP server `{server}`: no answer within {seconds} s during {during}")]
    Timeout {
        server: String,
        seconds: u64,
        during: String,
    },
}

/// One connected server.
pub struct McpServer {
    name: String,
    client: Mutex<Option<RunningService<RoleClient, ()>>>,
    call_timeout: Duration,
    stderr: StderrTail,
}

/// Lines of server stderr kept for error messages, and the longest line kept.
const STDERR_LINES: usize = 5;
const STDERR_LINE_BYTES: usize = 1000;
/// How long a failure waits for the server's stderr to reach its end before quoting it.
const STDERR_SETTLE: Duration = Duration::from_secs(2);

/// The last lines a server wrote to stderr, quoted when it fails (Python's "No module named
/// …", a missing configuration file, ...).
struct StderrTail {
    lines: Arc<std::sync::Mutex<VecDeque<Outside>>>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl StderrTail {
    fn start(stderr: Option<tokio::process::ChildStderr>) -> Self {
        let lines = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        let reader = stderr.map(|stderr| tokio::spawn(keep_tail(stderr, Arc::clone(&lines))));
        Self {
            lines,
            reader: Mutex::new(reader),
        }
    }

    /// `"; its last stderr line: …"`, or nothing if it wrote none. A server that just died
    /// may still have its last words in the pipe: this first waits, briefly, for the reader
    /// to reach the end of its stderr.
    async fn last_line_note(&self, secrets: &Redactor) -> String {
        let mut reader = self.reader.lock().await;
        if let Some(handle) = reader.as_mut()
            && tokio::time::timeout(STDERR_SETTLE, handle).await.is_ok()
        {
            *reader = None;
        }
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .back()
            .map(|line| format!("; its last stderr line: {}", line.redacted(secrets)))
            .unwrap_or_default()
    }
}

/// Keeps the last non-blank lines of `stderr`, each cut to `STDERR_LINE_BYTES`, whatever the
/// server writes (a line without end does not grow memory). A line is outside text until it is
/// quoted, redacted; one cut at the cap is kept as cut short.
async fn keep_tail(
    stderr: tokio::process::ChildStderr,
    tail: Arc<std::sync::Mutex<VecDeque<Outside>>>,
) {
    use tokio::io::AsyncBufReadExt;
    let push = |line: &[u8], cut: bool| {
        let line = if cut { line } else { line.trim_ascii_end() };
        let line = line.trim_ascii_start();
        if line.is_empty() {
            return;
        }
        let text = if cut {
            Outside::cut_short(line)
        } else {
            Outside::from_bytes(line)
        };
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        if tail.len() == STDERR_LINES {
            tail.pop_front();
        }
        tail.push_back(text);
    };
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf().await {
            Ok(chunk) if !chunk.is_empty() => chunk,
            _ => break,
        };
        let (end, complete) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        let room = STDERR_LINE_BYTES.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..end.min(room)]);
        cut |= end > room;
        reader.consume(if complete { end + 1 } else { end });
        if complete {
            push(&line, cut);
            line.clear();
            cut = false;
        }
    }
    push(&line, cut);
}

/// What a server offers, mapped to skillstate tools.
pub struct McpTool {
    spec: ToolSpec,
    remote_name: String,
    /// The server's annotations call it destructive.
    pub destructive: bool,
    server: Arc<McpServer>,
}

impl McpServer {
    /// Starts the server as a child process, initialises the session and lists its tools.
    pub async fn start(
        name: &str,
        config: &McpServerConfig,
    ) -> Result<(Arc<McpServer>, Vec<McpTool>), McpError> {
        Self::start_withholding(name, config, &Redactor::default()).await
    }

    /// [`McpServer::start`], its start-up errors quoting the server's stderr redacted of
    /// `secrets` (a tool call's errors use the secrets of its call).
    pub async fn start_withholding(
        name: &str,
        config: &McpServerConfig,
        secrets: &Redactor,
    ) -> Result<(Arc<McpServer>, Vec<McpTool>), McpError> {
        let mut command = tokio::process::Command::new(&config.command);
        command.args(&config.args).envs(&config.env);
        if let Some(cwd) = &config.cwd {
            command.current_dir(cwd);
        }
        let spawn_error = |message: String| McpError::Spawn {
            server: name.to_owned(),
            command: config.command.clone(),
            message,
        };
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| spawn_error(e.to_string()))?;
        let stderr = StderrTail::start(stderr);
        let start_timeout = Duration::from_secs(config.start_timeout_secs.max(1));
        let timeout = |during: &str| McpError::Timeout {
            server: name.to_owned(),
            seconds: start_timeout.as_secs(),
            during: during.to_owned(),
        };
        // A server that dies while starting usually says why on stderr: quote it.
        let failed = async |what: &str, error: String| McpError::Protocol {
            server: name.to_owned(),
            message: format!(
                "{what} failed: {}{}",
                Outside::new(error).redacted(secrets),
                stderr.last_line_note(secrets).await
            ),
        };
        let client = match tokio::time::timeout(start_timeout, ().serve(transport)).await {
            Err(_) => return Err(timeout("initialisation")),
            Ok(Err(e)) => return Err(failed("initialisation", e.to_string()).await),
            Ok(Ok(client)) => client,
        };
        let listed = match tokio::time::timeout(start_timeout, client.list_all_tools()).await {
            Err(_) => return Err(timeout("tools/list")),
            Ok(Err(e)) => return Err(failed("tools/list", e.to_string()).await),
            Ok(Ok(listed)) => listed,
        };
        let server = Arc::new(McpServer {
            name: name.to_owned(),
            client: Mutex::new(Some(client)),
            call_timeout: Duration::from_secs(config.timeout_secs.max(1)),
            stderr,
        });
        let tools = listed
            .iter()
            .filter_map(|tool| serde_json::to_value(tool).ok())
            .filter_map(|tool| McpTool::from_listing(&server, &tool, config))
            .collect();
        Ok((server, tools))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Closes the session and waits for the server to exit (killing it if it does not).
    pub async fn shutdown(&self) {
        if let Some(client) = self.client.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
        }
    }
}

impl McpTool {
    fn from_listing(
        server: &Arc<McpServer>,
        tool: &Value,
        config: &McpServerConfig,
    ) -> Option<McpTool> {
        let remote_name = tool.get("name")?.as_str()?.to_owned();
        let annotations = tool.get("annotations").cloned().unwrap_or(Value::Null);
        let hint = |key: &str| annotations.get(key).and_then(Value::as_bool);
        let side_effect = config.side_effects.get(&remote_name).copied().unwrap_or(
            if hint("readOnlyHint") == Some(true) {
                SideEffect::ReadOnly
            } else if hint("idempotentHint") == Some(true) {
                SideEffect::Idempotent
            } else {
                SideEffect::Effectful
            },
        );
        let mut input_schema = tool
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        if let Value::Object(schema) = &mut input_schema {
            schema
                .entry("type")
                .or_insert_with(|| Value::String("object".into()));
        }
        Some(McpTool {
            spec: ToolSpec {
                name: format!("{}.{remote_name}", server.name),
                description: tool
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("(no description)")
                    .to_owned(),
                input_schema,
                side_effect,
                source: server.name.clone(),
                needs_approval: false,
            },
            remote_name,
            // The MCP default: a tool that is not read-only may be destructive unless it says not.
            destructive: hint("readOnlyHint") != Some(true)
                && hint("destructiveHint") != Some(false),
            server: Arc::clone(server),
        })
    }
}

/// The observation text of a `tools/call` result.
fn result_text(result: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    for item in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        parts.push(match kind {
            "text" => item
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            "image" | "audio" => format!(
                "[{kind} {}, {} base64 characters]",
                item.get("mimeType").and_then(Value::as_str).unwrap_or("?"),
                item.get("data")
                    .and_then(Value::as_str)
                    .map(str::len)
                    .unwrap_or(0)
            ),
            "resource" => item
                .pointer("/resource/text")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    format!(
                        "[resource {}]",
                        item.pointer("/resource/uri")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                    )
                }),
            "resource_link" => format!(
                "[resource link {}]",
                item.get("uri").and_then(Value::as_str).unwrap_or("?")
            ),
            other => format!("[{other} content]"),
        });
    }
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null())
        && parts.is_empty()
    {
        parts.push(structured.to_string());
    }
    parts.join("\n")
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn own_time_limit(&self) -> Option<Duration> {
        Some(self.server.call_timeout)
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let failed = |message: String| ToolError::Failed {
            tool: self.spec.name.clone(),
            message,
        };
        let mut params = CallToolRequestParams::new(self.remote_name.clone());
        if let Value::Object(map) = args {
            params = params.with_arguments(map.clone());
        }
        let guard = self.server.client.lock().await;
        let Some(client) = guard.as_ref() else {
            return Err(failed(format!(
                "the MCP server `{}` was shut down",
                self.server.name
            )));
        };
        let call = tokio::time::timeout(self.server.call_timeout, client.call_tool(params)).await;
        let result = match call {
            Err(_) => {
                return Err(failed(format!(
                    "no answer from MCP server `{}` within {} s; the call may still complete on the server",
                    self.server.name,
                    self.server.call_timeout.as_secs()
                )));
            }
            Ok(Err(error)) => {
                let message = match error {
                    rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
                        let last = self.server.stderr.last_line_note(&ctx.secrets).await;
                        format!(
                            "the MCP server `{}` closed the connection (crashed or exited){last}",
                            self.server.name
                        )
                    }
                    other => format!(
                        "MCP server `{}`: {}",
                        self.server.name,
                        Outside::new(other.to_string()).redacted(&ctx.secrets)
                    ),
                };
                return Err(failed(message));
            }
            Ok(Ok(result)) => serde_json::to_value(&result).unwrap_or(Value::Null),
        };
        // The server's answer, redacted whole before anything (the observation's budget) cuts it.
        let text = Outside::new(result_text(&result)).redacted(&ctx.secrets);
        Ok(
            if result.get("isError").and_then(Value::as_bool) == Some(true) {
                ToolOutput::failure(format!("Error from {}: {text}", self.spec.name))
            } else {
                ToolOutput::success(text)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_become_text() {
        let result = json!({"content": [{"type": "text", "text": "hello"}, {"type": "image", "mimeType": "image/png", "data": "AAAA"}], "isError": false});
        assert_eq!(
            result_text(&result),
            "hello\n[image image/png, 4 base64 characters]"
        );
        assert_eq!(
            result_text(&json!({"content": [], "structuredContent": {"a": 1}})),
            "{\"a\":1}"
        );
    }
}
