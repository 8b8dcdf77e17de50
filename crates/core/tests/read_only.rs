//! Read-only fields can be written: one regression test per way an attacker wrote a `readOnly`
//! location (issue 9), each with merge patches and JSON Patches where both apply, plus the
//! legitimate writes next to read-only fields that must still pass.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use skillstate_core::schema::StateSchema;
use skillstate_core::validate::Document;
use skillstate_core::{RejectionKind, SideEffect, StepRules, ToolCatalog, ToolSpec, validate_step};

fn catalog() -> ToolCatalog {
    ToolCatalog::new(vec![ToolSpec {
        name: "wait".into(),
        description: "Wait".into(),
        input_schema: json!({"type": "object"}),
        side_effect: SideEffect::ReadOnly,
        source: "test".into(),
        needs_approval: false,
    }])
    .unwrap()
}

/// Runs one step with `patch`; `Ok(new state)` or the `(kind, pointer)` of every rejection.
fn step(
    schema: &Value,
    state: &Value,
    patch: Value,
) -> Result<Value, Vec<(RejectionKind, String)>> {
    let schema = StateSchema::compile(schema.clone()).unwrap();
    assert!(schema.is_valid(state), "test states start valid");
    let catalog = catalog();
    let rules = StepRules {
        schema: &schema,
        catalog: &catalog,
        state_token_budget: 10_000,
    };
    let answer =
        json!({"reasoning": "r", "state_patch": patch, "action": {"tool": "wait", "args": {}}});
    match validate_step(&rules, state, &answer.to_string()) {
        Ok(accepted) => Ok(accepted.new_state),
        Err(rejected) => Err(rejected
            .rejections
            .into_iter()
            .map(|r| {
                if r.kind == RejectionKind::ReadOnly {
                    assert_eq!(r.document, Document::State);
                    assert!(r.message.contains("read-only"), "{}", r.message);
                }
                (r.kind, r.pointer)
            })
            .collect()),
    }
}

fn read_only(pointers: &[&str]) -> Result<Value, Vec<(RejectionKind, String)>> {
    Err(pointers
        .iter()
        .map(|p| (RejectionKind::ReadOnly, (*p).to_owned()))
        .collect())
}

#[test]
fn adding_a_read_only_object_that_did_not_exist_yet() {
    let schema = json!({
        "type": "object",
        "properties": {
            "config": {"type": "object", "readOnly": true},
            "notes": {"type": "string"}
        }
    });
    let state = json!({"notes": ""});
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/config", "value": {"admin": true}}])
        ),
        read_only(&["/config"])
    );
    assert_eq!(
        step(&schema, &state, json!({"config": {"admin": true}})),
        read_only(&["/config"])
    );
    assert_eq!(
        step(&schema, &state, json!({"notes": "fine"})),
        Ok(json!({"notes": "fine"}))
    );
}

#[test]
fn appending_to_a_read_only_array() {
    let schema = json!({
        "type": "object",
        "properties": {
            "history": {"type": "array", "readOnly": true},
            "log": {"type": "array", "items": {"readOnly": true}},
            "todo": {"type": "array"}
        }
    });
    let state = json!({"history": [1], "log": ["boot"], "todo": []});
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/history/-", "value": 2}])
        ),
        read_only(&["/history"])
    );
    assert_eq!(
        step(&schema, &state, json!({"history": [1, 2]})),
        read_only(&["/history"])
    );
    // Every item is read-only: a new one is a change from absent to present.
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/log/-", "value": "forged"}])
        ),
        read_only(&["/log/1"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/log/0", "value": "forged"}])
        ),
        read_only(&["/log/0", "/log/1"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/todo/-", "value": "ship"}])
        ),
        Ok(json!({"history": [1], "log": ["boot"], "todo": ["ship"]}))
    );
}

#[test]
fn pattern_properties_the_old_checker_could_not_match() {
    let schema = json!({
        "type": "object",
        "patternProperties": {
            "^x?ro_": {"readOnly": true},
            "^sys_|^lock_": {"readOnly": true}
        },
        "additionalProperties": {"type": "integer"}
    });
    let state = json!({"ro_a": 1, "xro_b": 2, "sys_clock": 3, "free": 4});
    assert_eq!(
        step(&schema, &state, json!({"xro_b": 9})),
        read_only(&["/xro_b"])
    );
    assert_eq!(
        step(&schema, &state, json!({"xro_new": 9})),
        read_only(&["/xro_new"])
    );
    assert_eq!(
        step(&schema, &state, json!({"lock_door": 1})),
        read_only(&["/lock_door"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "replace", "path": "/sys_clock", "value": 0}])
        ),
        read_only(&["/sys_clock"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "move", "from": "/ro_a", "path": "/free"}])
        ),
        read_only(&["/ro_a"])
    );
    assert_eq!(
        step(&schema, &state, json!({"free": 5, "rox_a": 6, "system": 7})),
        Ok(json!({"ro_a": 1, "xro_b": 2, "sys_clock": 3, "free": 5, "rox_a": 6, "system": 7}))
    );
}

#[test]
fn percent_encoded_and_escaped_refs() {
    let schema = json!({
        "type": "object",
        "properties": {
            "owner": {"$ref": "#/$defs/a%20b"},
            "path": {"$ref": "#/$defs/x~1y"},
            "notes": {"type": "string"}
        },
        "$defs": {
            "a b": {"type": "string", "readOnly": true},
            "x/y": {"type": "string", "readOnly": true}
        }
    });
    let state = json!({"owner": "alice", "path": "/srv", "notes": ""});
    assert_eq!(
        step(&schema, &state, json!({"owner": "mallory"})),
        read_only(&["/owner"])
    );
    assert_eq!(
        step(&schema, &state, json!([{"op": "remove", "path": "/path"}])),
        read_only(&["/path"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!({"owner": null, "path": "/", "notes": "x"})
        ),
        read_only(&["/owner", "/path"])
    );
    assert!(step(&schema, &state, json!({"notes": "x"})).is_ok());
    assert_eq!(
        StateSchema::compile(schema)
            .unwrap()
            .declared_read_only_properties(),
        vec!["/owner", "/path"]
    );
}

#[test]
fn unevaluated_properties_marked_read_only() {
    let schema = json!({
        "type": "object",
        "properties": {"notes": {"type": "string"}},
        "unevaluatedProperties": {"readOnly": true}
    });
    let state = json!({"notes": "", "token": "t0"});
    assert_eq!(
        step(&schema, &state, json!({"token": "t1"})),
        read_only(&["/token"])
    );
    assert_eq!(
        step(&schema, &state, json!({"extra": 1})),
        read_only(&["/extra"])
    );
    assert_eq!(
        step(
            &schema,
            &state,
            json!([{"op": "add", "path": "/extra", "value": 1}])
        ),
        read_only(&["/extra"])
    );
    assert!(step(&schema, &state, json!({"notes": "x"})).is_ok());
}

#[test]
fn if_then_read_only_and_flipping_the_condition() {
    let schema = json!({
        "type": "object",
        "properties": {"mode": {"enum": ["open", "locked"]}, "value": {"type": "integer"}},
        "if": {"properties": {"mode": {"const": "locked"}}, "required": ["mode"]},
        "then": {"properties": {"value": {"readOnly": true}}}
    });
    let locked = json!({"mode": "locked", "value": 1});
    assert_eq!(
        step(&schema, &locked, json!({"value": 2})),
        read_only(&["/value"])
    );
    assert_eq!(
        step(
            &schema,
            &locked,
            json!([{"op": "replace", "path": "/value", "value": 2}])
        ),
        read_only(&["/value"])
    );
    // Unlocking and writing in one step: the old state's annotation still counts.
    assert_eq!(
        step(&schema, &locked, json!({"mode": "open", "value": 2})),
        read_only(&["/value"])
    );
    // Locking and writing in one step: the new state's annotation counts.
    let open = json!({"mode": "open", "value": 1});
    assert_eq!(
        step(&schema, &open, json!({"mode": "locked", "value": 2})),
        read_only(&["/value"])
    );
    assert_eq!(
        step(&schema, &open, json!({"value": 2})),
        Ok(json!({"mode": "open", "value": 2}))
    );
    assert!(step(&schema, &locked, json!({"mode": "open"})).is_ok());
}

#[test]
fn read_only_writes_are_reported_even_when_the_new_state_breaks_the_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "config": {"type": "object", "readOnly": true},
            "count": {"type": "integer"}
        }
    });
    let state = json!({"config": {"a": 1}, "count": 0});
    assert_eq!(
        step(&schema, &state, json!({"config": 5, "count": "x"})),
        read_only(&["/config"])
    );
    assert_eq!(
        step(&schema, &state, json!({"config": {"a": {"b": 2}}})),
        read_only(&["/config"])
    );
    assert_eq!(
        step(&schema, &state, json!({"count": "x"})),
        Err(vec![(RejectionKind::Schema, "/count".to_owned())])
    );
}

#[test]
fn failed_branches_do_not_mark_read_only() {
    // JSON Schema drops the annotations of a failed anyOf branch: `a` is read-only only while
    // it is a string.
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string", "readOnly": true}, {"type": "integer"}]}
        }
    });
    assert_eq!(
        step(&schema, &json!({"a": 5}), json!({"a": 6})),
        Ok(json!({"a": 6}))
    );
    assert_eq!(
        step(&schema, &json!({"a": 5}), json!({"a": "s"})),
        read_only(&["/a"])
    );
    assert_eq!(
        step(&schema, &json!({"a": "s"}), json!({"a": 6})),
        read_only(&["/a"])
    );
}

#[test]
fn schemas_without_read_only_skip_evaluation() {
    let schema = StateSchema::compile(json!({
        "type": "object",
        "properties": {"a": {"readOnly": false}}
    }))
    .unwrap();
    assert!(!schema.has_read_only());
    assert!(schema.read_only_annotations(&json!({"a": 1})).is_empty());
}

/// A read-only root is named as the whole state, never as an empty name: the refusal reads
/// `the whole state (pointer "") is read-only`, both in the message and as the prompt lists it.
#[test]
fn a_read_only_root_is_named_as_the_whole_state() {
    let schema = StateSchema::compile(json!({
        "type": "object",
        "readOnly": true,
        "properties": {"notes": {"type": "string"}}
    }))
    .unwrap();
    let catalog = catalog();
    let rules = StepRules {
        schema: &schema,
        catalog: &catalog,
        state_token_budget: 10_000,
    };
    let answer = json!({"reasoning": "r", "state_patch": {"notes": "x"},
        "action": {"tool": "wait", "args": {}}});
    let rejected = validate_step(&rules, &json!({"notes": ""}), &answer.to_string()).unwrap_err();
    let root = rejected
        .rejections
        .iter()
        .find(|r| r.kind == RejectionKind::ReadOnly && r.pointer.is_empty())
        .expect("the root is refused as read-only");
    assert!(
        root.message
            .starts_with("the whole state (pointer \"\") is read-only"),
        "{}",
        root.message
    );
    let shown = root.to_string();
    assert!(
        shown.starts_with("[read_only] the whole state (pointer \"\"): the whole state"),
        "{shown}"
    );
    assert!(!shown.contains(":  is"), "{shown}");
}
