//! A real `skillstate serve` child process for tests: started on 127.0.0.1:0 (optionally
//! under `strace`), its address read from its log, stopped with SIGTERM.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::{binary, repo_root, skillstate};

/// A running `skillstate serve`, killed if the test fails.
pub struct Server {
    pub child: Child,
    /// The pid of the `skillstate serve` process itself (under strace, not strace's).
    pub pid: u32,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `strace -f` can trace here (installed, and ptrace allowed in this container).
pub fn strace_works() -> Result<(), String> {
    match Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
    {
        Err(error) => Err(format!("strace is not installed ({error})")),
        Ok(out) if !out.status.success() => Err(format!(
            "strace cannot trace in this environment: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => Ok(()),
    }
}

/// Starts `skillstate serve` on the database `db` with the repository's skills and `extra`
/// flags (`--workers N` among them when the test wants other than 4); with `strace_log`, under `strace -f -e trace=%file,%process -o <log>`.
pub fn start(db: &Path, extra: &[&str], strace_log: Option<&Path>) -> Server {
    // A shell prints its pid, then becomes `skillstate serve` (same pid).
    let script = r#"echo "serve-pid $$" >&2; exec "$@""#;
    let mut command = match strace_log {
        Some(log) => {
            let mut c = Command::new("strace");
            c.args(["-f", "-qq", "-e", "trace=%file,%process", "-o"])
                .arg(log)
                .args(["--", "sh", "-c", script, "sh"]);
            c
        }
        None => {
            let mut c = Command::new("sh");
            c.args(["-c", script, "sh"]);
            c
        }
    };
    let mut child = command
        .arg(binary())
        .args(["serve", "--addr", "127.0.0.1:0", "--skills", "skills"])
        .args(extra)
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut pid = None;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("serve: {line}");
            if let Some(rest) = line.strip_prefix("serve-pid ") {
                pid = rest.trim().parse::<u32>().ok();
            }
            if let Some(rest) = line.strip_prefix("serving ") {
                let base = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = sender.send((pid, base));
            }
        }
    });
    let (pid, base) = receiver
        .recv_timeout(Duration::from_secs(120))
        .expect("the server says where it listens");
    Server {
        pid: pid.expect("the server's pid"),
        child,
        base,
    }
}

impl Server {
    /// SIGTERM, then the exit; `None` if it has not exited by `within` (a hang guard only).
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

pub fn new_key(db: &Path, tenant: &str) -> String {
    let out = skillstate(
        db,
        &["keys", "create", "--tenant", tenant, "--label", "test"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub fn temp_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().canonicalize().unwrap().join(name)
}
