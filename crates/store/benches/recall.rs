//! Recall latency on a 10,000-step journal (docs/recall.md, "Recall and provenance"): one task shaped
//! like the warehouse-archive workload — each step an alert naming an item and a shelf, the
//! model's reasoning, its action and two state writes — on SQLite (a file, FTS5) and on
//! PostgreSQL (a schema of its own in the local server, GIN; skipped with a notice when
//! `SKILLSTATE_BENCH_POSTGRES_URL=off`). Before criterion's own runs, 1,000 queries for random
//! items are timed one by one for p50 and p99, and the index's bytes per step are printed
//! beside the journal's.
//!
//! Run: `cargo bench -p skillstate-store --bench recall`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::recall::RecallQuery;
use skillstate_core::{ContextStrategy, SkillDefinition, StatePatch};
use skillstate_store::prelude::*;
use skillstate_store::{
    ActionResult, JournalEntry, NewIntent, NewTask, PostgresStore, SqliteStore, StepCommit, Store,
    Synchronous, Verdict,
};
use sqlx::{AssertSqlSafe, Connection};
use tokio::runtime::Runtime;

/// Steps of the journal searched: 10,000 under `cargo bench`; 1,000 when `cargo test --bench
/// '*'` (scripts/test) runs each benchmark once as a smoke test (criterion's test mode, no
/// `--bench` argument), where filling 10,000 steps twice in a debug build took most of a minute.
fn steps() -> u64 {
    if std::env::args().any(|arg| arg == "--bench") {
        10_000
    } else {
        1_000
    }
}
const ITEMS: u64 = 4_000;
const SHELVES: u64 = 5_000;

fn task() -> NewTask {
    NewTask {
        skill: SkillDefinition {
            name: "archive".into(),
            description: "bench".into(),
            metadata: None,
            procedure: "anything".into(),
            schema: json!({"type": "object"}),
            initial_state: json!({"recent": {}, "handled": 0}),
            settings: Default::default(),
            migrations: Vec::new(),
        },
        tools: Vec::new(),
        context: ContextStrategy::State,
        context_budget: None,
        model: "scripted:bench".into(),
        environment: None,
        env_checkpoint: None,
        opening_observation: "Shipment arrived containing item_0. Store it on shelf_0.".into(),
    }
}

/// A small deterministic generator (no extra dependency).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

async fn fill(store: &dyn Store) -> String {
    let task = store
        .create_task(task(), &json!({"recent": {}, "handled": 0}))
        .await
        .expect("task")
        .id;
    let mut state = json!({"recent": {}, "handled": 0});
    let mut rng = Lcg(7);
    for step in 1..=steps() {
        let item = format!("item_{}", rng.next(ITEMS));
        let shelf = format!("shelf_{}", rng.next(SHELVES));
        // A bounded recent-moves index: 20 entries, the oldest evicted.
        let mut patch = json!({"recent": {item.clone(): shelf.clone()}, "handled": step});
        if let Some(recent) = state["recent"].as_object()
            && recent.len() >= 20
            && let Some(oldest) = recent.keys().next()
        {
            patch["recent"][oldest.clone()] = Value::Null;
        }
        let new_state = StatePatch::from_value(&patch)
            .expect("patch")
            .apply(&state)
            .expect("applies");
        let action = json!({"tool": "store", "args": {"item": item, "shelf": shelf}});
        let output = json!({"reasoning": format!("Store {item} on {shelf} as the alert asks."), "state_patch": patch, "action": action}).to_string();
        let commit = StepCommit {
            entry: JournalEntry {
                step,
                attempt: 1,
                verdict: Verdict::Accepted,
                output,
                patch: Some(patch),
                action: Some(action.clone()),
                errors: None,
                state_hash: Some(state_hash(&new_state)),
                prompt_tokens: 900,
                output_tokens: Some(60),
                prompt_hash: "p".into(),
                usage: None,
                latency_ms: 1,
                created_at: 0,
                author: None,
                board_version: None,
            },
            new_state: new_state.clone(),
            intent: Some(NewIntent {
                tool: "store".into(),
                args: action["args"].clone(),
                idempotency_key: format!("{task}:{step}"),
                side_effect: "effectful".into(),
            }),
            status: None,
            previous_result: None,
            next_observation: None,
            world: None,
            upgrade: None,
        };
        store
            .commit_step(&task, step - 1, &commit)
            .await
            .expect("commit");
        let next_item = format!("item_{}", rng.next(ITEMS));
        let next_shelf = format!("shelf_{}", rng.next(SHELVES));
        store
            .record_action_result(
                &task,
                &ActionResult {
                    step,
                    ok: true,
                    outcome_unknown: false,
                    result: format!("Success: stored {item} on {shelf}."),
                    next_observation: format!(
                        "Success: stored {item} on {shelf}.\nShipment arrived containing {next_item}. Store it on {next_shelf}."
                    ),
                    env_checkpoint: None,
                    delivered: Vec::new(),
                },
            )
            .await
            .expect("result");
        state = new_state;
    }
    task
}

/// p50 and p99 of 1,000 searches for random items, newest 5 hits each, in microseconds.
async fn percentiles(store: &dyn Store, task: &str) -> (f64, f64) {
    let mut rng = Lcg(99);
    let mut times = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let query =
            RecallQuery::new(Some(&format!("item_{}", rng.next(ITEMS))), None).expect("query");
        let started = Instant::now();
        let hits = store
            .search_journal(task, &query, None, 6)
            .await
            .expect("search");
        times.push(started.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(hits);
    }
    times.sort_by(f64::total_cmp);
    (times[499], times[989])
}

fn postgres_url() -> Option<String> {
    match std::env::var("SKILLSTATE_BENCH_POSTGRES_URL") {
        Ok(url) if url == "off" => None,
        Ok(url) if !url.is_empty() => Some(url),
        _ => Some("postgres://postgres@127.0.0.1:5432/test".into()),
    }
}

fn bench(c: &mut Criterion) {
    let runtime = Runtime::new().expect("a tokio runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("recall.db");
    let sqlite = runtime
        .block_on(SqliteStore::open(
            path.to_str().expect("UTF-8"),
            Synchronous::Normal,
        ))
        .expect("open SQLite");
    let task = runtime.block_on(fill(&sqlite));
    let stats = runtime
        .block_on(sqlite.storage_stats(&task))
        .expect("stats");
    let index_bytes: i64 = runtime
        .block_on(
            sqlx::query_scalar(
                "SELECT (SELECT COALESCE(SUM(length(text) + COALESCE(length(pointer), 0) + length(kind) + 24), 0) FROM recall_entries) \
                 + (SELECT COALESCE(SUM(length(block)), 0) FROM recall_fts_data) \
                 + (SELECT COALESCE(SUM(length(term) + 16), 0) FROM recall_fts_idx)",
            )
            .fetch_one(sqlite.pool()),
        )
        .expect("index size");
    let (p50, p99) = runtime.block_on(percentiles(&sqlite, &task));
    println!(
        "recall/sqlite: {} steps; search p50 {p50:.0} µs, p99 {p99:.0} µs; index {:.0} bytes/step (entries + FTS5), journal {:.0} bytes/step, observations {:.0} bytes/step",
        steps(),
        index_bytes as f64 / steps() as f64,
        stats.journal_bytes_per_step(),
        stats.observation_bytes as f64 / steps() as f64,
    );

    let mut group = c.benchmark_group("recall");
    let mut rng = Lcg(5);
    group.bench_function("sqlite/item_newest_5", |b| {
        b.iter(|| {
            let query =
                RecallQuery::new(Some(&format!("item_{}", rng.next(ITEMS))), None).expect("query");
            runtime
                .block_on(sqlite.search_journal(&task, &query, None, 6))
                .expect("search")
        })
    });

    if let Some(url) = postgres_url() {
        let schema = format!("recall_bench_{}", std::process::id());
        match runtime.block_on(PostgresStore::open_in_schema(&url, &schema)) {
            Ok(pg) => {
                let task = runtime.block_on(fill(&pg));
                let sizes: (i64, i64) = runtime
                    .block_on(
                        sqlx::query_as(
                            "SELECT pg_total_relation_size('recall_entries'), pg_total_relation_size('journal')",
                        )
                        .fetch_one(pg.pool()),
                    )
                    .expect("sizes");
                let (p50, p99) = runtime.block_on(percentiles(&pg, &task));
                println!(
                    "recall/postgres: {} steps; search p50 {p50:.0} µs, p99 {p99:.0} µs; index {:.0} bytes/step (table + GIN + btrees), journal {:.0} bytes/step (table + indexes)",
                    steps(),
                    sizes.0 as f64 / steps() as f64,
                    sizes.1 as f64 / steps() as f64,
                );
                group.bench_function("postgres/item_newest_5", |b| {
                    b.iter(|| {
                        let query =
                            RecallQuery::new(Some(&format!("item_{}", rng.next(ITEMS))), None)
                                .expect("query");
                        runtime
                            .block_on(pg.search_journal(&task, &query, None, 6))
                            .expect("search")
                    })
                });
                runtime.block_on(async {
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                            "DROP SCHEMA IF EXISTS {schema} CASCADE"
                        )))
                        .execute(&mut conn)
                        .await;
                    }
                });
            }
            Err(error) => println!("recall/postgres: skipped, cannot open {url}: {error}"),
        }
    } else {
        println!("recall/postgres: skipped (SKILLSTATE_BENCH_POSTGRES_URL=off)");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
