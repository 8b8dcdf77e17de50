//! `call_bounded`: every tool call ends, whatever the tool does — on real slow tools (an async
//! wait, and a blocking wait on the blocking pool) and real fs tools.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::{SideEffect, ToolSpec};
use skillstate_tools::builtin::{ProtectedPaths, WorkDir, fs_tools};
use skillstate_tools::{CallContext, OWN_LIMIT_GRACE, Tool, ToolError, ToolOutput, call_bounded};

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: "slow".into(),
        input_schema: json!({"type": "object"}),
        side_effect: SideEffect::ReadOnly,
        source: "test".into(),
        needs_approval: false,
    }
}

/// Waits an hour (async), or blocks a pool thread until the test lets it go, then answers.
struct Slow {
    spec: ToolSpec,
    blocking: bool,
    own_limit: Option<Duration>,
    finished: Arc<AtomicBool>,
    /// The blocking wait ends when the test drops the sender (a runtime waits for its
    /// blocking threads when it shuts down).
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Slow {
    fn new(name: &str, blocking: bool) -> (Self, mpsc::Sender<()>) {
        let (sender, receiver) = mpsc::channel();
        let slow = Self {
            spec: spec(name),
            blocking,
            own_limit: None,
            finished: Arc::new(AtomicBool::new(false)),
            release: Mutex::new(Some(receiver)),
        };
        (slow, sender)
    }
}

#[async_trait]
impl Tool for Slow {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        if self.blocking {
            // A stuck system call, as an open of a FIFO would be: only a pool thread waits.
            let release = self.release.lock().unwrap().take().unwrap();
            tokio::task::spawn_blocking(move || release.recv_timeout(Duration::from_secs(3600)))
                .await
                .unwrap()
                .ok();
        } else {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        self.finished.store(true, Ordering::SeqCst);
        Ok(ToolOutput::success("finally"))
    }

    fn own_time_limit(&self) -> Option<Duration> {
        self.own_limit
    }
}

/// Fails the test instead of hanging if `work` does not end.
async fn ends<T>(work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .expect("the bounded call never returned")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_never_answers_times_out_with_a_clear_error() {
    let ctx = CallContext::new("t", 1);
    for blocking in [false, true] {
        let (slow, release) = Slow::new("slow.wait", blocking);
        let error = ends(call_bounded(
            &slow,
            &json!({}),
            &ctx,
            Duration::from_secs(1),
        ))
        .await
        .unwrap_err();
        assert_eq!(
            error,
            ToolError::TimedOut {
                tool: "slow.wait".into(),
                secs: 1
            }
        );
        assert_eq!(
            error.to_string(),
            "tool `slow.wait` gave no result within 1 s and was abandoned; if it has effects, they may or may not have happened"
        );
        assert!(!slow.finished.load(Ordering::SeqCst));
        drop(release);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_own_longer_limit_is_respected_by_the_outer_bound() {
    let (mut slow, _release) = Slow::new("slow.own", false);
    slow.own_limit = Some(Duration::from_secs(2));
    let error = ends(call_bounded(
        &slow,
        &json!({}),
        &CallContext::new("t", 1),
        Duration::from_secs(1),
    ))
    .await
    .unwrap_err();
    let expected = (Duration::from_secs(2) + OWN_LIMIT_GRACE).as_secs();
    assert_eq!(
        error,
        ToolError::TimedOut {
            tool: "slow.own".into(),
            secs: expected
        }
    );
}

#[tokio::test]
async fn fast_tools_pass_through_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("a.txt"), "hello\n").unwrap();
    let tools = fs_tools(&WorkDir::new(tmp.path(), &ProtectedPaths::nothing()).unwrap());
    let read = tools.iter().find(|t| t.spec().name == "fs.read").unwrap();
    let ctx = CallContext::new("t", 1);
    let out = call_bounded(
        read,
        &json!({"path": "a.txt"}),
        &ctx,
        Duration::from_secs(300),
    )
    .await
    .unwrap();
    assert_eq!(out, ToolOutput::success("hello\n"));
    let missing = call_bounded(
        read,
        &json!({"path": "b.txt"}),
        &ctx,
        Duration::from_secs(300),
    )
    .await
    .unwrap();
    assert_eq!(
        missing,
        ToolOutput::failure("Error: `b.txt` does not exist")
    );
}
