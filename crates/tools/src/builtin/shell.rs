//! `shell.exec`: a command in the work directory, inside the OS sandbox (`sandbox.rs`), with a
//! timeout that bounds the whole call (process and output pipes), an output cap and only the
//! environment variables the skill allows.

use std::borrow::Cow;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
pub use skillstate_core::skill::ShellSettings;
use skillstate_core::{SideEffect, ToolSpec};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStderr, ChildStdout};
use tokio::time::Instant;

use super::confine::WorkDir;
use super::sandbox::{PROBE_TIMEOUT, Sandbox, SandboxMode};
use crate::{CallContext, Tool, ToolError, ToolOutput};

/// The longest timeout honoured (skill.toml's range for `timeout_secs`); a larger one set in
/// code is cut to it rather than overflowing a deadline.
const MAX_TIMEOUT_SECS: u64 = 86_400;

/// After a kill, how long the call still waits for the process to be reaped and for the
/// output already written to be read.
const AFTER_KILL: Duration = Duration::from_secs(2);

pub struct ShellTool {
    spec: ToolSpec,
    root: WorkDir,
    settings: ShellSettings,
    sandbox: Sandbox,
    secrets: Redactor,
}

impl ShellTool {
    /// Confined by bubblewrap found on PATH.
    pub fn new(root: &WorkDir, settings: ShellSettings) -> Self {
        Self::with_sandbox(root, settings, Sandbox::default())
    }

    pub fn with_sandbox(root: &WorkDir, settings: ShellSettings, sandbox: Sandbox) -> Self {
        let description = match (sandbox.mode(), settings.network) {
            (SandboxMode::Off, _) => {
                "Run a shell command (sh -c) in the work directory; the observation has its exit code, stdout and stderr."
            }
            (SandboxMode::Bubblewrap, false) => {
                "Run a shell command (sh -c) in the work directory, in a sandbox: only the work directory is writable, /tmp is private, there is no network, and every process it starts ends with it; the observation has its exit code, stdout and stderr."
            }
            (SandboxMode::Bubblewrap, true) => {
                "Run a shell command (sh -c) in the work directory, in a sandbox: only the work directory is writable, /tmp is private, and every process it starts ends with it; the observation has its exit code, stdout and stderr."
            }
        };
        Self {
            spec: ToolSpec {
                name: "shell.exec".into(),
                description: description.into(),
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
            sandbox,
            secrets: Redactor::default(),
        }
    }

    /// Secret values (the runtime's API keys, the operator's `[secrets]`) that never reach a
    /// command: a variable of `env_allow` whose value holds one is not passed, so a skill
    /// cannot hand the runtime's key to the commands it runs.
    pub fn withholding(mut self, secrets: Redactor) -> Self {
        self.secrets = secrets;
        self
    }

    /// The `env_allow` variables that are set but withheld because their values are secret.
    pub fn withheld_variables(&self) -> Vec<String> {
        self.settings
            .env_allow
            .iter()
            .filter(|name| std::env::var(name).is_ok_and(|value| self.is_secret(&value)))
            .cloned()
            .collect()
    }

    fn is_secret(&self, value: &str) -> bool {
        matches!(self.secrets.redact(value), Cow::Owned(_))
    }
}

impl ShellTool {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.settings.timeout_secs.clamp(1, MAX_TIMEOUT_SECS))
    }
}

/// At most `cap` bytes of one output stream, and how many more were dropped.
struct Captured {
    kept: Vec<u8>,
    dropped: usize,
    cap: usize,
}

impl Captured {
    fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            dropped: 0,
            cap,
        }
    }

    /// Reads until end of file. Cancel-safe: what was read stays in `self`, and a stream at its
    /// end is dropped so that a later call returns at once.
    async fn drain(&mut self, stream: &mut Option<impl AsyncRead + Unpin>) {
        let Some(reader) = stream.as_mut() else {
            return;
        };
        let mut buffer = [0u8; 8192];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&buffer[..n.min(room)]);
                    self.dropped += n.saturating_sub(room);
                }
            }
        }
        *stream = None;
    }

    /// The stream as the observation shows it: redacted, then cut to the cap (redaction may
    /// lengthen it). What was kept of a stream cut at the cap may end inside a secret; that
    /// piece is dropped with the rest (`Outside::cut_short`).
    fn section(&self, name: &str, secrets: &Redactor) -> String {
        let read = if self.dropped > 0 {
            Outside::cut_short(&self.kept)
        } else {
            Outside::from_bytes(&self.kept)
        };
        let clipped = read.clipped(secrets, self.cap);
        let mut text = clipped.text;
        if self.dropped > 0 {
            text.push_str(&format!(
                "\n[{name} truncated: {} more bytes not shown]",
                self.dropped
            ));
        } else if clipped.cut {
            // Redaction made it longer than the cap.
            text.push_str(&format!("\n[{name} truncated at {} bytes]", self.cap));
        }
        text
    }
}

/// How a run ended.
struct Ended {
    status: Option<ExitStatus>,
    /// Why a sandbox did not let its command start.
    not_started: Option<String>,
    timed_out: bool,
    stdout: Captured,
    stderr: Captured,
}

/// Kills the process group of an unconfined shell (whatever it left running in it).
async fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let group = format!("-{pid}");
        let kill = tokio::process::Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = tokio::time::timeout(AFTER_KILL, kill).await;
    }
}

/// Waits for `child` and reads its output, all within `timeout`; past it, kills it (and, under
/// the sandbox, with it every process it started) and keeps what was read.
async fn run_bounded(mut child: Child, cap: usize, timeout: Duration, confined: bool) -> Ended {
    let pid = child.id();
    let mut stdout: Option<ChildStdout> = child.stdout.take();
    let mut stderr: Option<ChildStderr> = child.stderr.take();
    let mut out = Captured::new(cap);
    let mut err = Captured::new(cap);
    let mut status = None;
    let mut not_started = None;
    let deadline = Instant::now() + timeout;
    let finished = tokio::time::timeout_at(deadline, async {
        if confined && let Some(out) = stdout.as_mut() {
            // The command starts only once the sandbox is sure to die with bwrap.
            not_started = super::launcher::release(&mut child, out).await.err();
        }
        let wait = async {
            status = child.wait().await.ok();
            if !confined {
                // Background jobs of an unconfined shell would hold the pipes open.
                kill_group(pid).await;
            }
        };
        tokio::join!(wait, out.drain(&mut stdout), err.drain(&mut stderr));
    })
    .await
    .is_ok();
    if !finished {
        // Under bwrap, killing it kills the shell, PID 1 of the sandbox (`--die-with-parent`),
        // which ends the whole PID namespace; the group also holds a sandbox still being set
        // up. (Only while bwrap is not reaped: its pid, the group's id, cannot be reused.)
        if !confined || status.is_none() {
            kill_group(pid).await;
        }
        let _ = child.start_kill();
        if status.is_none() {
            // Reaped only; the run's status stays "timed out".
            let _ = tokio::time::timeout(AFTER_KILL, child.wait()).await;
        }
        let _ = tokio::time::timeout(AFTER_KILL, async {
            tokio::join!(out.drain(&mut stdout), err.drain(&mut stderr));
        })
        .await;
    }
    Ended {
        status,
        not_started,
        timed_out: !finished,
        stdout: out,
        stderr: err,
    }
}

#[async_trait]
impl Tool for ShellTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The command's timeout plus what may come around it: the first call's check of the
    /// sandbox and the kill-and-drain steps after a timeout.
    fn own_time_limit(&self) -> Option<Duration> {
        Some(self.timeout() + PROBE_TIMEOUT + AFTER_KILL * 3)
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let command = args
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let failed = |message: String| ToolError::Failed {
            tool: self.spec.name.clone(),
            message,
        };
        let launch = self
            .sandbox
            .launch(self.root.root(), self.settings.network, command)
            .await
            .map_err(failed)?;
        let mut process = launch.command;
        process
            .env_clear()
            // Confined, the sandbox's first process reads `go` here (`launcher.rs`), then the
            // command reads end of file.
            .stdin(if launch.confined {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group: a Ctrl-C at the runtime's terminal (sent to the terminal's
        // foreground group) does not reach it, so a draining worker lets it finish; and unconfined,
        // a timeout kills the group, with what it started in it.
        process.process_group(0);
        // bwrap and the sandbox get nothing but the allowed variables.
        for name in &self.settings.env_allow {
            match std::env::var(name) {
                Ok(value) if !self.is_secret(&value) => {
                    process.env(name, value);
                }
                _ => {}
            }
        }
        let child = super::spawner::spawn(process)
            .await
            .map_err(|e| failed(format!("cannot start the shell: {e}")))?;
        let timeout = self.timeout();
        let ended = run_bounded(
            child,
            self.settings.max_output_bytes,
            timeout,
            launch.confined,
        )
        .await;
        let seconds = timeout.as_secs();
        let (head, ok) = match (ended.status, ended.timed_out) {
            _ if ended.not_started.is_some() => (
                format!(
                    "not run: {}",
                    ended.not_started.as_deref().unwrap_or_default()
                ),
                false,
            ),
            (None, true) if launch.confined => (
                format!(
                    "timed out after {seconds} s and was killed, with every process it started"
                ),
                false,
            ),
            (None, true) => (format!("timed out after {seconds} s and was killed"), false),
            (Some(status), timed_out) => match status.code() {
                Some(code) if timed_out => (
                    format!(
                        "exit code {code}; processes it left in the background kept its output open until the timeout ({seconds} s) and were killed"
                    ),
                    code == 0,
                ),
                Some(code) => (format!("exit code {code}"), code == 0),
                None => ("killed by a signal".to_owned(), false),
            },
            (None, false) => ("its exit status could not be read".to_owned(), false),
        };
        let text = format!(
            "{head}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            ended.stdout.section("stdout", &ctx.secrets),
            ended.stderr.section("stderr", &ctx.secrets)
        );
        Ok(if ok {
            ToolOutput::success(text)
        } else {
            ToolOutput::failure(text)
        })
    }
}
