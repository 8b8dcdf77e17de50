//! Time travel over random patch sequences on a real SQLite file: the state rebuilt for every
//! step N equals the hash recorded when step N was committed, whatever the snapshot interval.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::{ContextStrategy, SkillDefinition, StatePatch};
use skillstate_store::*;

fn definition() -> SkillDefinition {
    SkillDefinition {
        name: "free".into(),
        description: "free-form state".into(),
        metadata: None,
        procedure: "anything".into(),
        schema: json!({"type": "object"}),
        initial_state: json!({}),
        settings: Default::default(),
    }
}

fn new_task() -> NewTask {
    NewTask {
        skill: definition(),
        tools: Vec::new(),
        context: ContextStrategy::State,
        context_budget: None,
        model: "scripted:test".into(),
        environment: None,
        env_checkpoint: None,
        opening_observation: "start".into(),
    }
}

fn accepted(step: u64, patch: &Value, hash: &str) -> JournalEntry {
    JournalEntry {
        step,
        attempt: 1,
        verdict: Verdict::Accepted,
        output: patch.to_string(),
        patch: Some(patch.clone()),
        action: Some(json!({"tool": "wait", "args": {}})),
        errors: None,
        state_hash: Some(hash.to_owned()),
        prompt_tokens: 1,
        prompt_hash: "x".into(),
        usage: None,
        latency_ms: 0,
        created_at: 0,
    }
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i16>().prop_map(|n| json!(n)),
        "[a-z]{0,5}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool)
    ]
}

/// A patch candidate: merge patches over a few keys (nested objects and null deletes included),
/// or JSON Patch operations. Candidates that do not apply are skipped by the test.
fn patch() -> impl Strategy<Value = Value> {
    let key = prop_oneof![Just("a"), Just("b"), Just("c"), Just("d")];
    let merge_value = prop_oneof![
        3 => scalar(),
        1 => Just(Value::Null),
        1 => prop::collection::btree_map("[xyz]", prop_oneof![scalar(), Just(Value::Null)], 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
    ];
    let merge = prop::collection::btree_map(key.clone(), merge_value, 0..3)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    let op = prop_oneof![
        (key.clone(), scalar())
            .prop_map(|(k, v)| json!({"op": "add", "path": format!("/{k}"), "value": v})),
        key.clone()
            .prop_map(|k| json!({"op": "remove", "path": format!("/{k}")})),
        (key, scalar())
            .prop_map(|(k, v)| json!({"op": "replace", "path": format!("/{k}"), "value": v})),
    ];
    prop_oneof![
        merge,
        prop::collection::vec(op, 1..3).prop_map(Value::Array)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_step_rebuilds_to_its_recorded_hash(patches in prop::collection::vec(patch(), 1..40), every in 1u64..8) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("t.db");
            let store = SqliteStore::open(path.to_str().unwrap(), Synchronous::Normal).await.unwrap().with_snapshot_every(every);
            let task = store.create_task(new_task(), &json!({})).await.unwrap();
            let mut state = json!({});
            let mut hashes = vec![state_hash(&state)];
            for candidate in patches {
                let Ok(parsed) = StatePatch::from_value(&candidate) else { continue };
                let Ok(next) = parsed.apply(&state) else { continue };
                let step = hashes.len() as u64;
                let hash = state_hash(&next);
                let commit = StepCommit { entry: accepted(step, &candidate, &hash), new_state: next.clone(), intent: None, status: None };
                store.commit_step(&task.id, step - 1, &commit).await.unwrap();
                state = next;
                hashes.push(hash);
            }
            let version = hashes.len() as u64 - 1;
            let stored = store.task(&task.id).await.unwrap();
            assert_eq!(stored.version, version);
            assert_eq!(stored.state, state);
            for (step, hash) in hashes.iter().enumerate() {
                let rebuilt = state_at(&store, &task.id, step as u64, version).await.unwrap();
                assert_eq!(&state_hash(&rebuilt), hash, "step {step} with snapshots every {every}");
            }
        });
    }
}

#[tokio::test]
async fn a_tampered_patch_is_caught_at_its_step() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.db");
    let store = SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
        .await
        .unwrap();
    let task = store.create_task(new_task(), &json!({})).await.unwrap();
    let mut state = json!({});
    for step in 1..=5u64 {
        let patch = json!({ format!("k{step}"): step });
        let next = StatePatch::from_value(&patch)
            .unwrap()
            .apply(&state)
            .unwrap();
        let commit = StepCommit {
            entry: accepted(step, &patch, &state_hash(&next)),
            new_state: next.clone(),
            intent: None,
            status: None,
        };
        store
            .commit_step(&task.id, step - 1, &commit)
            .await
            .unwrap();
        state = next;
    }
    sqlx::query("UPDATE journal SET patch = '{\"k3\": 99}' WHERE task_id = ? AND step = 3")
        .bind(&task.id)
        .execute(store.pool())
        .await
        .unwrap();
    assert!(state_at(&store, &task.id, 2, 5).await.is_ok());
    let error = state_at(&store, &task.id, 5, 5).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt { step: 3, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn a_stale_writer_gets_a_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.db");
    let store = SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
        .await
        .unwrap();
    let task = store.create_task(new_task(), &json!({})).await.unwrap();
    let first = json!({"a": 1});
    let commit = StepCommit {
        entry: accepted(1, &first, &state_hash(&first)),
        new_state: first.clone(),
        intent: None,
        status: None,
    };
    store.commit_step(&task.id, 0, &commit).await.unwrap();
    let second = json!({"a": 2});
    let stale = StepCommit {
        entry: accepted(1, &second, &state_hash(&second)),
        new_state: second,
        intent: None,
        status: None,
    };
    let error = store.commit_step(&task.id, 0, &stale).await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Conflict {
                expected: 0,
                actual: 1,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(store.task(&task.id).await.unwrap().state, first);
    assert_eq!(store.journal(&task.id).await.unwrap().len(), 1);
}
