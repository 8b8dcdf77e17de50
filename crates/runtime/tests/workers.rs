//! Workers on a real SQLite file: a batch runs to the end with every effectful action done once;
//! a dead worker's task is rescued after its lease expires and resumes from its journal; the
//! heartbeat keeps a slow task; a worker whose lease was taken over stops without writing.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::ContextStrategy;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::{
    HostedTask, LeasePolicy, StopLevel, TaskHost, TaskOptions, WorkerEvent, WorkerOptions,
    WorkerStats, prepare_task, run_worker,
};
use skillstate_store::prelude::*;
use skillstate_store::{
    LeaseClaim, NewBatch, OnError, QueueState, QueuedTask, RateLimit, TaskRecord, TaskStatus,
};
use tokio::sync::{mpsc, watch};

use common::{correct_answers, scripted, sqlite_store, warehouse_skill};

const EVENTS: u32 = 4;

/// Rebuilds a warehouse task's world from its record, with the correct answers as its model,
/// each answer delayed by `delay`.
struct WarehouseHost {
    delay: Duration,
}

#[async_trait]
impl TaskHost for WarehouseHost {
    async fn open(&self, task: &TaskRecord) -> Result<HostedTask, String> {
        let settings: EnvironmentSettings =
            serde_json::from_value(task.environment.clone().unwrap_or(Value::Null))
                .map_err(|e| e.to_string())?;
        let seed = settings.params["seed"].as_u64().unwrap();
        let env = skillstate_envs::build_environment(&settings).map_err(|e| e.to_string())?;
        Ok(HostedTask {
            env,
            model: Arc::new(Slow {
                inner: scripted(correct_answers(seed, EVENTS)),
                delay: self.delay,
            }),
            resources: None,
        })
    }
}

struct Slow {
    inner: Arc<dyn ModelProvider>,
    delay: Duration,
}

#[async_trait]
impl ModelProvider for Slow {
    fn spec(&self) -> String {
        self.inner.spec()
    }
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        tokio::time::sleep(self.delay).await;
        self.inner.complete(request).await
    }
    fn skip_calls(&self, calls: usize) {
        self.inner.skip_calls(calls);
    }
}

/// Queues `count` warehouse tasks (seeds 1..=count) whose effectful actions append to `ledger`.
async fn submit(store: &dyn Store, count: u64, ledger: &Path) -> String {
    let batch = store
        .create_batch(&NewBatch {
            name: "workers test".into(),
            spec: json!({}),
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: RateLimit::default(),
        })
        .await
        .unwrap();
    let mut queued = Vec::new();
    for seed in 1..=count {
        let mut skill = warehouse_skill(seed, EVENTS);
        let settings = skill.definition.settings.environment.as_mut().unwrap();
        settings
            .params
            .insert("audit_log".into(), json!(ledger.to_str().unwrap()));
        let mut env = skillstate_envs::build_environment(settings).unwrap();
        let task = prepare_task(
            &skill,
            env.as_mut(),
            &TaskOptions::new("scripted:test.jsonl", ContextStrategy::State),
        )
        .unwrap();
        queued.push(QueuedTask {
            task,
            initial_state: skill.definition.initial_state.clone(),
            labels: json!({"seed": seed}),
            tenant: None,
        });
    }
    store.enqueue_tasks(&batch.id, queued).await.unwrap();
    batch.id
}

fn options(batch: &str, concurrency: usize, ttl: Duration) -> WorkerOptions {
    WorkerOptions {
        concurrency,
        batch: Some(batch.to_owned()),
        until_idle: true,
        poll: Duration::from_millis(20),
        lease: LeasePolicy {
            ttl,
            label: "test worker".into(),
        },
        ..WorkerOptions::default()
    }
}

async fn work(
    store: Arc<dyn Store>,
    options: WorkerOptions,
    delay: Duration,
) -> (WorkerStats, Vec<WorkerEvent>) {
    let (_stop, stop_rx) = watch::channel(StopLevel::Run);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let stats = tokio::time::timeout(
        Duration::from_secs(120),
        run_worker(
            store,
            Arc::new(WarehouseHost { delay }),
            options,
            stop_rx,
            Some(events_tx),
        ),
    )
    .await
    .expect("the worker finishes within two minutes")
    .unwrap();
    let mut events = Vec::new();
    while let Ok(event) = events_rx.try_recv() {
        events.push(event);
    }
    (stats, events)
}

/// The idempotency keys of every effectful action, one per line of the ledger.
fn ledger_keys(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_owned())
        .collect()
}

fn assert_no_duplicate(keys: &[String]) {
    let mut sorted = keys.to_vec();
    sorted.sort();
    let before = sorted.len();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        before,
        "an effectful action ran twice: {keys:?}"
    );
}

async fn setup(dir: &Path) -> (Arc<dyn Store>, PathBuf) {
    let (store, _) = sqlite_store(dir).await;
    (store, dir.join("ledger.tsv"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_a_batch_to_the_end_and_every_action_happens_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = setup(dir.path()).await;
    let batch = submit(store.as_ref(), 12, &ledger).await;
    let (stats, _) = work(
        store.clone(),
        options(&batch, 4, Duration::from_secs(30)),
        Duration::ZERO,
    )
    .await;
    assert_eq!(stats.completed, 12, "{stats:?}");
    let rows = store.batch_tasks(&batch).await.unwrap();
    assert_eq!(rows.len(), 12);
    for row in &rows {
        assert_eq!(row.status, Some(TaskStatus::Completed), "{row:?}");
        assert_eq!(row.queue, Some(QueueState::Done));
        assert!(!row.leased);
        assert_eq!(row.accepted, row.version);
    }
    let keys = ledger_keys(&ledger);
    assert!(!keys.is_empty());
    assert_no_duplicate(&keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_task_is_rescued_after_its_lease_expires_and_resumes_from_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = setup(dir.path()).await;
    let batch = submit(store.as_ref(), 1, &ledger).await;
    // The first worker stops dead (no drain, no release) once the task committed two steps.
    let (stop, stop_rx) = watch::channel(StopLevel::Run);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let first = tokio::spawn(run_worker(
        store.clone(),
        Arc::new(WarehouseHost {
            delay: Duration::from_millis(100),
        }),
        options(&batch, 1, Duration::from_millis(600)),
        stop_rx,
        Some(events_tx),
    ));
    let mut accepted = 0;
    while accepted < 2 {
        match tokio::time::timeout(Duration::from_secs(30), events_rx.recv()).await {
            Ok(Some(WorkerEvent::Step { accepted: true, .. })) => accepted += 1,
            Ok(Some(_)) => {}
            other => panic!("the first worker stopped early: {other:?}"),
        }
    }
    stop.send(StopLevel::Now).unwrap();
    first.await.unwrap().unwrap();
    let task = store.batch_tasks(&batch).await.unwrap().remove(0);
    assert!(
        task.leased,
        "an abandoned task keeps its lease until it expires"
    );
    assert!(task.version >= 1 && task.version < u64::from(EVENTS));
    let done_before = ledger_keys(&ledger).len();

    // A second worker finds nothing claimable until the lease expires, then finishes the task.
    let (stats, events) = work(
        store.clone(),
        options(&batch, 1, Duration::from_secs(30)),
        Duration::ZERO,
    )
    .await;
    assert_eq!(stats.completed, 1, "{stats:?} {events:?}");
    let task = store.task(&task.id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    let keys = ledger_keys(&ledger);
    assert!(keys.len() > done_before, "the rescue continued the task");
    assert_no_duplicate(&keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_a_task_whose_steps_outlast_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = setup(dir.path()).await;
    let batch = submit(store.as_ref(), 2, &ledger).await;
    // Each answer takes longer than the lease's whole time to live; two workers compete. (The
    // lease is renewed every third of its life, counted from the claim: three chances per life,
    // even on a busy machine.)
    let ttl = Duration::from_millis(1500);
    let slow = Duration::from_millis(1800);
    let a = work(store.clone(), options(&batch, 2, ttl), slow);
    let b = work(store.clone(), options(&batch, 2, ttl), slow);
    let ((stats_a, events_a), (stats_b, events_b)) = tokio::join!(a, b);
    assert_eq!(stats_a.completed + stats_b.completed, 2);
    assert_eq!(stats_a.lost + stats_b.lost, 0, "{events_a:?} {events_b:?}");
    assert_eq!(
        stats_a.claimed + stats_b.claimed,
        2,
        "no task was claimed twice"
    );
    assert_no_duplicate(&ledger_keys(&ledger));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_lease_was_taken_over_stops_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = setup(dir.path()).await;
    let batch = submit(store.as_ref(), 1, &ledger).await;
    let (stop, stop_rx) = watch::channel(StopLevel::Run);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let mut options = options(&batch, 1, Duration::from_millis(300));
    options.until_idle = false;
    let worker = tokio::spawn(run_worker(
        store.clone(),
        Arc::new(WarehouseHost {
            delay: Duration::from_millis(700),
        }),
        options,
        stop_rx,
        Some(events_tx),
    ));
    let task = loop {
        match tokio::time::timeout(Duration::from_secs(30), events_rx.recv()).await {
            Ok(Some(WorkerEvent::Claimed { task, .. })) => break task,
            Ok(Some(_)) => {}
            other => panic!("no claim: {other:?}"),
        }
    };
    // Another runner takes the lease over while the worker waits on its model.
    let held = store.lease(&task).await.unwrap().unwrap();
    let thief = LeaseClaim {
        token: "thief".into(),
        holder: "test".into(),
        process: "elsewhere".into(),
    };
    store
        .acquire_lease(&task, &thief, 60_000, Some(&held.token))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events_rx.recv()).await {
            Ok(Some(WorkerEvent::LostLease { task: lost, .. })) => {
                assert_eq!(lost, task);
                break;
            }
            Ok(Some(_)) => {}
            other => panic!("the worker never noticed: {other:?}"),
        }
    }
    stop.send(StopLevel::Drain).unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stats.lost, 1, "{stats:?}");
    let record = store.task(&task).await.unwrap();
    assert_eq!(
        record.version, 0,
        "the worker committed nothing after losing its lease"
    );
    assert_eq!(store.lease(&task).await.unwrap().unwrap().token, "thief");
    assert!(ledger_keys(&ledger).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_ends_when_the_others_finish_not_when_their_leases_would_expire() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ledger) = setup(dir.path()).await;
    let batch = submit(store.as_ref(), 4, &ledger).await;
    // Leases of an hour: an idle worker that slept until they expire would outlast `work`'s
    // two-minute bound.
    let busy = tokio::spawn(work(
        store.clone(),
        options(&batch, 4, Duration::from_secs(3600)),
        Duration::from_millis(100),
    ));
    tokio::time::timeout(Duration::from_secs(60), async {
        while store
            .batch_tasks(&batch)
            .await
            .unwrap()
            .iter()
            .filter(|t| t.leased)
            .count()
            < 4
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first worker claims every task");
    let (idle, _) = work(
        store.clone(),
        options(&batch, 4, Duration::from_secs(3600)),
        Duration::ZERO,
    )
    .await;
    assert_eq!(idle.claimed, 0, "{idle:?}");
    let (stats, _) = busy.await.unwrap();
    assert_eq!(stats.completed, 4, "{stats:?}");
}
