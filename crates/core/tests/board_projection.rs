//! Nothing outside a reader's projection appears in what core writes for it, whatever the
//! board's schema: random schemas with root-level and cross-member keywords (test-support/
//! board_cases.rs), random scopes, valid and invalid writes, on the board as created and after
//! another writer changed (even broke) the parts the scope does not read. Checked: every
//! rejection of a member's answer (its pointer and message), the same patch checked as the
//! service checks a limited key's write, the conflict rejections, and the schema the reader is
//! shown. Write-only values count as hidden too: these texts are kept in journals whose readers
//! never see them.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/board_cases.rs"]
mod board_cases;

use board_cases::BoardCase;
use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::board::{
    BoardRules, BoardScope, BoardTable, check_writes, conflict_rejections, project, project_schema,
    rebase, validate_board_step,
};
use skillstate_core::{Rejection, StatePatch, StateSchema, StepRules, ToolCatalog, validate_patch};

fn scope_of(case: &BoardCase) -> BoardScope {
    BoardScope::parse(&BoardTable {
        reads: case.reads.clone(),
        writes: case.writes.clone(),
    })
    .unwrap()
}

fn text(rejections: &[Rejection]) -> String {
    rejections
        .iter()
        .map(|r| format!("{} {}\n", r.pointer, r.message))
        .collect()
}

fn merged(state: &Value, patch: &Value) -> Value {
    StatePatch::from_value(patch).unwrap().apply(state).unwrap()
}

/// Everything core writes for the limited reader of `case`, on each state the board goes
/// through.
fn everything_written(case: &BoardCase) -> Vec<String> {
    let schema = StateSchema::compile(case.schema.clone()).unwrap();
    let scope = scope_of(case);
    let task_schema = StateSchema::compile(json!({"type": "object"})).unwrap();
    let catalog = ToolCatalog::new(Vec::new()).unwrap();
    let rules = StepRules {
        schema: &task_schema,
        catalog: &catalog,
        state_token_budget: 10_000,
    };
    let board_rules = BoardRules {
        schema: &schema,
        scope: &scope,
    };
    let mut states = vec![case.initial.clone()];
    for other in &case.others {
        let next = merged(states.last().unwrap(), other);
        states.push(next);
    }
    let mut out = vec![project_schema(&case.schema, &scope.reads).to_string()];
    for state in &states {
        for attempt in &case.attempts {
            // A member's answer.
            let answer = json!({
                "reasoning": "r",
                "state_patch": {"board": attempt},
                "action": {"tool": "finish", "args": {"result": "done"}}
            });
            if let Err(rejected) =
                validate_board_step(&rules, &board_rules, &json!({}), state, &answer.to_string())
            {
                out.push(text(&rejected.rejections));
            }
            // The same patch from an API key limited to the scope.
            let patch = StatePatch::from_value(attempt).unwrap();
            match check_writes(&patch, state, &scope) {
                Err(outside) => out.push(text(&outside)),
                Ok(()) => {
                    if let Err(refused) = validate_patch(
                        &schema,
                        1_000_000,
                        state,
                        attempt,
                        &schema.view_of(&scope.reads),
                    ) {
                        out.push(text(&refused));
                    }
                    // Computed on the initial board, met with the other writer's changes.
                    if let Err(conflict) = rebase(&patch, &case.initial, state) {
                        out.push(text(&conflict_rejections(
                            &conflict,
                            state,
                            &scope,
                            &schema,
                            &Default::default(),
                        )));
                    }
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_hidden_member_name_or_value_in_anything_core_writes_for_a_reader(seed in any::<u64>()) {
        let case = BoardCase::generate(seed);
        let hidden = case.hidden(true);
        prop_assert!(!hidden.is_empty());
        // The model itself is shown write-only values: its view hides the rest.
        let scope = scope_of(&case);
        let model_hidden = case.hidden(false);
        let mut states = vec![case.initial.clone()];
        for other in &case.others {
            let next = merged(states.last().unwrap(), other);
            states.push(next);
        }
        for state in &states {
            let shown = project(state, &scope).to_string();
            let leaks = BoardCase::leaks(&model_hidden, &shown);
            prop_assert!(leaks.is_empty(), "{leaks:?} in {shown}");
        }
        for written in everything_written(&case) {
            let leaks = BoardCase::leaks(&hidden, &written);
            prop_assert!(leaks.is_empty(), "{leaks:?} in {written}\ncase: {case:#?}");
        }
    }
}

/// The example of the issue: an agent limited to `/pub` writes a new member under a root
/// `maxProperties`; the refusal names the root as a rule about a part it cannot read.
#[test]
fn a_root_max_properties_refusal_names_no_hidden_member() {
    let schema = StateSchema::compile(json!({
        "type": "object",
        "maxProperties": 2,
        "properties": {"pub": {"type": "object"}, "vault": {"type": "object"}}
    }))
    .unwrap();
    let scope = BoardScope::parse(&BoardTable {
        reads: vec!["/pub".into(), "/extra".into()],
        writes: vec!["/extra".into()],
    })
    .unwrap();
    let board = json!({"pub": {}, "vault": {"pin": "vault-pin-4242"}});
    let refused = validate_patch(
        &schema,
        1000,
        &board,
        &json!({"extra": 1}),
        &schema.view_of(&scope.reads),
    )
    .unwrap_err();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].pointer, "");
    assert!(
        refused[0].message.contains("a part you cannot read"),
        "{}",
        refused[0]
    );
    assert!(!text(&refused).contains("vault"), "{}", text(&refused));
    // A reader of the whole board is told what the rule is, still without the values.
    let whole = validate_patch(
        &schema,
        1000,
        &board,
        &json!({"extra": 1}),
        &schema.whole_view(),
    )
    .unwrap_err();
    assert!(
        whole[0]
            .message
            .ends_with("the value has more than 2 properties"),
        "{}",
        whole[0]
    );
    assert!(!text(&whole).contains("vault-pin"), "{}", text(&whole));
}
