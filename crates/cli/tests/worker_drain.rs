//! A draining worker that waits for a slot of its batch's shared rate limit stops waiting at
//! once and sends nothing: a real `skillstate worker` child, SIGTERM, and a loopback fake model
//! server that counts the requests it receives.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use batch_support::*;
use skillstate_store::{QueueState, TaskStatus};
use support::{FakeServer, Reply, openai_answer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_stops_waiting_for_a_rate_slot_and_sends_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let requests = Arc::new(AtomicUsize::new(0));
    let server = {
        let requests = requests.clone();
        FakeServer::with_responder(move |body| {
            requests.fetch_add(1, Ordering::SeqCst);
            let prompt = format!(
                "{}{}",
                body["messages"][0]["content"].as_str().unwrap_or(""),
                body["messages"][1]["content"].as_str().unwrap_or("")
            );
            let answer = skillstate_envs::oracle::answer("warehouse", &prompt).unwrap();
            Reply::json(200, openai_answer(&answer, "stop"))
        })
        .await
    };
    // One request a minute: the first step's request is granted, the second step's waits for
    // the window to move on.
    let ledger = dir.join("ledger.tsv");
    let (skill, inputs) = warehouse_batch(dir, 1, 3, &ledger);
    let config = dir.join("skillstate.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nbase_url = \"{}/v1\"\nmax_retries = 0\n",
            server.base_url
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\ninputs: {}\nmodel: openai:fake-model\nrate_limit: {{requests_per_minute: 1}}\n",
            skill.display(),
            inputs.display()
        ),
    )
    .unwrap();
    let db = dir.join("queue.db").display().to_string();
    let submitted = cli(
        dir,
        &config,
        &["--db", &db, "batch", "submit", "batch.yaml"],
    );
    expect_exit(&submitted, 0, "batch submit");
    let batch = text(&submitted.stdout).trim().to_owned();

    let log = dir.join("worker.log");
    let mut worker = Reaper(vec![spawn_worker(
        dir,
        &config,
        &db,
        &["--batch", &batch],
        &[],
        &log,
    )]);
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    // Step 1 is answered and its action's result recorded: step 2's request is next, and the
    // window has no room for it.
    let task = store.batch_tasks(&batch).await.unwrap()[0].id.clone();
    wait_for(
        Duration::from_secs(60),
        "step 1 to be done and step 2 to wait",
        async || {
            let done = store.observation(&task, 2).await.ok()?.is_some();
            (done && requests.load(Ordering::SeqCst) == 1).then_some(())
        },
    )
    .await;

    signal(&worker.0[0], "TERM");
    // Without the fix the worker waits for the window (up to a minute) and then sends.
    let status = wait_exit(
        &mut worker.0[0],
        Duration::from_secs(120),
        "the draining worker",
    );
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("draining"), "{log}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "a request reached the server after the drain signal\n{log}"
    );
    // The task was released, not failed: still queued, running, no try spent.
    let row = store.batch_tasks(&batch).await.unwrap().remove(0);
    assert_eq!(row.status, Some(TaskStatus::Running), "{row:?}\n{log}");
    assert_eq!(row.queue, Some(QueueState::Queued), "{row:?}\n{log}");
    assert_eq!(row.tries, 0, "{row:?}");
    assert_eq!(row.version, 1, "{row:?}");
    assert!(log.contains("released"), "{log}");
}
