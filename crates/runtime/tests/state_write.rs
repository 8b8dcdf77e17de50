//! State written from outside a task (the service's PATCH) on a real SQLite file: it is a
//! journaled step with its author, checked like a model's patch, never racing a runner, and the
//! task runs on from it.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use serde_json::json;
use skillstate_core::{ContextStrategy, RejectionKind};
use skillstate_runtime::{
    NoProgress, Runner, StateWrite, StateWriteError, TaskOptions, start_task, verify_journal,
    write_state,
};
use skillstate_store::prelude::*;
use skillstate_store::{LeaseClaim, TaskRecord, TaskStatus, Verdict, state_at};

use common::{correct_answers, scripted, sqlite_store, warehouse, warehouse_skill};

const EVENTS: u32 = 4;

async fn new_task(store: &Arc<dyn Store>, seed: u64) -> TaskRecord {
    let skill = warehouse_skill(seed, EVENTS);
    let mut env = warehouse(seed, EVENTS);
    start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new("scripted:test.jsonl", ContextStrategy::State),
    )
    .await
    .unwrap()
}

fn write<'a>(task: &'a str, if_match: u64, patch: &'a serde_json::Value) -> StateWrite<'a> {
    StateWrite {
        task,
        if_match,
        patch,
        author: "key-1",
        checked: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_write_is_a_journaled_step_and_the_task_runs_on_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let task = new_task(&store, 1).await;
    let patch = json!({"inventory": {"shelf_499": "item_9999"}});

    let written = write_state(&store, &write(&task.id, 0, &patch))
        .await
        .unwrap();
    assert_eq!(written.version, 1);
    assert_eq!(written.state["inventory"]["shelf_499"], "item_9999");
    let journal = store.journal(&task.id).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].verdict, Verdict::Accepted);
    assert_eq!(journal[0].author.as_deref(), Some("key-1"));
    assert_eq!(journal[0].action, None);
    // The opening observation carries over to the next step, with a note.
    let next = store.observation(&task.id, 2).await.unwrap().unwrap();
    let opening = store.observation(&task.id, 1).await.unwrap().unwrap();
    assert!(next.starts_with(&opening) && next.contains("changed outside this task"));
    // The lease was given back.
    assert!(store.lease(&task.id).await.unwrap().is_none());

    // The model's run continues from step 2 on the written state and completes.
    let mut env = warehouse(1, EVENTS);
    let outcome = Runner::new(
        store.clone(),
        scripted(correct_answers(1, EVENTS)),
        &mut env,
        &mut NoProgress,
    )
    .run(&task.id)
    .await
    .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed, "{outcome:?}");
    let done = store.task(&task.id).await.unwrap();
    assert_eq!(done.state["inventory"]["shelf_499"], "item_9999");
    // Time travel and the journal check cover the written step.
    let at_one = state_at(store.as_ref(), &task.id, 1, done.version)
        .await
        .unwrap();
    assert_eq!(at_one, written.state);
    let check = verify_journal(store.as_ref(), &done).await.unwrap();
    assert_eq!(check.mismatch, None);
    assert_eq!(check.steps_checked, done.version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_invalid_and_busy_writes_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let task = new_task(&store, 2).await;
    let ok = json!({"inventory": {"shelf_7": "item_7"}});

    match write_state(&store, &write(&task.id, 3, &ok)).await {
        Err(StateWriteError::Stale {
            expected: 3,
            current: 0,
            ..
        }) => {}
        other => panic!("expected Stale, got {other:?}"),
    }
    let read_only = json!({"shelf_count": 12});
    match write_state(&store, &write(&task.id, 0, &read_only)).await {
        Err(StateWriteError::Rejected { rejections }) => {
            assert!(
                rejections
                    .iter()
                    .any(|r| r.kind == RejectionKind::ReadOnly && r.pointer == "/shelf_count"),
                "{rejections:?}"
            );
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let bad = json!({"inventory": {"shelf_7": 7}});
    match write_state(&store, &write(&task.id, 0, &bad)).await {
        Err(StateWriteError::Rejected { rejections }) => {
            assert_eq!(rejections[0].kind, RejectionKind::Schema);
            assert_eq!(rejections[0].pointer, "/inventory/shelf_7");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }

    // A runner of another machine holds the lease: refused, not queued behind it.
    let claim = LeaseClaim {
        token: "runner".into(),
        holder: "`skillstate run` (pid 1 on elsewhere)".into(),
        process: "linux another-boot 0 1 1".into(),
    };
    store
        .acquire_lease(&task.id, &claim, 60_000, None)
        .await
        .unwrap();
    match write_state(&store, &write(&task.id, 0, &ok)).await {
        Err(StateWriteError::Busy { holder, .. }) => assert!(holder.contains("skillstate run")),
        other => panic!("expected Busy, got {other:?}"),
    }
    store.release_lease(&task.id, "runner").await.unwrap();

    assert_eq!(store.task(&task.id).await.unwrap().version, 0);
    assert!(store.journal(&task.id).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_racing_writes_with_one_version_make_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let task = new_task(&store, 3).await;
    let mut writers = Vec::new();
    for i in 0..20 {
        let store = store.clone();
        let id = task.id.clone();
        writers.push(tokio::spawn(async move {
            let patch = json!({"inventory": {format!("shelf_{}", i + 10): format!("item_{i}")}});
            write_state(
                &store,
                &StateWrite {
                    task: &id,
                    if_match: 0,
                    patch: &patch,
                    author: &format!("key-{i}"),
                    checked: None,
                },
            )
            .await
        }));
    }
    let mut won = 0;
    for writer in writers {
        match writer.await.unwrap() {
            Ok(_) => won += 1,
            Err(StateWriteError::Stale { current: 1, .. }) => {}
            Err(other) => panic!("a losing write must be Stale, got {other}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(store.task(&task.id).await.unwrap().version, 1);
    assert_eq!(store.journal(&task.id).await.unwrap().len(), 1);
}

/// `linux <boot id> <pid namespace> <pid> <start time>` for this machine, as leases name their
/// holder's process (`lease.rs`); `started` is the start time given for `pid`.
fn this_machine(pid: u32, started: &str) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let namespace = std::fs::read_link("/proc/self/ns/pid").unwrap();
    format!(
        "linux {} {} {pid} {started}",
        boot.trim(),
        namespace.to_string_lossy()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_is_named_first_and_a_dead_holder_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let task = new_task(&store, 4).await;
    let ok = json!({"inventory": {"shelf_7": "item_7"}});
    let bad = json!({"inventory": {"shelf_7": 7}});

    // A live runner: its lease is the answer, whatever else is wrong with the write.
    let runner = LeaseClaim {
        token: "runner".into(),
        holder: "`skillstate run` (pid 1 on elsewhere)".into(),
        process: "linux another-boot 0 1 1".into(),
    };
    store
        .acquire_lease(&task.id, &runner, 60_000, None)
        .await
        .unwrap();
    for (if_match, patch) in [(3, &ok), (0, &bad)] {
        match write_state(&store, &write(&task.id, if_match, patch)).await {
            Err(StateWriteError::Busy { holder, .. }) => assert!(holder.contains("skillstate run")),
            other => panic!("expected Busy, got {other:?}"),
        }
    }
    store.release_lease(&task.id, "runner").await.unwrap();

    // A holder of this machine that is alive (this very process): refused too.
    let pid = std::process::id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let started = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_owned();
    let alive = LeaseClaim {
        token: "alive".into(),
        holder: "`worker 1` (pid here)".into(),
        process: this_machine(pid, &started),
    };
    store
        .acquire_lease(&task.id, &alive, 60_000, None)
        .await
        .unwrap();
    assert!(matches!(
        write_state(&store, &write(&task.id, 0, &ok)).await,
        Err(StateWriteError::Busy { .. })
    ));
    store.release_lease(&task.id, "alive").await.unwrap();

    // A holder whose process is gone (its pid now names a process started at another time):
    // taken over; the write is made under the lease and gives it back.
    let dead = LeaseClaim {
        token: "dead".into(),
        holder: "`worker 2` (pid gone)".into(),
        process: this_machine(pid, "0"),
    };
    store
        .acquire_lease(&task.id, &dead, 60_000, None)
        .await
        .unwrap();
    let written = write_state(&store, &write(&task.id, 0, &ok)).await.unwrap();
    assert_eq!(written.version, 1);
    assert_eq!(written.state["inventory"]["shelf_7"], "item_7");
    assert_eq!(store.lease(&task.id).await.unwrap(), None);
    let journal = store.journal(&task.id).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].author.as_deref(), Some("key-1"));

    // No lease at all: one commit, and no lease is left behind.
    let written = write_state(
        &store,
        &write(&task.id, 1, &json!({"inventory": {"shelf_8": "item_8"}})),
    )
    .await
    .unwrap();
    assert_eq!(written.version, 2);
    assert_eq!(store.lease(&task.id).await.unwrap(), None);
    assert_eq!(store.task(&task.id).await.unwrap().state, written.state);
}
