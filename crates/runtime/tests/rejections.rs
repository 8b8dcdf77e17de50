//! Bad answers against a real SQLite file: each is rejected with its JSON pointer, the stored
//! state stays byte-identical, the retry prompt carries the error, and retries are bounded.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use skillstate_core::ContextStrategy;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, rebuild_prompt, start_task};
use skillstate_store::prelude::*;
use skillstate_store::{TaskStatus, Verdict};

struct Case {
    name: &'static str,
    answer: String,
    pointer: &'static str,
    budget: Option<usize>,
}

fn answer(patch: serde_json::Value, action: serde_json::Value) -> String {
    json!({"reasoning": "x", "state_patch": patch, "action": action}).to_string()
}

fn cases(first_event_answer: &str) -> Vec<Case> {
    let good: serde_json::Value = serde_json::from_str(first_event_answer).unwrap();
    let action = good["action"].clone();
    vec![
        Case {
            name: "deletes a required key",
            answer: answer(json!({"inventory": null}), action.clone()),
            pointer: "the whole state (pointer \"\")",
            budget: None,
        },
        Case {
            name: "writes a read-only field",
            answer: answer(json!({"shelf_count": 10}), action.clone()),
            pointer: "/shelf_count",
            budget: None,
        },
        Case {
            name: "breaks a type",
            answer: answer(json!({"inventory": {"shelf_9": 9}}), action.clone()),
            pointer: "/inventory/shelf_9",
            budget: None,
        },
        Case {
            name: "exceeds the state budget",
            answer: answer(good["state_patch"].clone(), action.clone()),
            pointer: "the whole state (pointer \"\")",
            budget: Some(12),
        },
        Case {
            name: "names an unknown tool",
            answer: answer(json!({}), json!({"tool": "teleport", "args": {}})),
            pointer: "/action/tool",
            budget: None,
        },
        Case {
            name: "passes bad tool args",
            answer: answer(
                json!({}),
                json!({"tool": "store", "args": {"item": "item_1", "shelf": 12}}),
            ),
            pointer: "/action/args/shelf",
            budget: None,
        },
    ]
}

#[tokio::test]
async fn every_bad_answer_is_rejected_without_touching_the_state() {
    let first = correct_answers(7, 10).remove(0);
    for case in cases(&first) {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = sqlite_store(tmp.path()).await;
        let mut skill = warehouse_skill(7, 10);
        if let Some(budget) = case.budget {
            skill.definition.settings.budgets.state_tokens = budget;
        }
        let mut env = warehouse(7, 10);
        let retries = skill.settings().run.max_retries;
        let model = scripted(vec![case.answer.clone(); retries as usize + 1]);
        let task = start_task(
            store.as_ref(),
            &skill,
            &mut env,
            &TaskOptions::new(model.spec(), ContextStrategy::State),
        )
        .await
        .unwrap();
        let before = raw_state(&store, &task.id).await;

        let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
            .run(&task.id)
            .await
            .unwrap();

        assert_eq!(outcome.status, TaskStatus::Failed, "{}", case.name);
        assert_eq!(
            raw_state(&store, &task.id).await,
            before,
            "{}: stored state changed",
            case.name
        );
        let stored = store.task(&task.id).await.unwrap();
        assert_eq!(stored.version, 0, "{}", case.name);
        let reason = stored.outcome.unwrap();
        assert_eq!(reason["reason"], "rejected", "{}", case.name);
        assert!(
            reason["message"].as_str().unwrap().contains(case.pointer),
            "{}: {reason}",
            case.name
        );

        let journal = store.journal(&task.id).await.unwrap();
        assert_eq!(
            journal.len(),
            retries as usize + 1,
            "{}: retries must be bounded",
            case.name
        );
        assert!(
            journal
                .iter()
                .all(|e| e.verdict == Verdict::Rejected && e.patch.is_none())
        );
        let errors = journal[0].errors.as_ref().unwrap().to_string();
        let expected_pointer = case
            .pointer
            .trim_start_matches("the whole state (pointer \"\")");
        assert!(
            errors.contains(&format!("\"pointer\":\"{expected_pointer}\"")),
            "{}: {errors}",
            case.name
        );

        let (retry_prompt, recorded) =
            rebuild_prompt(store.as_ref(), &stored_task(&store, &task.id).await, 1, 2)
                .await
                .unwrap();
        let text = retry_prompt.text();
        assert_eq!(
            skillstate_core::json::text_hash(&text),
            recorded,
            "{}",
            case.name
        );
        assert!(
            text.contains("# Your previous answer was rejected"),
            "{}",
            case.name
        );
        assert!(
            text.contains(case.pointer),
            "{}: retry prompt lacks the pointer",
            case.name
        );
        let (first_prompt, _) =
            rebuild_prompt(store.as_ref(), &stored_task(&store, &task.id).await, 1, 1)
                .await
                .unwrap();
        assert!(!first_prompt.text().contains("rejected"), "{}", case.name);
    }
}

async fn stored_task(
    store: &Arc<skillstate_store::SqliteStore>,
    id: &str,
) -> skillstate_store::TaskRecord {
    store.task(id).await.unwrap()
}

#[tokio::test]
async fn a_rejected_answer_is_retried_and_the_task_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let mut answers = correct_answers(7, 10);
    answers.insert(
        2,
        answer(
            json!({"inventory": {"shelf_9": 9}}),
            json!({"tool": "wait", "args": {}}),
        ),
    );
    let skill = warehouse_skill(7, 10);
    let (task, outcome) = run_warehouse(store.clone(), &skill, 7, 10, answers).await;
    assert_eq!(outcome.status, TaskStatus::Completed);
    assert_eq!(task.version, 10);
    assert_eq!(task.outcome.unwrap()["environment"]["score"], 1.0);
    let journal = store.journal(&task.id).await.unwrap();
    let step3: Vec<_> = journal.iter().filter(|e| e.step == 3).collect();
    assert_eq!(step3.len(), 2);
    assert_eq!(step3[0].verdict, Verdict::Rejected);
    assert_eq!(step3[1].verdict, Verdict::Accepted);
}
