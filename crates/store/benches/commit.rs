//! The cost of one accepted step in the store: `commit_step` writing the journal row, the new
//! state and version, and the action intent in one transaction, on a warehouse-sized state
//! (40 occupied shelves). SQLite in WAL mode with synchronous=FULL and =NORMAL, and PostgreSQL
//! when it is reachable at `SKILLSTATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); the PostgreSQL part is skipped with a notice
//! otherwise.
//!
//! Group commit: N tasks running steps at once (1 vs 64; a step = its commit and its tool
//! result), in durable steps per second, on SQLite FULL (where the group-commit writer shares one
//! WAL sync among the writes waiting together) and on PostgreSQL (whose WAL writer groups
//! concurrent commits by itself).
//!
//! Run: `cargo bench -p skillstate-store --bench commit`

#[path = "../../../test-support/skip.rs"]
mod skip;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::{ContextStrategy, SkillDefinition, StatePatch};
use skillstate_store::prelude::*;
use skillstate_store::{
    ActionResult, JournalEntry, NewIntent, NewTask, PostgresStore, SqliteStore, StepCommit,
    Synchronous, Verdict,
};
use tokio::runtime::Runtime;

const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A warehouse with 40 occupied shelves, about what a 200-step episode holds at its peak.
fn busy_state() -> Value {
    let inventory: serde_json::Map<String, Value> = (0..40)
        .map(|i| {
            (
                format!("shelf_{}", i * 7),
                json!(format!("item_{}", 1000 + i)),
            )
        })
        .collect();
    json!({"shelf_count": 500, "inventory": inventory})
}

fn new_task() -> NewTask {
    NewTask {
        skill: SkillDefinition {
            name: "warehouse".into(),
            description: "bench".into(),
            metadata: None,
            procedure: "store and ship items".into(),
            schema: json!({"type": "object"}),
            initial_state: busy_state(),
            settings: Default::default(),
            migrations: Vec::new(),
        },
        tools: Vec::new(),
        context: ContextStrategy::State,
        context_budget: None,
        model: "bench".into(),
        environment: None,
        env_checkpoint: None,
        opening_observation: "start".into(),
    }
}

/// The commit of `step`: odd steps store item_9 on shelf_499, even steps ship it again, so the
/// state keeps its size however many steps run.
fn commit_for(task: &str, step: u64, stored: &Value, shipped: &Value) -> StepCommit {
    let (patch, tool, new_state) = if step % 2 == 1 {
        (
            json!({"inventory": {"shelf_499": "item_9"}}),
            "store",
            stored,
        )
    } else {
        (json!({"inventory": {"shelf_499": null}}), "ship", shipped)
    };
    let args = json!({"item": "item_9", "shelf": "shelf_499"});
    let output = json!({"reasoning": "an alert asked for it", "state_patch": patch, "action": {"tool": tool, "args": args}});
    StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: output.to_string(),
            patch: Some(patch),
            action: Some(json!({"tool": tool, "args": args})),
            errors: None,
            state_hash: Some(state_hash(new_state)),
            prompt_tokens: 1100,
            output_tokens: Some(7),
            prompt_hash: "0".repeat(64),
            usage: Some(json!({"input_tokens": 1100, "output_tokens": 60})),
            latency_ms: 900,
            created_at: 0,
            author: None,
            board_version: None,
        },
        new_state: new_state.clone(),
        intent: Some(NewIntent {
            tool: tool.into(),
            args,
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

fn tool_result(step: u64) -> ActionResult {
    ActionResult {
        step,
        ok: true,
        outcome_unknown: false,
        result: "{\"stored\": true}".into(),
        next_observation: format!("alert {step}: shelf_499 needs attention"),
        env_checkpoint: None,
        delivered: Vec::new(),
    }
}

fn bench_commits(c: &mut Criterion, runtime: &Runtime, label: &str, store: Arc<dyn Store>) {
    let shipped = busy_state();
    let stored = StatePatch::from_value(&json!({"inventory": {"shelf_499": "item_9"}}))
        .expect("patch")
        .apply(&shipped)
        .expect("applies");
    let task = runtime
        .block_on(store.create_task(new_task(), &shipped))
        .expect("task");
    let mut version = 0u64;
    c.bench_function(&format!("commit_step ({label})"), |b| {
        b.iter_custom(|iters| {
            // Built beforehand so that only the store's work is timed.
            let commits: Vec<StepCommit> = (version + 1..=version + iters)
                .map(|step| commit_for(&task.id, step, &stored, &shipped))
                .collect();
            runtime.block_on(async {
                let start = Instant::now();
                for commit in &commits {
                    store
                        .commit_step(&task.id, version, commit)
                        .await
                        .expect("commit");
                    version += 1;
                }
                start.elapsed()
            })
        })
    });
}

/// `tasks` tasks run steps at the same time, each in its own loop: what a worker running that
/// many tasks asks of the store. A step here is the accepted step's commit and its tool result
/// (two transactions, as the runner writes them for an effectful tool); throughput is in durable
/// steps per second.
fn bench_concurrent(
    c: &mut Criterion,
    label: &str,
    open: &dyn Fn(&Runtime) -> Arc<dyn Store>,
    tasks: usize,
) {
    // A runtime of its own, which also drives the store's connections.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store = open(&runtime);
    let shipped = busy_state();
    let stored = StatePatch::from_value(&json!({"inventory": {"shelf_499": "item_9"}}))
        .expect("patch")
        .apply(&shipped)
        .expect("applies");
    let ids: Vec<String> = runtime.block_on(async {
        let mut ids = Vec::new();
        for _ in 0..tasks {
            ids.push(
                store
                    .create_task(new_task(), &shipped)
                    .await
                    .expect("task")
                    .id,
            );
        }
        ids
    });
    let mut version = 0u64;
    let mut group = c.benchmark_group(format!("concurrent steps ({label})"));
    group.throughput(Throughput::Elements(tasks as u64));
    group.bench_function(format!("{tasks} tasks at once"), |b| {
        b.iter_custom(|iters| {
            // Every task is at `version`; each commits `iters` more steps.
            let per_task: Vec<Vec<StepCommit>> = ids
                .iter()
                .map(|id| {
                    (version + 1..=version + iters)
                        .map(|step| commit_for(id, step, &stored, &shipped))
                        .collect()
                })
                .collect();
            let elapsed = runtime.block_on(async {
                let start = Instant::now();
                let loops: Vec<_> = ids
                    .iter()
                    .cloned()
                    .zip(per_task)
                    .map(|(id, commits)| {
                        let store = store.clone();
                        tokio::spawn(async move {
                            for (i, commit) in commits.iter().enumerate() {
                                let step = version + 1 + i as u64;
                                store
                                    .commit_step(&id, step - 1, commit)
                                    .await
                                    .expect("commit");
                                store
                                    .record_action_result(&id, &tool_result(step))
                                    .await
                                    .expect("tool result");
                            }
                        })
                    })
                    .collect();
                for task in loops {
                    task.await.expect("commit loop");
                }
                start.elapsed()
            });
            version += iters;
            elapsed
        })
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    for (label, sync) in [
        ("SQLite WAL, synchronous=FULL", Synchronous::Full),
        ("SQLite WAL, synchronous=NORMAL", Synchronous::Normal),
    ] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("bench.db");
        let store = runtime
            .block_on(SqliteStore::open(path.to_str().expect("utf-8 path"), sync))
            .expect("store");
        bench_commits(c, &runtime, label, Arc::new(store));
    }
    for tasks in [1, 64] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("bench.db");
        let open = |runtime: &Runtime| -> Arc<dyn Store> {
            Arc::new(
                runtime
                    .block_on(SqliteStore::open(
                        path.to_str().expect("utf-8 path"),
                        Synchronous::Full,
                    ))
                    .expect("store"),
            )
        };
        bench_concurrent(c, "SQLite WAL, synchronous=FULL", &open, tasks);
    }

    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty() && u != "off")
        .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned());
    let schema = format!("bench_commit_{}", uuid::Uuid::now_v7().simple());
    match runtime.block_on(PostgresStore::open_in_schema(&url, &schema)) {
        Ok(store) => {
            let pool = store.pool().clone();
            bench_commits(c, &runtime, "PostgreSQL", Arc::new(store));
            for tasks in [1, 64] {
                let open = |runtime: &Runtime| -> Arc<dyn Store> {
                    Arc::new(
                        runtime
                            .block_on(PostgresStore::open_in_schema(&url, &schema))
                            .expect("store"),
                    )
                };
                bench_concurrent(c, "PostgreSQL", &open, tasks);
            }
            runtime.block_on(async {
                let drop = format!("DROP SCHEMA {schema} CASCADE");
                if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                    .execute(&pool)
                    .await
                {
                    eprintln!("could not drop the bench schema {schema}: {error}");
                }
                pool.close().await;
            });
        }
        Err(error) => skip::skip_part(
            "the PostgreSQL benchmark",
            &error.to_string(),
            "start PostgreSQL or point SKILLSTATE_TEST_POSTGRES_URL at a server",
        ),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10));
    targets = bench
}
criterion_main!(benches);
