//! Schemas that hang validation are refused up front (issue 9 item 8): `$ref` fan-out,
//! pure `$ref` cycles and recursion that multiplies with the depth of the value, while
//! ordinary recursive schemas and every shipped skill still load.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};
use skillstate_core::Skill;
use skillstate_core::schema::{SchemaDefect, StateSchema};
use skillstate_core::skill::Location;

/// Runs `work` on its own thread; a regression that hangs fails here instead of hanging.
fn within_a_minute<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = mpsc::channel();
    thread::spawn(move || {
        let _ = send.send(work());
    });
    receive
        .recv_timeout(Duration::from_secs(60))
        .expect("the schema check did not finish within a minute")
}

fn compile(schema: Value) -> Result<StateSchema, Vec<SchemaDefect>> {
    within_a_minute(move || StateSchema::compile_all(schema))
}

/// `anyOf` of three `$ref`s to the next level, `depth` levels deep: 3^depth applications.
fn fan_out(depth: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for level in 0..depth {
        let next = format!("#/$defs/d{}", level + 1);
        defs.insert(
            format!("d{level}"),
            json!({"anyOf": [{"$ref": next}, {"$ref": next}, {"$ref": next}]}),
        );
    }
    defs.insert(
        format!("d{depth}"),
        json!({"type": "string", "readOnly": true}),
    );
    json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs})
}

fn skill_dir(schema: &Value) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("guard").tempdir().unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    std::fs::write(
        dir.path().join("SKILL.md"),
        format!("---\nname: {name}\ndescription: A test skill.\n---\nDo the thing.\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("state.schema.json"), schema.to_string()).unwrap();
    std::fs::write(dir.path().join("state.init.json"), "{}").unwrap();
    dir
}

#[test]
fn exponential_ref_fan_out_is_refused_quickly() {
    let defects = compile(fan_out(24)).err().unwrap();
    assert_eq!(defects.len(), 1, "{defects:?}");
    assert!(defects[0].pointer.starts_with("/$defs/d"), "{defects:?}");
    assert!(
        defects[0].message.contains("10000"),
        "{}",
        defects[0].message
    );

    let dir = skill_dir(&fan_out(24));
    let path = dir.path().to_owned();
    let errors = within_a_minute(move || Skill::load(&path).err().unwrap());
    let problem = errors
        .problems
        .iter()
        .find(|p| p.file.ends_with("state.schema.json"))
        .unwrap_or_else(|| panic!("no schema problem in {errors}"));
    assert!(
        matches!(&problem.location, Some(Location::Pointer(p)) if p.starts_with("/$defs/d")),
        "{problem}"
    );

    // A few levels stay well under the limit.
    assert!(compile(fan_out(5)).is_ok());
}

#[test]
fn pure_ref_cycles_are_refused_with_pointers() {
    let defects = compile(json!({
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/a"}},
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}
    }))
    .err()
    .unwrap();
    assert_eq!(defects.len(), 1, "{defects:?}");
    assert!(defects[0].pointer.starts_with("/$defs/"), "{defects:?}");
    let message = &defects[0].message;
    assert!(
        message.contains("#/$defs/a") && message.contains("#/$defs/b"),
        "{message}"
    );
    assert!(message.contains("cycle"), "{message}");

    let defects = compile(json!({"type": "object", "allOf": [{"$ref": "#"}]}))
        .err()
        .unwrap();
    assert!(defects[0].message.contains("cycle"), "{defects:?}");

    let defects = compile(json!({
        "type": "object",
        "$defs": {"s": {"if": {"$ref": "#/$defs/s"}, "then": {}}}
    }))
    .err()
    .unwrap();
    assert_eq!(defects[0].pointer, "/$defs/s");
}

#[test]
fn recursion_that_multiplies_with_depth_is_refused() {
    // `t` applies `n` twice at one location and `n` descends back into `t`: 2^depth.
    let defects = compile(json!({
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/t"}},
        "$defs": {
            "t": {"anyOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]},
            "n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/t"}}}
        }
    }))
    .err()
    .unwrap();
    assert!(defects[0].message.contains("same child"), "{defects:?}");

    // Two variants recursing through the same property name: exponential under evaluation.
    assert!(
        compile(json!({
            "type": "object",
            "properties": {"expr": {"$ref": "#/$defs/expr"}},
            "$defs": {
                "expr": {"oneOf": [{"$ref": "#/$defs/add"}, {"$ref": "#/$defs/mul"}]},
                "add": {"properties": {"op": {"const": "+"}, "l": {"$ref": "#/$defs/expr"}}},
                "mul": {"properties": {"op": {"const": "*"}, "l": {"$ref": "#/$defs/expr"}}}
            }
        }))
        .is_err()
    );

    // Two copies through `properties` and a matching `patternProperties`.
    assert!(
        compile(json!({
            "type": "object",
            "$defs": {"n": {"properties": {"a": {"$ref": "#/$defs/n"}}, "patternProperties": {"^a": {"$ref": "#/$defs/n"}}}},
            "properties": {"n": {"$ref": "#/$defs/n"}}
        }))
        .is_err()
    );
}

#[test]
fn ordinary_recursive_schemas_are_accepted() {
    for schema in [
        // Binary tree.
        json!({"type": "object", "properties": {"tree": {"$ref": "#/$defs/node"}}, "$defs": {
            "node": {"type": "object", "properties": {
                "left": {"$ref": "#/$defs/node"}, "right": {"$ref": "#/$defs/node"},
                "label": {"type": "string", "readOnly": true}}}}}),
        // List of children.
        json!({"type": "object", "properties": {"root": {"$ref": "#/$defs/dir"}}, "$defs": {
            "dir": {"type": "object", "properties": {"name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/dir"}}}}}}),
        // Any JSON value: an array branch and an object branch.
        json!({"type": "object", "additionalProperties": {"$ref": "#/$defs/json"}, "$defs": {
            "json": {"anyOf": [{"type": ["string", "number", "boolean", "null"]},
                {"type": "array", "items": {"$ref": "#/$defs/json"}},
                {"type": "object", "additionalProperties": {"$ref": "#/$defs/json"}}]}}}),
        // A map with one special key beside the others.
        json!({"type": "object", "properties": {"m": {"$ref": "#/$defs/m"}}, "$defs": {
            "m": {"type": "object", "properties": {"meta": {"$ref": "#/$defs/m"}},
                "additionalProperties": {"$ref": "#/$defs/m"}}}}),
        // Recursion through the root itself.
        json!({"type": "object", "properties": {"child": {"$ref": "#"}}}),
        // Shared definitions used many times (a DAG, not a cycle).
        json!({"type": "object", "properties": {
            "home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"},
            "both": {"allOf": [{"$ref": "#/$defs/address"}, {"$ref": "#/$defs/address"}]}},
            "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}}}}}),
    ] {
        let result = compile(schema.clone());
        assert!(result.is_ok(), "{schema}: {:?}", result.err());
    }
}

#[test]
fn refs_that_leave_the_document_or_backtracking_patterns_are_refused() {
    let defects = compile(
        json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}),
    )
    .err()
    .unwrap();
    assert_eq!(defects[0].pointer, "/properties/a/$ref", "{defects:?}");
    let defects = compile(json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a|aa)+\\1$"}}}))
        .err()
        .unwrap();
    assert!(
        defects[0].message.contains("back-references"),
        "{defects:?}"
    );
}

#[test]
fn every_shipped_skill_still_validates() {
    let skills: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills");
    let mut checked = 0;
    for entry in std::fs::read_dir(&skills).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("SKILL.md").is_file() {
            let loaded = Skill::load(&dir);
            assert!(
                loaded.is_ok(),
                "{}: {}",
                dir.display(),
                loaded.err().unwrap()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 4,
        "expected the four shipped skills, found {checked}"
    );
}
