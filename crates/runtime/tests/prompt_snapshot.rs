//! The exact prompt the `state` strategy renders, pinned by snapshots: at step 1, at step 5 of
//! the demo, with an over-long observation, and on a retry.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::json;
use skillstate_core::prompt::PromptInput;
use skillstate_core::validate::Document;
use skillstate_core::{ContextStrategy, Rejection, RejectionKind, ToolCatalog, render};
use skillstate_runtime::rebuild_prompt;
use skillstate_tools::Environment;

#[tokio::test]
async fn state_prompt_at_step_1_and_step_5() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = warehouse_skill(7, 10);
    let (task, _) = run_warehouse(store.clone(), &skill, 7, 10, correct_answers(7, 10)).await;
    let (step1, _) = rebuild_prompt(store.as_ref(), &task, 1, 1).await.unwrap();
    let (step5, _) = rebuild_prompt(store.as_ref(), &task, 5, 1).await.unwrap();
    assert_eq!(
        step1.prefix, step5.prefix,
        "the stable prefix must not change between steps"
    );
    insta::assert_snapshot!("state_prompt_step_1", step1.text());
    insta::assert_snapshot!("state_prompt_step_5_body", step5.body);
}

/// Every strategy's prompt at step 5 of the same run: same prefix, different context.
#[tokio::test]
async fn every_strategy_at_step_5() {
    let skill = warehouse_skill(7, 10);
    let mut prefixes = Vec::new();
    for strategy in ContextStrategy::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = sqlite_store(tmp.path()).await;
        // A small window budget so that the window visibly drops steps.
        let budget = (strategy == ContextStrategy::Window).then_some(1350);
        let (task, _) = run_warehouse_with(
            store.clone(),
            &skill,
            7,
            10,
            correct_answers(7, 10),
            strategy,
            budget,
        )
        .await;
        let (prompt, recorded) = rebuild_prompt(store.as_ref(), &task, 5, 1).await.unwrap();
        assert_eq!(
            skillstate_core::json::text_hash(&prompt.text()),
            recorded,
            "{strategy:?}"
        );
        insta::assert_snapshot!(format!("step_5_body_{}", strategy.as_str()), prompt.body);
        prefixes.push(prompt.prefix);
    }
    assert!(
        prefixes.windows(2).all(|w| w[0] == w[1]),
        "all strategies share the stable prefix"
    );
}

#[test]
fn long_observations_are_cut_and_retries_carry_errors() {
    let skill = warehouse_skill(7, 10);
    let env = warehouse(7, 10);
    let catalog = ToolCatalog::new(env.tools().iter().map(|t| t.spec().clone()).collect()).unwrap();
    let observation = format!(
        "Customer ordered item_12.\n{}",
        "Sensor 4 humidity 41%. ".repeat(200)
    );
    let retry = vec![Rejection {
        kind: RejectionKind::Schema,
        document: Document::State,
        pointer: "/inventory/shelf_3".into(),
        message: "after the patch the state breaks the schema: 7 is not of type \"string\"".into(),
    }];
    let prompt = render(
        ContextStrategy::State,
        &PromptInput {
            skill: &skill.definition,
            tools: catalog.specs(),
            read_only: &["/shelf_count".to_owned()],
            state: &json!({"shelf_count": 500, "inventory": {"shelf_42": "item_12"}}),
            observation: &observation,
            observation_budget: 40,
            retry: &retry,
            turns: &[],
            context_budget: None,
        },
    );
    assert!(prompt.body.contains("[observation truncated: first 40 of"));
    insta::assert_snapshot!("state_prompt_truncated_with_retry_body", prompt.body);
}

/// The schema constrained decoding uses for the warehouse skill: reasoning first, the
/// inventory as an optional, nullable merge patch without the read-only shelf count, and one
/// action branch per tool.
#[test]
fn derived_step_schema_for_the_warehouse() {
    let skill = warehouse_skill(7, 10);
    let env = warehouse(7, 10);
    let catalog = ToolCatalog::new(env.tools().iter().map(|t| t.spec().clone()).collect()).unwrap();
    let schema = skillstate_core::step_output_schema(&skill.schema, catalog.specs());
    insta::assert_snapshot!(
        "warehouse_step_schema",
        serde_json::to_string_pretty(&schema).unwrap()
    );
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    for answer in correct_answers(7, 10) {
        let value: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert!(validator.is_valid(&value), "{answer}");
    }
    let writes_read_only = json!({"reasoning": "", "state_patch": {"shelf_count": 1}, "action": {"tool": "wait", "args": {}}});
    assert!(!validator.is_valid(&writes_read_only));
}
