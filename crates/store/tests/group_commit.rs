//! SQLite's group commit (`sqlite/writer.rs`): concurrent tasks' writes share transactions,
//! yet a write reported committed is on disk, one failing write fails alone, and a writer that
//! is gone answers with an error instead of hanging.
//!
//! The crash test runs this test binary again as a child process (`CRASH_CHILD` names its
//! database): the child commits bursts of steps from many tasks at once and prints each step
//! it was told is committed; the parent SIGKILLs it mid-burst and checks that every printed
//! step is in the reopened database with its hash, and that every journal is continuous.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/store_steps.rs"]
mod store_steps;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_store::prelude::*;
use skillstate_store::*;

const CHILD_ENV: &str = "CRASH_CHILD";
const TASKS: usize = 32;
/// Steps the parent waits to see reported before it kills the child.
const KILL_AFTER: usize = 1_500;

fn new_task() -> NewTask {
    store_steps::free_task("start".into())
}

fn state(step: u64) -> Value {
    json!({"step": step, "note": format!("after step {step}")})
}

fn commit(task: &str, step: u64) -> StepCommit {
    let new_state = state(step);
    StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: format!("answer {step}"),
            patch: Some(json!({"step": step, "note": format!("after step {step}")})),
            action: Some(json!({"tool": "store", "args": {"step": step}})),
            errors: None,
            state_hash: Some(state_hash(&new_state)),
            prompt_tokens: 10,
            output_tokens: Some(7),
            prompt_hash: "p".into(),
            usage: None,
            latency_ms: 1,
            created_at: 0,
            author: None,
            board_version: None,
        },
        new_state,
        intent: Some(NewIntent {
            tool: "store".into(),
            args: json!({"step": step}),
            idempotency_key: format!("{task}:{step}"),
            side_effect: "effectful".into(),
        }),
        status: None,
        previous_result: None,
        next_observation: None,
        world: None,
        upgrade: None,
    }
}

async fn open(path: &str) -> SqliteStore {
    SqliteStore::open(path, Synchronous::Full)
        .await
        .unwrap()
        .with_snapshot_every(7)
}

/// The child's part: commit steps from `TASKS` tasks at once, forever, printing each one that
/// was reported committed. Does nothing when not started as the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = Arc::new(open(&path).await);
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let mut loops = Vec::new();
    for _ in 0..TASKS {
        let task = store.create_task(new_task(), &json!({})).await.unwrap();
        let (store, out) = (store.clone(), out.clone());
        loops.push(tokio::spawn(async move {
            for step in 1.. {
                let commit = commit(&task.id, step);
                store
                    .commit_step(&task.id, step - 1, &commit)
                    .await
                    .unwrap();
                {
                    let mut out = out.lock().unwrap();
                    writeln!(
                        out,
                        "committed {} {step} {}",
                        task.id,
                        commit.entry.state_hash.as_deref().unwrap()
                    )
                    .unwrap();
                    out.flush().unwrap();
                }
                let result = ActionResult {
                    step,
                    ok: true,
                    outcome_unknown: false,
                    result: "stored".into(),
                    next_observation: format!("observation {}", step + 1),
                    env_checkpoint: None,
                    delivered: Vec::new(),
                };
                store.record_action_result(&task.id, &result).await.unwrap();
            }
        }));
    }
    for task in loops {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_step_reported_committed_is_lost_to_a_sigkill() -> anyhow::Result<()> {
    if std::env::var(CHILD_ENV).is_ok() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let path = dir
        .path()
        .join("burst.db")
        .to_str()
        .context("UTF-8 path")?
        .to_owned();
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("child stdout")?;
    let (lines, reported) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut committed: Vec<(String, u64, String)> = Vec::new();
    let mut parse = |line: String| -> anyhow::Result<()> {
        if let Some(rest) = line.strip_prefix("committed ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            ensure!(parts.len() == 3, "unexpected child line `{line}`");
            committed.push((parts[0].to_owned(), parts[1].parse()?, parts[2].to_owned()));
        }
        Ok(())
    };
    let mut seen = 0;
    while seen < KILL_AFTER {
        match reported.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => {
                seen += usize::from(line.starts_with("committed "));
                parse(line)?;
            }
            Err(error) => {
                let _ = child.kill();
                bail!("the child stopped reporting commits after {seen}: {error}");
            }
        }
    }
    child.kill()?; // SIGKILL, in the middle of a burst
    child.wait()?;
    // Lines already in the pipe were printed after their commit returned: they count too.
    reader.join().ok();
    while let Ok(line) = reported.try_recv() {
        parse(line)?;
    }

    let store = open(&path).await;
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(store.pool())
        .await?;
    assert_eq!(integrity, "ok");
    let mut last: HashMap<String, u64> = HashMap::new();
    for (task, step, hash) in &committed {
        let slot = last.entry(task.clone()).or_default();
        *slot = (*slot).max(*step);
        let patches = store.accepted_patches(task, *step, *step).await?;
        assert_eq!(
            patches.first().map(|(_, _, h)| h.as_str()),
            Some(hash.as_str()),
            "task {task} step {step} was reported committed but is not in the journal"
        );
    }
    assert_eq!(last.len(), TASKS, "every task committed before the kill");
    for (task, reported) in &last {
        let record = store.task(task).await?;
        assert!(
            record.version >= *reported,
            "{task}: version {} < {reported}",
            record.version
        );
        let extent = store.journal_extent(task).await?;
        assert_eq!(
            (extent.accepted, extent.first, extent.last),
            (record.version, Some(1), Some(record.version)),
            "{task}: the journal is not continuous"
        );
        // The state rebuilt from snapshot and patches matches every recorded hash.
        let rebuilt = state_at(&store, task, record.version, record.version).await?;
        assert_eq!(rebuilt, record.state);
    }
    eprintln!(
        "{} steps reported committed before the kill, all present",
        committed.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_fails_alone_in_its_group() -> anyhow::Result<()> {
    if std::env::var(CHILD_ENV).is_ok() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let path = dir
        .path()
        .join("group.db")
        .to_str()
        .context("UTF-8 path")?
        .to_owned();
    let store = Arc::new(open(&path).await);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        tasks.push(store.create_task(new_task(), &json!({})).await?.id);
    }
    // Every task gets a good commit of step 1 and a stale one (claiming version 5) at once.
    let mut writes = Vec::new();
    for task in &tasks {
        for expected in [0, 5] {
            let (store, task) = (store.clone(), task.clone());
            writes.push(tokio::spawn(async move {
                let step = expected + 1;
                (
                    expected,
                    store
                        .commit_step(&task, expected, &commit(&task, step))
                        .await,
                )
            }));
        }
    }
    for write in writes {
        match write.await? {
            (0, result) => result?,
            (
                _,
                Err(StoreError::Conflict {
                    expected: 5,
                    actual,
                    ..
                }),
            ) => {
                assert!(actual <= 1, "{actual}");
            }
            (_, other) => bail!("a stale commit got {other:?}"),
        }
    }
    for task in &tasks {
        assert_eq!(store.task(task).await?.version, 1);
        assert_eq!(store.journal(task).await?.len(), 1);
        assert_eq!(store.intents(task).await?.len(), 1);
    }
    Ok(())
}

#[test]
fn the_writer_outlives_runtimes_and_a_closed_one_answers_with_an_error() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closed.db").to_str().unwrap().to_owned();
    let first = tokio::runtime::Runtime::new().unwrap();
    let (store, task) = first.block_on(async {
        let store = open(&path).await;
        let task = store.create_task(new_task(), &json!({})).await.unwrap();
        // Starts the writer.
        store
            .commit_step(&task.id, 0, &commit(&task.id, 1))
            .await
            .unwrap();
        (store, task)
    });
    drop(first);
    // The writer is a thread of its own: another runtime goes on writing through it.
    let second = tokio::runtime::Runtime::new().unwrap();
    second
        .block_on(store.commit_step(&task.id, 1, &commit(&task.id, 2)))
        .unwrap();
    second.block_on(store.close());
    let error = second
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                store.commit_step(&task.id, 2, &commit(&task.id, 3)),
            )
            .await
        })
        .expect("an answer, not a hang")
        .expect_err("the writer is closed");
    assert!(matches!(error, StoreError::Write { .. }), "{error}");
    assert!(error.to_string().contains("open it again"), "{error}");
    // Reads still work, and what was committed before is there.
    let version = second.block_on(store.task(&task.id)).unwrap().version;
    assert_eq!(version, 2);
}
