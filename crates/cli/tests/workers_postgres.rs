//! Many `skillstate worker` processes on one PostgreSQL database: every task completes exactly
//! once when a worker is SIGKILLed mid-run (its tasks are rescued from their journals after the
//! lease expires, no effectful call repeated), and a batch's rate limit holds across workers.
//! Each test uses a fresh schema.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batch_support::*;
use serde_json::Value;
use skillstate_store::{QueueState, TaskStatus};
use support::{FakeServer, Reply, openai_answer};

/// Writes skillstate.toml (short leases, so a dead worker's tasks come back quickly) and the
/// batch file; submits it to `db` and returns the batch id.
fn submit(
    dir: &Path,
    db: &str,
    skill: &Path,
    inputs: &Path,
    extra: &str,
    model_toml: &str,
) -> String {
    let config = dir.join("skillstate.toml");
    std::fs::write(&config, format!("[store]\nlease_secs = 3\n{model_toml}")).unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\ninputs: {}\n{extra}",
            skill.display(),
            inputs.display()
        ),
    )
    .unwrap();
    let out = cli(dir, &config, &["--db", db, "batch", "submit", "batch.yaml"]);
    expect_exit(&out, 0, "batch submit");
    text(&out.stdout).trim().to_owned()
}

fn log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_one_killed_every_task_completes_exactly_once() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("workers_kill_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ledger = dir.join("ledger.tsv");
    let (skill, inputs) = warehouse_batch(dir, 300, 3, &ledger);
    let batch = submit(dir, &db, &skill, &inputs, "model: oracle\n", "");
    let config = dir.join("skillstate.toml");
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    assert_eq!(store.batch_tasks(&batch).await.unwrap().len(), 300);

    // Worker 0 is SIGKILLed inside its 12th effectful tool call: the call reached the ledger,
    // its result never reached the database.
    let mut workers = Reaper(Vec::new());
    for i in 0..3 {
        let env: &[(&str, &str)] = if i == 0 {
            &[("SKILLSTATE_FAILPOINT", "in_tool:12")]
        } else {
            &[]
        };
        workers.0.push(spawn_worker(
            dir,
            &config,
            &db,
            &["--concurrency", "4"],
            env,
            &dir.join(format!("worker{i}.log")),
        ));
    }
    let killed = wait_exit(
        &mut workers.0[0],
        Duration::from_secs(120),
        "worker 0 (failpoint)",
    );
    assert_eq!(
        killed.code(),
        None,
        "worker 0 dies by SIGKILL: {}",
        log(dir, "worker0.log")
    );
    // The kill came mid-batch: worker 0 had made its twelve calls, and tasks were left. (How
    // many the other two had completed by then is a race on a loaded machine, not something
    // this test is about.)
    let completed_then = store
        .batch_tasks(&batch)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.status == Some(TaskStatus::Completed))
        .count();
    assert!(completed_then < 300, "the batch was done before the kill");
    assert!(
        ledger_keys(&ledger).len() >= 12,
        "worker 0 died in its 12th call: {}",
        log(dir, "worker0.log")
    );

    let tasks = wait_for(
        Duration::from_secs(400),
        "every task to complete",
        async || {
            let tasks = store.batch_tasks(&batch).await.unwrap();
            tasks
                .iter()
                .all(|t| t.queue == Some(QueueState::Done))
                .then_some(tasks)
        },
    )
    .await;
    for i in 1..3 {
        signal(&workers.0[i], "TERM");
        let status = wait_exit(
            &mut workers.0[i],
            Duration::from_secs(60),
            "a surviving worker",
        );
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            log(dir, &format!("worker{i}.log"))
        );
    }

    // Exactly once: every task completed all its steps, and no effectful call ran twice.
    for task in &tasks {
        assert_eq!(task.status, Some(TaskStatus::Completed), "{task:?}");
        assert_eq!(task.version, 3, "{task:?}");
        assert!(!task.leased);
    }
    let keys = ledger_keys(&ledger);
    assert_no_duplicate(&keys);
    // The call worker 0 died in: its task was resumed by another worker from the journal,
    // which said the outcome is unknown instead of calling again.
    let mut rescued = 0;
    for task in &tasks {
        let observations = store.observations(&task.id).await.unwrap();
        if observations
            .iter()
            .any(|(_, o)| o.starts_with("Outcome unknown"))
        {
            rescued += 1;
            let step_keys: Vec<&String> = keys.iter().filter(|k| k.starts_with(&task.id)).collect();
            assert!(!step_keys.is_empty());
        }
    }
    assert!(
        rescued >= 1,
        "the task killed inside its tool call was rescued from its journal"
    );
    // Each successful effectful call is in the ledger once, and only those.
    let mut per_task: HashMap<&str, usize> = HashMap::new();
    for key in &keys {
        let (task, _) = key.rsplit_once(':').unwrap();
        *per_task.entry(task).or_default() += 1;
    }
    assert!(per_task.keys().all(|t| tasks.iter().any(|x| x.id == *t)));

    let out = cli(
        dir,
        &config,
        &["--db", &db, "batch", "report", &batch, "--format", "json"],
    );
    expect_exit(&out, 0, "batch report");
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(counts(&report), (300, 300, 0));
    assert_eq!(report["counts"]["queued"], 0);
    assert_eq!(report["counts"]["running"], 0);
    assert_eq!(report["metrics"]["steps"]["p95"].as_f64(), Some(3.0));
    drop(store);
    drop_schema(&url, &schema).await;
}

/// A warehouse model server for three workers: answers from the oracle and records when each
/// request arrived.
async fn timed_oracle_server(arrivals: Arc<Mutex<Vec<Instant>>>) -> FakeServer {
    FakeServer::with_responder(move |body| {
        arrivals.lock().unwrap().push(Instant::now());
        let prompt: String = body["messages"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| m["content"].as_str()).collect())
            .unwrap_or_default();
        let answer = skillstate_envs::oracle::answer("warehouse", &prompt).unwrap();
        Reply::json(200, openai_answer(&answer, "stop"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_rate_limit_holds_across_three_workers() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("workers_rate_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let server = timed_oracle_server(arrivals.clone()).await;
    // 12 tasks of 2 steps: 24 requests against a limit of 20 per minute.
    const LIMIT: usize = 20;
    let ledger = dir.join("ledger.tsv");
    let (skill, inputs) = warehouse_batch(dir, 12, 2, &ledger);
    let batch = submit(
        dir,
        &db,
        &skill,
        &inputs,
        &format!("model: openai:fake-model\nrate_limit: {{requests_per_minute: {LIMIT}}}\n"),
        &format!(
            "[model]\nbase_url = \"{}/v1\"\nmax_retries = 0\n",
            server.base_url
        ),
    );
    let config = dir.join("skillstate.toml");
    let mut workers = Reaper(Vec::new());
    for i in 0..3 {
        workers.0.push(spawn_worker(
            dir,
            &config,
            &db,
            &["--concurrency", "4", "--batch", &batch, "--until-idle"],
            &[],
            &dir.join(format!("worker{i}.log")),
        ));
    }
    for i in 0..3 {
        let status = wait_exit(
            &mut workers.0[i],
            Duration::from_secs(240),
            "a rate-limited worker",
        );
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            log(dir, &format!("worker{i}.log"))
        );
    }
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    let tasks = store.batch_tasks(&batch).await.unwrap();
    assert!(
        tasks
            .iter()
            .all(|t| t.status == Some(TaskStatus::Completed)),
        "{tasks:?}"
    );
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 24, "one request per step, none repeated");
    // Every request takes its place in the shared window (in the database) before it leaves its
    // worker, so the server sees it a little later than its grant; 58 s windows leave room for
    // that delay and still hold at most LIMIT requests when the limit works (24 requests cannot
    // fit in one minute otherwise).
    let window = Duration::from_secs(58);
    for (i, start) in arrivals.iter().enumerate() {
        let inside = arrivals[i..]
            .iter()
            .filter(|t| t.duration_since(*start) < window)
            .count();
        assert!(
            inside <= LIMIT,
            "{inside} requests reached the server within {window:?} of request {i}; the limit is {LIMIT} per minute"
        );
    }
    drop(store);
    drop_schema(&url, &schema).await;
}
