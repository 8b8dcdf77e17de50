//! `shell.exec`: a command in the work directory, with a timeout, an output cap and only the
//! environment variables the skill allows.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
pub use skillstate_core::skill::ShellSettings;
use skillstate_core::{SideEffect, ToolSpec};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::confine::WorkDir;
use crate::{CallContext, Tool, ToolError, ToolOutput};

pub struct ShellTool {
    spec: ToolSpec,
    root: WorkDir,
    settings: ShellSettings,
}

impl ShellTool {
    pub fn new(root: &WorkDir, settings: ShellSettings) -> Self {
        Self {
            spec: ToolSpec {
                name: "shell.exec".into(),
                description: "Run a shell command (sh -c) in the work directory; the observation has its exit code, stdout and stderr.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"command": {"type": "string", "minLength": 1}},
                    "required": ["command"],
                    "additionalProperties": false
                }),
                side_effect: SideEffect::Effectful,
                source: "shell".into(),
                needs_approval: false,
            },
            root: root.clone(),
            settings,
        }
    }
}

/// Reads at most `cap` bytes and counts the rest.
async fn capped(mut stream: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, usize) {
    let mut kept = Vec::new();
    let mut dropped = 0;
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
                dropped += n.saturating_sub(room);
            }
        }
    }
}

fn section(name: &str, (bytes, dropped): (Vec<u8>, usize)) -> String {
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if dropped > 0 {
        text.push_str(&format!(
            "\n[{name} truncated: {dropped} more bytes not shown]"
        ));
    }
    text
}

#[async_trait]
impl Tool for ShellTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let command = args
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut process = tokio::process::Command::new("sh");
        process
            .arg("-c")
            .arg(command)
            .current_dir(self.root.root())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Its own process group, so that a timeout kills what it started too.
            .process_group(0);
        for name in &self.settings.env_allow {
            if let Ok(value) = std::env::var(name) {
                process.env(name, value);
            }
        }
        let mut child = process.spawn().map_err(|e| ToolError::Failed {
            tool: self.spec.name.clone(),
            message: format!("cannot start sh: {e}"),
        })?;
        let pid = child.id();
        let cap = self.settings.max_output_bytes;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let out_task = tokio::spawn(async move {
            match stdout {
                Some(s) => capped(s, cap).await,
                None => (Vec::new(), 0),
            }
        });
        let err_task = tokio::spawn(async move {
            match stderr {
                Some(s) => capped(s, cap).await,
                None => (Vec::new(), 0),
            }
        });
        let timeout = Duration::from_secs(self.settings.timeout_secs.max(1));
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                if let Some(pid) = pid {
                    let group = format!("-{pid}");
                    let _ = tokio::process::Command::new("kill")
                        .args(["-s", "KILL", "--", &group])
                        .status()
                        .await;
                }
                let _ = child.kill().await;
                None
            }
        };
        let stdout = section("stdout", out_task.await.unwrap_or_default());
        let stderr = section("stderr", err_task.await.unwrap_or_default());
        let (head, ok) = match status.and_then(|s| s.code()) {
            Some(code) => (format!("exit code {code}"), code == 0),
            None if status.is_none() => (
                format!("timed out after {} s and was killed", timeout.as_secs()),
                false,
            ),
            None => ("killed by a signal".to_owned(), false),
        };
        let text = format!("{head}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
        Ok(if ok {
            ToolOutput::success(text)
        } else {
            ToolOutput::failure(text)
        })
    }
}
