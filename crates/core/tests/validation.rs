//! The validation pipeline on the warehouse skill's real schema: every kind of bad answer is
//! rejected with a pointer, the current state is never touched, and arbitrary input never panics.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::validate::Document;
use skillstate_core::{
    RejectionKind, SideEffect, Skill, StepRules, ToolCatalog, ToolSpec, validate_step,
};

fn skill() -> Skill {
    Skill::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse"))
        .unwrap()
        .skill
}

fn catalog() -> ToolCatalog {
    let shelf = json!({"type": "string", "pattern": "^shelf_[0-9]+$"});
    ToolCatalog::new(vec![ToolSpec {
        name: "ship".into(),
        description: "Ship an item".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"item": {"type": "string"}, "shelf": shelf},
            "required": ["item", "shelf"],
            "additionalProperties": false
        }),
        side_effect: SideEffect::Effectful,
        source: "warehouse".into(),
        needs_approval: false,
    }])
    .unwrap()
}

fn state() -> Value {
    json!({"shelf_count": 500, "inventory": {"shelf_1": "item_1", "shelf_2": "item_2"}})
}

fn answer(patch: Value, action: Value) -> String {
    json!({"reasoning": "r", "state_patch": patch, "action": action}).to_string()
}

fn ship() -> Value {
    json!({"tool": "ship", "args": {"item": "item_1", "shelf": "shelf_1"}})
}

/// Runs one answer and returns `(kind, pointer)` of each rejection.
fn rejections(answer: &str, budget: usize) -> Vec<(RejectionKind, Document, String)> {
    let skill = skill();
    let catalog = catalog();
    let rules = StepRules {
        schema: &skill.schema,
        catalog: &catalog,
        state_token_budget: budget,
    };
    let before = state();
    let result = validate_step(&rules, &before, answer);
    assert_eq!(before, state(), "validation must not modify the state");
    match result {
        Ok(accepted) => panic!("expected a rejection, got {accepted:?}"),
        Err(rejected) => {
            for r in &rejected.rejections {
                assert!(!r.message.is_empty());
            }
            rejected
                .rejections
                .into_iter()
                .map(|r| (r.kind, r.document, r.pointer))
                .collect()
        }
    }
}

#[test]
fn accepts_a_correct_step() {
    let skill = skill();
    let catalog = catalog();
    let rules = StepRules {
        schema: &skill.schema,
        catalog: &catalog,
        state_token_budget: 1500,
    };
    let accepted = validate_step(
        &rules,
        &state(),
        &answer(json!({"inventory": {"shelf_1": null}}), ship()),
    )
    .unwrap();
    assert_eq!(
        accepted.new_state,
        json!({"shelf_count": 500, "inventory": {"shelf_2": "item_2"}})
    );
    assert_eq!(accepted.state_hash, state_hash(&accepted.new_state));
    assert_eq!(accepted.reasoning, "r");
}

#[test]
fn deleting_a_required_key() {
    let got = rejections(&answer(json!({"inventory": null}), ship()), 1500);
    assert_eq!(
        got,
        vec![(RejectionKind::Schema, Document::State, String::new())]
    );
}

#[test]
fn writing_a_read_only_field() {
    let got = rejections(&answer(json!({"shelf_count": 501}), ship()), 1500);
    assert_eq!(
        got,
        vec![(
            RejectionKind::ReadOnly,
            Document::State,
            "/shelf_count".into()
        )]
    );
    let got = rejections(
        &answer(json!([{"op": "remove", "path": "/shelf_count"}]), ship()),
        1500,
    );
    assert_eq!(
        got,
        vec![(
            RejectionKind::ReadOnly,
            Document::State,
            "/shelf_count".into()
        )]
    );
}

#[test]
fn breaking_a_type() {
    let got = rejections(&answer(json!({"inventory": {"shelf_3": 7}}), ship()), 1500);
    assert_eq!(
        got,
        vec![(
            RejectionKind::Schema,
            Document::State,
            "/inventory/shelf_3".into()
        )]
    );
}

#[test]
fn exceeding_the_state_budget() {
    let got = rejections(
        &answer(json!({"inventory": {"shelf_3": "item_3"}}), ship()),
        10,
    );
    assert_eq!(
        got,
        vec![(RejectionKind::StateBudget, Document::State, String::new())]
    );
}

#[test]
fn naming_an_unknown_tool() {
    let got = rejections(
        &answer(json!({}), json!({"tool": "teleport", "args": {}})),
        1500,
    );
    assert_eq!(
        got,
        vec![(
            RejectionKind::UnknownTool,
            Document::Output,
            "/action/tool".into()
        )]
    );
}

#[test]
fn passing_bad_tool_args() {
    let got = rejections(
        &answer(
            json!({}),
            json!({"tool": "ship", "args": {"item": "item_1", "shelf": 4}}),
        ),
        1500,
    );
    assert_eq!(
        got,
        vec![(
            RejectionKind::ToolArgs,
            Document::Output,
            "/action/args/shelf".into()
        )]
    );
}

#[test]
fn patch_and_action_problems_are_reported_together() {
    let got = rejections(
        &answer(
            json!({"inventory": {"shelf_3": 7}}),
            json!({"tool": "nope"}),
        ),
        1500,
    );
    assert_eq!(
        got,
        vec![
            (
                RejectionKind::Schema,
                Document::State,
                "/inventory/shelf_3".into()
            ),
            (
                RejectionKind::UnknownTool,
                Document::Output,
                "/action/tool".into()
            ),
        ]
    );
}

#[test]
fn malformed_patches_and_outputs() {
    let got = rejections(&answer(json!("add item_3"), ship()), 1500);
    assert_eq!(
        got,
        vec![(
            RejectionKind::PatchShape,
            Document::Output,
            "/state_patch".into()
        )]
    );
    let got = rejections(
        &answer(
            json!([{"op": "remove", "path": "/inventory/shelf_9"}]),
            ship(),
        ),
        1500,
    );
    assert_eq!(
        got,
        vec![(
            RejectionKind::PatchApply,
            Document::State,
            "/inventory/shelf_9".into()
        )]
    );
    let got = rejections("I shipped it.", 1500);
    assert_eq!(got[0].0, RejectionKind::Parse);
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z_0-9]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("inventory".to_owned()),
                    Just("shelf_count".to_owned()),
                    "shelf_[0-9]{1,3}",
                    "[a-z]{1,6}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the model sends, validation never panics, never changes the current state, and
    /// an accepted state always satisfies the schema with read-only fields untouched.
    #[test]
    fn any_patch_is_either_safe_or_rejected(patch in json_value(), raw_action in json_value()) {
        let skill = skill();
        let catalog = catalog();
        let rules = StepRules { schema: &skill.schema, catalog: &catalog, state_token_budget: 1500 };
        let before = state();
        let action = if raw_action.is_object() { ship() } else { raw_action };
        let result = validate_step(&rules, &before, &answer(patch, action));
        prop_assert_eq!(&before, &state());
        if let Ok(accepted) = result {
            prop_assert!(skill.schema.is_valid(&accepted.new_state));
            prop_assert_eq!(&accepted.new_state["shelf_count"], &json!(500));
            prop_assert_eq!(accepted.state_hash, state_hash(&accepted.new_state));
        }
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let skill = skill();
        let catalog = catalog();
        let rules = StepRules { schema: &skill.schema, catalog: &catalog, state_token_budget: 1500 };
        let _ = validate_step(&rules, &state(), &text);
    }
}

/// A patch given directly (the service's state writes) passes the same checks as a model's
/// `state_patch`: same verdicts, same pointers without the `/state_patch` prefix.
#[test]
fn a_direct_patch_gets_the_same_verdicts_as_a_models_patch() {
    let skill = skill();
    let catalog = catalog();
    let rules = StepRules {
        schema: &skill.schema,
        catalog: &catalog,
        state_token_budget: 2000,
    };
    let cases = [
        json!({"inventory": {"shelf_3": "item_3"}}),
        json!({"shelf_count": 7}),
        json!({"inventory": {"shelf_1": 5}}),
        json!([{"op": "remove", "path": "/inventory/shelf_9"}]),
        json!([{"op": "jump", "path": "/x"}]),
        json!([{"op": "add", "path": "/inventory/shelf_4", "value": "item_4"}]),
        json!("not a patch"),
    ];
    let (mut accepted, mut rejected) = (0, 0);
    for patch in cases {
        let model = validate_step(&rules, &state(), &answer(patch.clone(), ship()));
        let direct = skillstate_core::validate_patch(
            &skill.schema,
            2000,
            &state(),
            &patch,
            &skill.schema.whole_view(),
        );
        match (model, direct) {
            (Ok(model), Ok(direct)) => {
                assert_eq!(direct.new_state, model.new_state, "{patch}");
                assert_eq!(direct.state_hash, model.state_hash, "{patch}");
                accepted += 1;
            }
            (Err(model), Err(direct)) => {
                let expected: Vec<(RejectionKind, String)> = model
                    .rejections
                    .iter()
                    .map(|r| {
                        let pointer = r
                            .pointer
                            .strip_prefix("/state_patch")
                            .unwrap_or(&r.pointer)
                            .to_owned();
                        (r.kind, pointer)
                    })
                    .collect();
                let got: Vec<(RejectionKind, String)> =
                    direct.iter().map(|r| (r.kind, r.pointer.clone())).collect();
                assert_eq!(got, expected, "{patch}");
                assert!(!got.is_empty());
                rejected += 1;
            }
            (model, direct) => panic!("{patch}: model {model:?} vs direct {direct:?}"),
        }
    }
    assert!(
        accepted >= 2 && rejected >= 4,
        "{accepted} accepted, {rejected} rejected"
    );
}
