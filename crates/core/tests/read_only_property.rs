//! Read-only enforcement against an independent reference (issue 9): random schemas built from
//! `properties`, `patternProperties`, `additionalProperties`, `items`, `prefixItems`,
//! `$ref`/`$defs`, `allOf`/`anyOf`/`oneOf`, `if`/`then`/`else`, `unevaluatedProperties` and
//! `dependentSchemas` with `readOnly` sprinkled in, random valid states and random merge and
//! JSON patches. The pipeline must accept a patch exactly when no location annotated read-only
//! (before or after) changed and the new state is valid.
//!
//! The oracle below is a small JSON Schema evaluator for exactly that keyword subset, written
//! from the specification (annotations come only from subschemas that validate; a failed
//! `anyOf`/`oneOf` branch, a failed `if` and any failed subschema contribute none), sharing no
//! code with the implementation.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use skillstate_core::patch::StatePatch;
use skillstate_core::schema::StateSchema;
use skillstate_core::{RejectionKind, SideEffect, StepRules, ToolCatalog, ToolSpec, validate_step};

const KEYS: [&str; 5] = ["a", "b", "ro_a", "x1", "c"];
const PATTERNS: [&str; 2] = ["^ro_", "^x"];

/// The two fixed patterns, decided without a regex engine.
fn pattern_matches(pattern: &str, key: &str) -> bool {
    match pattern {
        "^ro_" => key.starts_with("ro_"),
        "^x" => key.starts_with('x'),
        other => panic!("the generator never makes pattern {other}"),
    }
}

/// What evaluating one subschema at one location yields; empty when it fails.
#[derive(Default)]
struct Outcome {
    valid: bool,
    read_only: BTreeSet<String>,
    /// Property names evaluated at this location (for `unevaluatedProperties`).
    evaluated: BTreeSet<String>,
}

struct Oracle<'a> {
    root: &'a Value,
}

impl Oracle<'_> {
    fn resolve(&self, reference: &str) -> &Value {
        match reference {
            "#/$defs/d0" => &self.root["$defs"]["d0"],
            "#/$defs/d%201" => &self.root["$defs"]["d 1"],
            other => panic!("the generator never makes $ref {other}"),
        }
    }

    fn evaluate(&self, schema: &Value, instance: &Value, at: &str) -> Outcome {
        let map = match schema {
            Value::Bool(valid) => {
                return Outcome {
                    valid: *valid,
                    ..Outcome::default()
                };
            }
            Value::Object(map) => map,
            other => panic!("not a schema: {other}"),
        };
        let mut out = Outcome {
            valid: true,
            ..Outcome::default()
        };
        if map.get("readOnly") == Some(&Value::Bool(true)) {
            out.read_only.insert(at.to_owned());
        }
        // In-place applicators: annotations and evaluated names of the ones that validate.
        let absorb = |out: &mut Outcome, sub: Outcome| {
            if sub.valid {
                out.read_only.extend(sub.read_only);
                out.evaluated.extend(sub.evaluated);
            } else {
                out.valid = false;
            }
        };
        if let Some(kind) = map.get("type").and_then(Value::as_str) {
            let ok = match kind {
                "object" => instance.is_object(),
                "array" => instance.is_array(),
                "integer" => instance.is_i64() || instance.is_u64(),
                other => panic!("type {other}"),
            };
            out.valid &= ok;
        }
        if let Some(constant) = map.get("const") {
            out.valid &= constant == instance;
        }
        if let Some(Value::String(reference)) = map.get("$ref") {
            let sub = self.evaluate(self.resolve(reference), instance, at);
            absorb(&mut out, sub);
        }
        if let Some(Value::Array(branches)) = map.get("allOf") {
            for branch in branches {
                let sub = self.evaluate(branch, instance, at);
                absorb(&mut out, sub);
            }
        }
        if let Some(Value::Array(branches)) = map.get("anyOf") {
            let subs: Vec<Outcome> = branches
                .iter()
                .map(|b| self.evaluate(b, instance, at))
                .collect();
            if subs.iter().any(|s| s.valid) {
                for sub in subs.into_iter().filter(|s| s.valid) {
                    absorb(&mut out, sub);
                }
            } else {
                out.valid = false;
            }
        }
        if let Some(Value::Array(branches)) = map.get("oneOf") {
            let mut subs: Vec<Outcome> = branches
                .iter()
                .map(|b| self.evaluate(b, instance, at))
                .filter(|s| s.valid)
                .collect();
            if subs.len() == 1 {
                absorb(&mut out, subs.remove(0));
            } else {
                out.valid = false;
            }
        }
        if let Some(condition) = map.get("if") {
            let sub = self.evaluate(condition, instance, at);
            if sub.valid {
                absorb(&mut out, sub);
                if let Some(then) = map.get("then") {
                    let sub = self.evaluate(then, instance, at);
                    absorb(&mut out, sub);
                }
            } else if let Some(otherwise) = map.get("else") {
                let sub = self.evaluate(otherwise, instance, at);
                absorb(&mut out, sub);
            }
        }
        if let (Some(Value::Object(dependents)), Value::Object(object)) =
            (map.get("dependentSchemas"), instance)
        {
            for (key, sub) in dependents {
                if object.contains_key(key) {
                    let sub = self.evaluate(sub, instance, at);
                    absorb(&mut out, sub);
                }
            }
        }
        let child = |out: &mut Outcome, sub: Outcome| {
            if sub.valid {
                out.read_only.extend(sub.read_only);
            } else {
                out.valid = false;
            }
        };
        if let Value::Object(object) = instance {
            let properties = map.get("properties").and_then(Value::as_object);
            let patterns = map.get("patternProperties").and_then(Value::as_object);
            for (key, value) in object {
                let here = format!("{at}/{key}");
                let mut matched = false;
                if let Some(sub) = properties.and_then(|p| p.get(key)) {
                    child(&mut out, self.evaluate(sub, value, &here));
                    matched = true;
                }
                for (pattern, sub) in patterns.into_iter().flatten() {
                    if pattern_matches(pattern, key) {
                        child(&mut out, self.evaluate(sub, value, &here));
                        matched = true;
                    }
                }
                if matched {
                    out.evaluated.insert(key.clone());
                } else if let Some(sub) = map.get("additionalProperties") {
                    child(&mut out, self.evaluate(sub, value, &here));
                    out.evaluated.insert(key.clone());
                }
            }
            if let Some(sub) = map.get("unevaluatedProperties") {
                for (key, value) in object {
                    if !out.evaluated.contains(key) {
                        child(&mut out, self.evaluate(sub, value, &format!("{at}/{key}")));
                        out.evaluated.insert(key.clone());
                    }
                }
            }
        }
        if let Value::Array(items) = instance {
            let prefix = map
                .get("prefixItems")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for (index, item) in items.iter().enumerate() {
                let here = format!("{at}/{index}");
                if let Some(sub) = prefix.get(index) {
                    child(&mut out, self.evaluate(sub, item, &here));
                } else if let Some(sub) = map.get("items") {
                    child(&mut out, self.evaluate(sub, item, &here));
                }
            }
        }
        if out.valid { out } else { Outcome::default() }
    }
}

fn leaf_schema(with_refs: bool) -> BoxedStrategy<Value> {
    let mut options = vec![
        (4, Just(json!({})).boxed()),
        (3, Just(json!({"readOnly": true})).boxed()),
        (1, Just(json!({"type": "integer"})).boxed()),
        (1, Just(json!({"type": "object"})).boxed()),
        (1, Just(json!({"const": 1})).boxed()),
        (1, Just(json!(true)).boxed()),
    ];
    if with_refs {
        options.push((2, Just(json!({"$ref": "#/$defs/d0"})).boxed()));
        options.push((2, Just(json!({"$ref": "#/$defs/d%201"})).boxed()));
    }
    proptest::strategy::Union::new_weighted(options).boxed()
}

fn schema(with_refs: bool) -> BoxedStrategy<Value> {
    leaf_schema(with_refs)
        .prop_recursive(3, 24, 3, |inner| {
            let keyword = prop_oneof![
                3 => prop::collection::btree_map(prop::sample::select(KEYS.to_vec()), inner.clone(), 1..3)
                    .prop_map(|m| ("properties", Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))),
                2 => prop::collection::btree_map(prop::sample::select(PATTERNS.to_vec()), inner.clone(), 1..3)
                    .prop_map(|m| ("patternProperties", Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))),
                2 => inner.clone().prop_map(|s| ("additionalProperties", s)),
                1 => inner.clone().prop_map(|s| ("items", s)),
                1 => prop::collection::vec(inner.clone(), 1..3).prop_map(|v| ("prefixItems", Value::Array(v))),
                1 => prop::collection::vec(inner.clone(), 1..3).prop_map(|v| ("allOf", Value::Array(v))),
                2 => prop::collection::vec(inner.clone(), 1..3).prop_map(|v| ("anyOf", Value::Array(v))),
                1 => prop::collection::vec(inner.clone(), 1..3).prop_map(|v| ("oneOf", Value::Array(v))),
                2 => inner.clone().prop_map(|s| ("if", s)),
                2 => inner.clone().prop_map(|s| ("then", s)),
                1 => inner.clone().prop_map(|s| ("else", s)),
                2 => inner.clone().prop_map(|s| ("unevaluatedProperties", s)),
                1 => inner.clone().prop_map(|s| ("dependentSchemas", json!({"a": s}))),
            ];
            (prop::collection::vec(keyword, 1..4), any::<u8>()).prop_map(|(keywords, mark)| {
                let mut map = Map::new();
                for (key, value) in keywords {
                    map.insert(key.to_owned(), value);
                }
                if mark % 4 == 0 {
                    map.insert("readOnly".into(), Value::Bool(true));
                }
                Value::Object(map)
            })
        })
        .boxed()
}

fn root_schema() -> impl Strategy<Value = Value> {
    (schema(true), schema(false), schema(false)).prop_map(|(root, d0, d1)| {
        let mut map = match root {
            Value::Object(map) => map,
            other => {
                let mut map = Map::new();
                map.insert("allOf".into(), json!([other]));
                map
            }
        };
        map.insert("type".into(), json!("object"));
        map.insert("$defs".into(), json!({"d0": d0, "d 1": d1}));
        Value::Object(map)
    })
}

fn instance() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!(1)),
        Just(json!(2)),
        Just(json!("s")),
        Just(Value::Null)
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            prop::collection::btree_map(prop::sample::select(KEYS.to_vec()), inner.clone(), 0..3)
                .prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
            prop::collection::vec(inner, 0..3).prop_map(Value::Array),
        ]
    })
}

fn state() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(KEYS.to_vec()), instance(), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}

fn patch() -> impl Strategy<Value = Value> {
    let merge = prop::collection::btree_map(
        prop::sample::select(KEYS.to_vec()),
        prop_oneof![2 => instance(), 1 => Just(Value::Null)],
        1..3,
    )
    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    let paths = prop::sample::select(vec![
        "/a", "/b", "/ro_a", "/x1", "/c", "/a/a", "/a/ro_a", "/a/x1", "/b/0", "/b/-", "/c/0",
        "/ro_a/b",
    ]);
    let op = (
        prop::sample::select(vec!["add", "remove", "replace"]),
        paths,
        instance(),
    )
        .prop_map(|(op, path, value)| {
            if op == "remove" {
                json!({"op": op, "path": path})
            } else {
                json!({"op": op, "path": path, "value": value})
            }
        });
    prop_oneof![
        merge,
        prop::collection::vec(op, 1..3).prop_map(Value::Array)
    ]
}

/// Locations changed between `before` and `after` among `read_only`, topmost only.
fn changed(read_only: &BTreeSet<String>, before: &Value, after: &Value) -> Vec<String> {
    let mut hits: Vec<&String> = read_only
        .iter()
        .filter(|l| before.pointer(l) != after.pointer(l))
        .collect();
    hits.sort_by_key(|l| (l.matches('/').count(), (*l).clone()));
    let mut top: Vec<String> = Vec::new();
    for hit in hits {
        if !top
            .iter()
            .any(|t| hit == t || hit.starts_with(&format!("{t}/")))
        {
            top.push(hit.clone());
        }
    }
    top
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    #[test]
    fn accepted_exactly_when_no_read_only_location_changes(
        document in root_schema(),
        before in state(),
        raw_patch in patch(),
    ) {
        let oracle = Oracle { root: &document };
        let schema = StateSchema::compile(document.clone())
            .unwrap_or_else(|d| panic!("generated schema refused: {d:?}\n{document}"));
        let old = oracle.evaluate(&document, &before, "");
        // Stored states satisfy the schema; other starting points are not the question here.
        prop_assume!(old.valid);
        // The evaluation itself agrees with the reference.
        let annotated: BTreeSet<String> = schema.read_only_annotations(&before).into_iter().collect();
        prop_assert_eq!(&annotated, &old.read_only, "annotations of {} under {}", before, document);

        let catalog = ToolCatalog::new(vec![ToolSpec {
            name: "wait".into(),
            description: "Wait".into(),
            input_schema: json!({"type": "object"}),
            side_effect: SideEffect::ReadOnly,
            source: "test".into(),
            needs_approval: false,
        }]).unwrap();
        let rules = StepRules { schema: &schema, catalog: &catalog, state_token_budget: 100_000 };
        let answer = json!({"reasoning": "r", "state_patch": raw_patch, "action": {"tool": "wait", "args": {}}});
        let result = validate_step(&rules, &before, &answer.to_string());

        let after = match StatePatch::from_value(&raw_patch).and_then(|p| p.apply(&before)) {
            Ok(after) => after,
            Err(_) => {
                let rejected = result.err().unwrap();
                prop_assert!(rejected.rejections.iter().all(|r| r.kind == RejectionKind::PatchApply));
                return Ok(());
            }
        };
        let new = oracle.evaluate(&document, &after, "");
        let read_only: BTreeSet<String> = old.read_only.union(&new.read_only).cloned().collect();
        let hits = changed(&read_only, &before, &after);
        match result {
            Ok(accepted) => {
                prop_assert!(hits.is_empty(), "accepted a write to {:?}: {} -> {} under {}", hits, before, after, document);
                prop_assert!(new.valid, "accepted an invalid state {} under {}", after, document);
                prop_assert_eq!(accepted.new_state, after);
            }
            Err(rejected) => {
                let kinds: Vec<(RejectionKind, String)> =
                    rejected.rejections.iter().map(|r| (r.kind, r.pointer.clone())).collect();
                if hits.is_empty() {
                    prop_assert!(!new.valid, "rejected a valid write {:?}: {} -> {} under {}", kinds, before, after, document);
                    prop_assert!(kinds.iter().all(|(k, _)| *k == RejectionKind::Schema), "{:?}", kinds);
                } else {
                    let expected: Vec<(RejectionKind, String)> =
                        hits.into_iter().map(|h| (RejectionKind::ReadOnly, h)).collect();
                    prop_assert_eq!(kinds, expected, "{} -> {} under {}", before, after, document);
                }
            }
        }
    }
}
