//! Model JSON is parsed strictly (issue 9 item 11): duplicate keys and integers beyond 2^53
//! are refused as parse errors with the pointer of the offending value.
#![allow(clippy::unwrap_used)]

use serde_json::json;
use skillstate_core::schema::StateSchema;
use skillstate_core::strict_json::parse_strict;
use skillstate_core::{RejectionKind, SideEffect, StepRules, ToolCatalog, ToolSpec, validate_step};

fn parse_rejection(raw: &str) -> (RejectionKind, String, String) {
    let schema = StateSchema::compile(json!({"type": "object"})).unwrap();
    let catalog = ToolCatalog::new(vec![ToolSpec {
        name: "wait".into(),
        description: "Wait".into(),
        input_schema: json!({"type": "object"}),
        side_effect: SideEffect::ReadOnly,
        source: "test".into(),
        needs_approval: false,
    }])
    .unwrap();
    let rules = StepRules {
        schema: &schema,
        catalog: &catalog,
        state_token_budget: 10_000,
    };
    let rejected = validate_step(&rules, &json!({}), raw).unwrap_err();
    assert_eq!(rejected.rejections.len(), 1, "{:?}", rejected.rejections);
    let r = &rejected.rejections[0];
    (r.kind, r.pointer.clone(), r.message.clone())
}

#[test]
fn duplicate_keys_are_refused_at_any_depth() {
    let (kind, pointer, message) = parse_rejection(
        r#"{"reasoning": "r", "state_patch": {"inventory": {"a": 1, "b": 2, "a": 3}}, "action": {"tool": "wait", "args": {}}}"#,
    );
    assert_eq!(kind, RejectionKind::Parse);
    assert_eq!(pointer, "/state_patch/inventory/a");
    assert!(message.contains("twice"), "{message}");

    let (_, pointer, _) = parse_rejection(
        r#"{"reasoning": "r", "state_patch": {}, "action": {"tool": "wait", "tool": "rm"}}"#,
    );
    assert_eq!(pointer, "/action/tool");
    let (_, pointer, _) = parse_rejection(
        r#"{"reasoning": "r", "state_patch": [{"op": "add", "path": "/x", "path": "/y", "value": 1}], "action": {"tool": "wait"}}"#,
    );
    assert_eq!(pointer, "/state_patch/0/path");
    let (_, pointer, _) = parse_rejection(
        "Thinking.\n```json\n{\"state_patch\": {\"a~b/c\": {}, \"a~b/c\": {}}, \"action\": {\"tool\": \"wait\"}}\n```",
    );
    assert_eq!(pointer, "/state_patch/a~0b~1c");
    assert_eq!(
        parse_strict(r#"{"a": {"k": 1}, "b": {"k": 2}}"#).unwrap(),
        json!({"a": {"k": 1}, "b": {"k": 2}})
    );
}

#[test]
fn numbers_beyond_two_to_the_53_are_refused() {
    for (number, pointer) in [
        ("9007199254740993", "/state_patch/n"),
        ("1e20", "/state_patch/n"),
        ("-1152921504606846976", "/state_patch/n"),
        ("123456789012345678901234567890", "/state_patch/n"),
        ("-9007199254740993", "/state_patch/n"),
    ] {
        let (kind, at, message) = parse_rejection(&format!(
            r#"{{"reasoning": "r", "state_patch": {{"n": {number}}}, "action": {{"tool": "wait"}}}}"#
        ));
        assert_eq!(kind, RejectionKind::Parse, "{number}");
        assert_eq!(at, pointer, "{number}");
        assert!(message.contains("string"), "{number}: {message}");
    }
    let (_, at, _) = parse_rejection(
        r#"{"reasoning": "r", "state_patch": {}, "action": {"tool": "wait", "args": {"ids": [1, 2, 18446744073709551615]}}}"#,
    );
    assert_eq!(at, "/action/args/ids/2");
}

#[test]
fn two_to_the_53_itself_is_accepted() {
    assert_eq!(
        parse_strict("9007199254740992").unwrap(),
        json!(9007199254740992u64)
    );
    assert_eq!(
        parse_strict("-9007199254740992").unwrap(),
        json!(-9007199254740992i64)
    );
    assert_eq!(
        parse_strict("[0.5, -1e-300, 1e15]").unwrap(),
        json!([0.5, -1e-300, 1e15])
    );
}
