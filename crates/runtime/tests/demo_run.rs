//! The shipped demo end to end on a real SQLite file: the task completes, prompts stay flat,
//! every step's state and prompt can be rebuilt from the journal.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use skillstate_core::json::{state_hash, text_hash};
use skillstate_providers::ScriptedModel;
use skillstate_runtime::rebuild_prompt;
use skillstate_store::prelude::*;
use skillstate_store::{TaskStatus, Verdict, state_at};

fn demo_answers() -> Vec<String> {
    let path = warehouse_skill_dir().join("examples/demo.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let model = ScriptedModel::from_file(&path).unwrap();
    assert_eq!(model.len(), 10);
    text.lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn the_demo_completes_with_flat_prompts_and_rebuildable_history() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = skillstate_core::Skill::load(&warehouse_skill_dir())
        .unwrap()
        .skill;
    let (task, outcome) = run_warehouse(store.clone(), &skill, 7, 10, demo_answers()).await;

    assert_eq!(outcome.status, TaskStatus::Completed);
    assert_eq!(task.version, 10);
    let environment = &task.outcome.as_ref().unwrap()["environment"];
    assert_eq!(environment["score"], 1.0);
    assert_eq!(
        task.state,
        serde_json::json!({"shelf_count": 500, "inventory": {"shelf_129": "item_601"}})
    );

    let journal = store.journal(&task.id).await.unwrap();
    assert_eq!(journal.len(), 10);
    assert!(journal.iter().all(|e| e.verdict == Verdict::Accepted));
    let first = journal[0].prompt_tokens as f64;
    let tenth = journal[9].prompt_tokens as f64;
    assert!(
        (tenth - first).abs() / first <= 0.15,
        "step 1: {first} tokens, step 10: {tenth}"
    );

    // The reasoning is journaled but never shown to the model again.
    for entry in &journal {
        let (prompt, recorded) = rebuild_prompt(store.as_ref(), &task, entry.step, entry.attempt)
            .await
            .unwrap();
        let text = prompt.text();
        assert_eq!(
            text_hash(&text),
            recorded,
            "step {} prompt is not byte-identical",
            entry.step
        );
        assert_eq!(
            skillstate_core::count_tokens(&text) as u64,
            entry.prompt_tokens
        );
        assert!(
            !text.contains("following the procedure") && !text.contains("store it and record it")
        );
        let state = state_at(store.as_ref(), &task.id, entry.step, task.version)
            .await
            .unwrap();
        assert_eq!(
            Some(state_hash(&state)),
            entry.state_hash,
            "step {}",
            entry.step
        );
    }
    let last = state_at(store.as_ref(), &task.id, 10, task.version)
        .await
        .unwrap();
    assert_eq!(last, task.state);
    assert!(
        state_at(store.as_ref(), &task.id, 11, task.version)
            .await
            .is_err()
    );

    let intents = store.intents(&task.id).await.unwrap();
    assert_eq!(intents.len(), 10);
    assert!(
        intents
            .iter()
            .all(|i| i.done && i.ok == Some(true) && i.side_effect == "effectful")
    );
    assert_eq!(intents[3].idempotency_key, format!("{}:4", task.id));
}

#[tokio::test]
async fn a_run_on_a_finished_task_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = warehouse_skill(7, 10);
    let (task, _) = run_warehouse(store.clone(), &skill, 7, 10, demo_answers()).await;
    let mut env = warehouse(7, 10);
    let again = skillstate_runtime::Runner::new(
        store.clone(),
        scripted(vec![]),
        &mut env,
        &mut skillstate_runtime::NoProgress,
    )
    .run(&task.id)
    .await
    .unwrap();
    assert_eq!(again.status, TaskStatus::Completed);
    assert_eq!(store.task(&task.id).await.unwrap(), task);
}
