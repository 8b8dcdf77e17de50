//! A runner frozen (SIGSTOP) past its execution lease wakes after another runner took the task
//! over: it stops with "lost the lease to <holder> at <time>" and writes nothing — not "the
//! journal is inconsistent". Real `skillstate` processes, on SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use batch_support::*;
use common::{binary, warehouse_copy};
use serde_json::json;
use skillstate_store::Store;
use support::{FakeServer, Reply, openai_answer};

const LIMIT: Duration = Duration::from_secs(90);

/// A fake OpenAI-compatible server answering like the warehouse oracle: the first answer after
/// `first`, every other one after `rest`.
async fn oracle_server(first: Duration, rest: Duration) -> FakeServer {
    let calls = AtomicUsize::new(0);
    FakeServer::with_responder(move |body| {
        let delay = if calls.fetch_add(1, Ordering::SeqCst) == 0 {
            first
        } else {
            rest
        };
        let prompt = format!(
            "{}{}",
            body["messages"][0]["content"].as_str().unwrap_or(""),
            body["messages"][1]["content"].as_str().unwrap_or("")
        );
        match skillstate_envs::oracle::answer("warehouse", &prompt) {
            Some(answer) => Reply::json(200, openai_answer(&answer, "stop")).delayed(delay),
            None => Reply::json(500, json!({"error": {"message": "no answer"}})),
        }
    })
    .await
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `skillstate --db <db> <args>` in `dir`, stderr piped.
fn spawn(dir: &Path, db: &str, args: &[&str]) -> Child {
    Command::new(binary())
        .current_dir(dir)
        .env_remove("SKILLSTATE_DB")
        .env("SKILLSTATE_CONFIG", dir.join("skillstate.toml"))
        .env("OPENAI_API_KEY", "sk-lease-test")
        .args(["--db", db])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    text
}

/// Everything a runner writes of `task`, for comparing before and after.
async fn written(store: &dyn Store, task: &str) -> String {
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}",
        store.journal(task).await.unwrap(),
        store.intents(task).await.unwrap(),
        store.observations(task).await.unwrap(),
        store
            .task(task)
            .await
            .map(|t| (t.version, t.status, t.state)),
    )
}

async fn frozen_runner_loses_its_lease(dir: &Path, db: &str) {
    std::fs::write(dir.join("skillstate.toml"), "[store]\nlease_secs = 3\n").unwrap();
    let (skill, _) = warehouse_copy(dir, 5, 6);
    let skill = skill.to_str().unwrap().to_owned();
    let quick = oracle_server(Duration::from_millis(300), Duration::from_millis(300)).await;
    // The runner taking over waits in its first model call, long enough for the frozen one to
    // wake, try to write, and stop.
    let slow = oracle_server(Duration::from_secs(10), Duration::ZERO).await;
    let mut reaper = Reaper(Vec::new());

    let quick_url = format!("{}/v1", quick.base_url);
    reaper.0.push(spawn(
        dir,
        db,
        &[
            "run",
            &skill,
            "--model",
            "openai:fake",
            "--base-url",
            &quick_url,
            "--quiet",
        ],
    ));
    let store = wait_for(LIMIT, "the run to create its database", async || {
        skillstate_store::open_existing(db, &Default::default())
            .await
            .ok()
    })
    .await;
    let task = wait_for(LIMIT, "the first run to be mid-task", async || {
        let task = store.list_tasks().await.ok()?.first()?.clone();
        let leased = store.lease(&task.id).await.ok()?.is_some();
        (task.version >= 1 && leased).then_some(task.id)
    })
    .await;

    // Frozen inside a model call (its request in, the answer 300 ms away), not at a random
    // point: a process stopped inside a SQLite write transaction keeps the database's write
    // lock, and nobody could take the task over until it woke (a flaky 90 s timeout here).
    let asked = quick.requests().len();
    wait_for(LIMIT, "the first run's next model call", async || {
        (quick.requests().len() > asked).then_some(())
    })
    .await;
    // Until its lease has expired.
    signal(&reaper.0[0], "STOP");
    wait_for(LIMIT, "the frozen run's lease to expire", async || {
        let lease = store.lease(&task).await.ok()??;
        (lease.expires_at + 200 < now_millis()).then_some(())
    })
    .await;

    // Another runner takes the task over and waits in its model call.
    let slow_url = format!("{}/v1", slow.base_url);
    reaper.0.push(spawn(
        dir,
        db,
        &[
            "resume",
            &task,
            "--model",
            "openai:fake",
            "--base-url",
            &slow_url,
        ],
    ));
    let taker = reaper.0[1].id();
    wait_for(LIMIT, "the second runner to hold the task", async || {
        let lease = store.lease(&task).await.ok()??;
        (lease.holder.contains(&format!("(pid {taker} on")) && !slow.requests().is_empty())
            .then_some(())
    })
    .await;
    let before = written(store.as_ref(), &task).await;

    // The frozen runner wakes: it stops, naming the new holder, and writes nothing.
    signal(&reaper.0[0], "CONT");
    let status = wait_exit(&mut reaper.0[0], LIMIT, "the woken run");
    let stderr = stderr_of(&mut reaper.0[0]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("lost the lease to `skillstate")
            && stderr.contains(&format!("(pid {taker} on"))
            && stderr.contains(" at 20")
            && stderr.contains("stopped without writing anything more"),
        "{stderr}"
    );
    assert!(!stderr.contains("inconsistent"), "{stderr}");
    assert_eq!(
        written(store.as_ref(), &task).await,
        before,
        "the woken run wrote after the take-over"
    );

    // The runner that took over finishes the task.
    let status = wait_exit(&mut reaper.0[1], LIMIT, "the runner that took over");
    let stderr = stderr_of(&mut reaper.0[1]);
    assert!(status.success(), "{stderr}");
    let finished = store.task(&task).await.unwrap();
    assert_eq!(finished.status, skillstate_store::TaskStatus::Completed);
    assert_eq!(store.lease(&task).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_runner_woken_after_a_take_over_stops_with_lost_the_lease_on_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    frozen_runner_loses_its_lease(tmp.path(), db.to_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_runner_woken_after_a_take_over_stops_with_lost_the_lease_on_postgres() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("lease_frozen_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    let tmp = tempfile::tempdir().unwrap();
    frozen_runner_loses_its_lease(tmp.path(), &db).await;
    drop_schema(&url, &schema).await;
}
