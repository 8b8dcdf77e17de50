//! MCP servers as real child processes: the reference filesystem server (npm), the time
//! server (PyPI), and a faulty server of our own that crashes, hangs and answers garbage.
//!
//! `scripts/test` installs the third-party servers and points SKILLSTATE_TEST_MCP_FS (the
//! server-filesystem entry script) and SKILLSTATE_TEST_MCP_TIME (the mcp-server-time
//! executable) at them; without them those tests record a visible skip (test-support/skip.rs)
//! that scripts/test lists after the run.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use skillstate_core::SideEffect;
use skillstate_tools::mcp::{McpServer, McpServerConfig, McpTool};
use skillstate_tools::{CallContext, Tool};

fn config(command: &str, args: &[&str]) -> McpServerConfig {
    McpServerConfig {
        command: command.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        timeout_secs: 3,
        start_timeout_secs: 60,
        side_effects: BTreeMap::new(),
    }
}

fn installed(var: &str) -> Option<PathBuf> {
    match std::env::var(var) {
        Ok(path) if Path::new(&path).exists() => Some(PathBuf::from(path)),
        _ => {
            skip::skip_test(
                &format!("{var} is not set or names no file"),
                "run scripts/test, which installs the MCP test servers and sets it",
            );
            None
        }
    }
}

fn tool<'a>(tools: &'a [McpTool], name: &str) -> &'a McpTool {
    tools
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| {
            panic!(
                "no tool {name}; have {:?}",
                tools
                    .iter()
                    .map(|t| t.spec().name.clone())
                    .collect::<Vec<_>>()
            )
        })
}

#[tokio::test]
async fn the_reference_filesystem_server() {
    let Some(entry) = installed("SKILLSTATE_TEST_MCP_FS") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::write(root.join("hello.txt"), "hello from a file\n").unwrap();
    let (server, tools) = McpServer::start(
        "files",
        &config("node", &[entry.to_str().unwrap(), root.to_str().unwrap()]),
    )
    .await
    .unwrap();
    let read = tool(&tools, "files.read_text_file");
    assert_eq!(
        read.spec().side_effect,
        SideEffect::ReadOnly,
        "from readOnlyHint"
    );
    assert_eq!(read.spec().source, "files");
    let write = tool(&tools, "files.write_file");
    assert_ne!(write.spec().side_effect, SideEffect::ReadOnly);
    let ctx = CallContext::new("t", 1);
    let text = read
        .call(&json!({"path": root.join("hello.txt")}), &ctx)
        .await
        .unwrap();
    assert!(
        text.ok && text.text.contains("hello from a file"),
        "{}",
        text.text
    );
    let wrote = write
        .call(
            &json!({"path": root.join("new.txt"), "content": "written"}),
            &ctx,
        )
        .await
        .unwrap();
    assert!(wrote.ok, "{}", wrote.text);
    assert_eq!(
        std::fs::read_to_string(root.join("new.txt")).unwrap(),
        "written"
    );
    let outside = read
        .call(&json!({"path": "/etc/hostname"}), &ctx)
        .await
        .unwrap();
    assert!(
        !outside.ok,
        "the server refuses paths outside its roots: {}",
        outside.text
    );
    server.shutdown().await;
    let after = read
        .call(&json!({"path": root.join("hello.txt")}), &ctx)
        .await;
    assert!(after.is_err(), "calls after shutdown fail cleanly");
}

#[tokio::test]
async fn the_python_time_server() {
    let Some(binary) = installed("SKILLSTATE_TEST_MCP_TIME") else {
        return;
    };
    let (server, tools) = McpServer::start(
        "time",
        &config(binary.to_str().unwrap(), &["--local-timezone", "UTC"]),
    )
    .await
    .unwrap();
    let convert = tool(&tools, "time.convert_time");
    let out = convert
        .call(
            &json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            &CallContext::new("t", 1),
        )
        .await
        .unwrap();
    assert!(out.ok, "{}", out.text);
    assert!(out.text.contains("21:00"), "{}", out.text);
    let bad = convert
        .call(
            &json!({"source_timezone": "Mars/Olympus", "time": "12:00", "target_timezone": "UTC"}),
            &CallContext::new("t", 2),
        )
        .await;
    match bad {
        Ok(output) => assert!(!output.ok, "{}", output.text),
        Err(error) => assert!(error.to_string().contains("time.convert_time"), "{error}"),
    }
    server.shutdown().await;
}

fn fault_config(pid_file: &Path) -> McpServerConfig {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fault_mcp_server.py");
    let mut c = config("python3", &[script.to_str().unwrap()]);
    c.env
        .insert("FAULT_PID_FILE".into(), pid_file.display().to_string());
    c.timeout_secs = 2;
    c
}

fn alive(pid_file: &Path) -> bool {
    let pid = std::fs::read_to_string(pid_file).unwrap();
    Path::new(&format!("/proc/{}", pid.trim())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn a_server_that_hangs_crashes_or_answers_garbage_never_hangs_the_task() {
    let tmp = tempfile::tempdir().unwrap();
    let ctx = CallContext::new("t", 1);

    let pid = tmp.path().join("hang.pid");
    let (server, tools) = McpServer::start("faulty", &fault_config(&pid))
        .await
        .unwrap();
    assert_eq!(
        tool(&tools, "faulty.echo").spec().side_effect,
        SideEffect::ReadOnly
    );
    let echo = tool(&tools, "faulty.echo")
        .call(&json!({"text": "hi"}), &ctx)
        .await
        .unwrap();
    assert_eq!(echo.text, "echo: hi");
    // The guard only turns a regression (a call that never returns) into a failure.
    let hang = tokio::time::timeout(
        Duration::from_secs(60),
        tool(&tools, "faulty.hang").call(&json!({}), &ctx),
    )
    .await
    .expect("the client gave up on its own")
    .unwrap_err();
    assert!(
        hang.to_string()
            .contains("no answer from MCP server `faulty` within 2 s"),
        "{hang}"
    );
    server.shutdown().await;
    // The process exits asynchronously after shutdown; wait for it, a bounded number of times.
    let mut stopped = false;
    for _ in 0..100 {
        if !alive(&pid) {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stopped, "shutdown must stop the server process");

    let pid = tmp.path().join("crash.pid");
    let (server, tools) = McpServer::start("faulty", &fault_config(&pid))
        .await
        .unwrap();
    let crash = tool(&tools, "faulty.crash")
        .call(&json!({}), &ctx)
        .await
        .unwrap_err();
    assert!(
        crash.to_string().contains("closed the connection"),
        "{crash}"
    );
    let next = tool(&tools, "faulty.echo")
        .call(&json!({"text": "again"}), &ctx)
        .await
        .unwrap_err();
    assert!(next.to_string().contains("faulty"), "{next}");
    server.shutdown().await;

    let pid = tmp.path().join("garbage.pid");
    let (server, tools) = McpServer::start("faulty", &fault_config(&pid))
        .await
        .unwrap();
    let garbage = tool(&tools, "faulty.garbage").call(&json!({}), &ctx).await;
    assert!(
        garbage.is_err(),
        "a garbage answer is an error, not a result"
    );
    server.shutdown().await;

    let missing = McpServer::start("ghost", &config("/nonexistent/server", &[]))
        .await
        .err()
        .unwrap();
    assert!(
        missing
            .to_string()
            .contains("cannot start `/nonexistent/server`"),
        "{missing}"
    );
}

/// A server that dies while starting says why on stderr; the start-up error quotes it, as a
/// failed call does.
#[tokio::test]
async fn a_server_that_dies_during_start_up_is_quoted_from_its_stderr() {
    let cases = [
        (
            config("python3", &["-c", "import no_such_module_xyz"]),
            "its last stderr line: ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            config(
                "sh",
                &[
                    "-c",
                    "echo 'starting up' >&2; echo 'fatal: cannot open /etc/demo.conf' >&2; echo >&2; exit 3",
                ],
            ),
            "its last stderr line: fatal: cannot open /etc/demo.conf",
        ),
        (
            // Reads the initialize request, says why it gives up, and exits without answering.
            config(
                "sh",
                &[
                    "-c",
                    "read line; echo \"unsupported client, bye\" >&2; exit 1",
                ],
            ),
            "its last stderr line: unsupported client, bye",
        ),
    ];
    for (config, expected) in cases {
        let error = tokio::time::timeout(
            Duration::from_secs(120),
            McpServer::start("broken", &config),
        )
        .await
        .expect("start-up gave up on its own")
        .err()
        .expect("a server that exits at start does not start");
        let message = error.to_string();
        assert!(
            message.starts_with("MCP server `broken`: initialisation failed:"),
            "{message}"
        );
        assert!(message.contains(expected), "{message}");
    }
}
