//! Per-step runtime overhead without model or tool: parse + validate + apply (+ commit to
//! SQLite) on the warehouse skill's real schema and a warehouse-sized state.
//!
//! Run: `cargo bench -p skillstate-runtime --bench step_overhead`

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill, StepRules, ToolCatalog, validate_step};
use skillstate_envs::warehouse::{Warehouse, WarehouseConfig};
use skillstate_store::prelude::*;
use skillstate_store::{
    JournalEntry, NewIntent, NewTask, SqliteStore, StepCommit, Synchronous, Verdict,
};
use skillstate_tools::Environment;

fn skill() -> Skill {
    Skill::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse"))
        .expect("the shipped skill loads")
        .skill
}

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

/// Alternately stores item_9 on shelf_499 and ships it again, so the state stays the same size.
fn answer(step: u64) -> String {
    let (patch, tool) = if step % 2 == 1 {
        (json!({"inventory": {"shelf_499": "item_9"}}), "store")
    } else {
        (json!({"inventory": {"shelf_499": null}}), "ship")
    };
    json!({"reasoning": "bench", "state_patch": patch, "action": {"tool": tool, "args": {"item": "item_9", "shelf": "shelf_499"}}})
        .to_string()
}

fn bench(c: &mut Criterion) {
    let skill = skill();
    let env = Warehouse::new(WarehouseConfig::new(1, 10));
    let catalog =
        ToolCatalog::new(env.tools().iter().map(|t| t.spec().clone()).collect()).expect("catalog");
    let rules = StepRules {
        schema: &skill.schema,
        catalog: &catalog,
        state_token_budget: 1500,
    };
    let state = busy_state();
    let raw = answer(1);

    c.bench_function(
        "validate_step (parse + read-only + apply + schema + budget + action)",
        |b| b.iter(|| validate_step(&rules, &state, &raw).expect("valid")),
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for (label, sync) in [("FULL", Synchronous::Full), ("NORMAL", Synchronous::Normal)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("bench.db");
        let store = runtime
            .block_on(SqliteStore::open(path.to_str().expect("utf-8 path"), sync))
            .expect("store");
        let task = runtime
            .block_on(
                store.create_task(
                    NewTask {
                        skill: skill.definition.clone(),
                        tools: catalog
                            .specs()
                            .iter()
                            .filter(|s| s.source != "runtime")
                            .cloned()
                            .collect(),
                        context: ContextStrategy::State,
                        context_budget: None,
                        model: "bench".into(),
                        environment: None,
                        env_checkpoint: None,
                        opening_observation: "start".into(),
                    },
                    &state,
                ),
            )
            .expect("task");
        let mut current = state.clone();
        let mut version = 0u64;
        c.bench_function(
            &format!("step overhead: validate + commit (SQLite WAL, synchronous={label})"),
            |b| {
                b.iter(|| {
                    let step = version + 1;
                    let accepted = validate_step(&rules, &current, &answer(step)).expect("valid");
                    let commit = StepCommit {
                        entry: JournalEntry {
                            step,
                            attempt: 1,
                            verdict: Verdict::Accepted,
                            output: answer(step),
                            patch: Some(accepted.patch.to_value()),
                            action: Some(accepted.action.to_call_json()),
                            errors: None,
                            state_hash: Some(accepted.state_hash.clone()),
                            prompt_tokens: 1100,
                            output_tokens: Some(7),
                            prompt_hash: "0".repeat(64),
                            usage: None,
                            latency_ms: 0,
                            created_at: 0,
                            author: None,
                            board_version: None,
                        },
                        new_state: accepted.new_state.clone(),
                        intent: Some(NewIntent {
                            tool: "store".into(),
                            args: json!({"item": "item_9", "shelf": "shelf_499"}),
                            idempotency_key: format!("{}:{step}", task.id),
                            side_effect: "effectful".into(),
                        }),
                        status: None,
                        previous_result: None,
                        next_observation: None,
                        world: None,
                        upgrade: None,
                    };
                    runtime
                        .block_on(store.commit_step(&task.id, version, &commit))
                        .expect("commit");
                    current = accepted.new_state;
                    version = step;
                })
            },
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(60);
    targets = bench
}
criterion_main!(benches);
