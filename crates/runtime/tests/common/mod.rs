//! Shared set-up for runtime tests: the shipped warehouse skill, a real SQLite file, and a
//! scripted model built from answers in the test.
#![allow(dead_code, clippy::unwrap_used)]

/// Visible skips (see test-support/skip.rs): `skip::skip_test(reason, how_to_enable)`.
#[path = "../../../../test-support/skip.rs"]
pub mod skip;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_core::{ContextStrategy, Skill};
use skillstate_envs::warehouse::{Warehouse, WarehouseConfig, generate_events, reference_answer};
use skillstate_providers::{ModelProvider, ScriptedModel};
use skillstate_runtime::{NoProgress, RunOutcome, Runner, TaskOptions, start_task};
use skillstate_store::{SqliteStore, Store, Synchronous, TaskRecord};

pub fn warehouse_skill_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse")
}

/// The shipped warehouse skill with its environment set to `seed` and `events`.
pub fn warehouse_skill(seed: u64, events: u32) -> Skill {
    let mut skill = Skill::load(&warehouse_skill_dir()).unwrap().skill;
    let mut params = serde_json::Map::new();
    params.insert("seed".into(), json!(seed));
    params.insert("events".into(), json!(events));
    skill.definition.settings.environment = Some(EnvironmentSettings {
        kind: "warehouse".into(),
        params,
    });
    skill
}

pub fn warehouse(seed: u64, events: u32) -> Warehouse {
    Warehouse::new(WarehouseConfig::new(seed, events))
}

pub async fn sqlite_store(dir: &Path) -> (Arc<SqliteStore>, PathBuf) {
    let path = dir.join("skillstate.db");
    let store = SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
        .await
        .unwrap();
    (Arc::new(store), path)
}

pub fn scripted(outputs: Vec<String>) -> Arc<dyn ModelProvider> {
    Arc::new(ScriptedModel::from_outputs("test.jsonl".into(), outputs))
}

pub fn correct_answers(seed: u64, events: u32) -> Vec<String> {
    generate_events(&WarehouseConfig::new(seed, events))
        .iter()
        .map(reference_answer)
        .collect()
}

/// Starts and runs a warehouse task to its end with the `state` strategy.
pub async fn run_warehouse(
    store: Arc<dyn Store>,
    skill: &Skill,
    seed: u64,
    events: u32,
    answers: Vec<String>,
) -> (TaskRecord, RunOutcome) {
    run_warehouse_with(
        store,
        skill,
        seed,
        events,
        answers,
        ContextStrategy::State,
        None,
    )
    .await
}

pub async fn run_warehouse_with(
    store: Arc<dyn Store>,
    skill: &Skill,
    seed: u64,
    events: u32,
    answers: Vec<String>,
    context: ContextStrategy,
    context_budget: Option<usize>,
) -> (TaskRecord, RunOutcome) {
    let mut env = warehouse(seed, events);
    let model = scripted(answers);
    let options = TaskOptions {
        model: model.spec(),
        context,
        context_budget,
        environment: None,
        secrets: Default::default(),
    };
    let task = start_task(store.as_ref(), skill, &mut env, &options)
        .await
        .unwrap();
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    (store.task(&task.id).await.unwrap(), outcome)
}

/// The `state` column exactly as stored.
pub async fn raw_state(store: &SqliteStore, task: &str) -> String {
    sqlx::query_scalar("SELECT state FROM tasks WHERE id = ?")
        .bind(task)
        .fetch_one(store.pool())
        .await
        .unwrap()
}
