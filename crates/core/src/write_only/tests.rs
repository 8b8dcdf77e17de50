#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// Write-only values under every kind of keyword that leads to a child, a `$ref` into `$defs`
/// and a recursive definition.
fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "creds": {"$ref": "#/$defs/creds"},
            "tokens": {"type": "array", "items": {"type": "string", "writeOnly": true}},
            "vault": {
                "type": "object",
                "patternProperties": {"^key_": {"type": "string", "writeOnly": true}},
                "additionalProperties": {"type": "string"}
            },
            "extras": {
                "type": "object",
                "properties": {"plain": {"type": "string"}},
                "additionalProperties": {"writeOnly": true}
            },
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "string", "writeOnly": true}],
                "items": {"type": "integer"}
            },
            "choice": {"anyOf": [{"type": "string", "writeOnly": true}, {"type": "integer"}]},
            "tree": {"$ref": "#/$defs/node"},
            "a/b": {"type": "string", "writeOnly": true}
        },
        "$defs": {
            "creds": {
                "type": "object",
                "properties": {
                    "user": {"type": "string"},
                    "password": {"type": "string", "writeOnly": true},
                    "pin": {"type": "integer", "writeOnly": true}
                }
            },
            "node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "secret": {"type": "string", "writeOnly": true},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
                }
            }
        }
    })
}

#[test]
fn the_pointer_matcher_follows_every_applicator() {
    let w = WriteOnly::of_schema(&schema());
    assert!(!w.is_empty());
    for covered in [
        "/creds/password",
        "/creds/pin",
        "/tokens/0",
        "/tokens/17",
        "/tokens/-",
        "/vault/key_1",
        "/vault/xkey_", // unanchored? no: `^key_` is anchored, see below
        "/extras/anything",
        "/pair/1",
        "/pair/-",
        "/choice",
        "/tree/secret",
        "/tree/children/0/children/3/secret",
        "/a~1b",
        // Everything below a write-only value is hidden with it.
        "/creds/password/deeper",
        "/tokens/0/x",
    ] {
        if covered == "/vault/xkey_" {
            assert!(!w.covers(covered), "{covered}");
            continue;
        }
        assert!(w.covers(covered), "{covered}");
    }
    for open in [
        "",
        "/name",
        "/creds",
        "/creds/user",
        "/tokens",
        "/vault",
        "/vault/other",
        "/extras",
        "/extras/plain",
        "/pair/0",
        "/pair/2",
        "/tree",
        "/tree/label",
        "/tree/children/0/label",
        "/a",
        "/nothing/here",
    ] {
        assert!(!w.covers(open), "{open}");
    }
    // Not a JSON pointer: assumed write-only.
    assert!(w.covers("creds"));
}

#[test]
fn a_schema_without_write_only_has_nothing_to_hide() {
    let w =
        WriteOnly::of_schema(&json!({"type": "object", "properties": {"a": {"readOnly": true}}}));
    assert!(w.is_empty());
    let mut state = json!({"a": "x"});
    assert!(!w.redact(&mut state));
    assert_eq!(state, json!({"a": "x"}));
    assert!(!w.covers("/a"));
    // A write-only subschema nothing applies is not a location either.
    let w =
        WriteOnly::of_schema(&json!({"type": "object", "$defs": {"unused": {"writeOnly": true}}}));
    assert!(w.is_empty());
}

#[test]
fn states_are_redacted_in_place_and_keep_their_shape() {
    let w = WriteOnly::of_schema(&schema());
    let mut state = json!({
        "name": "ada",
        "creds": {"user": "ada", "password": "correct horse", "pin": 4711},
        "tokens": ["tok-one", "tok-two"],
        "vault": {"key_a": "va", "other": "vo"},
        "extras": {"plain": "p", "hush": {"deep": ["x"]}, "gone": null},
        "pair": ["first", "second", 3],
        "tree": {"label": "root", "secret": "rs", "children": [{"label": "c", "secret": "cs"}]}
    });
    assert!(w.redact(&mut state));
    assert_eq!(
        state,
        json!({
            "name": "ada",
            "creds": {"user": "ada", "password": "[redacted]", "pin": "[redacted]"},
            "tokens": ["[redacted]", "[redacted]"],
            "vault": {"key_a": "[redacted]", "other": "vo"},
            "extras": {"plain": "p", "hush": "[redacted]", "gone": null},
            "pair": ["first", "[redacted]", 3],
            "tree": {"label": "root", "secret": "[redacted]", "children": [{"label": "c", "secret": "[redacted]"}]}
        })
    );
    let w = WriteOnly::of_schema(&json!({"type": "object", "writeOnly": true}));
    let mut state = json!({"a": 1, "b": {"c": 2}});
    w.redact(&mut state);
    assert_eq!(state, json!({"a": "[redacted]", "b": "[redacted]"}));
}

#[test]
fn patches_are_redacted_by_where_their_values_land() {
    let w = WriteOnly::of_schema(&schema());
    let mut merge =
        json!({"creds": {"password": "hunter22", "user": "bob"}, "tokens": ["t1"], "name": "n"});
    assert!(w.redact_patch(&mut merge));
    assert_eq!(
        merge,
        json!({"creds": {"password": "[redacted]", "user": "bob"}, "tokens": ["[redacted]"], "name": "n"})
    );
    let mut ops = json!([
        {"op": "add", "path": "/creds", "value": {"user": "u", "password": "p4ss-word"}},
        {"op": "replace", "path": "/creds/pin", "value": 1234},
        {"op": "add", "path": "/tokens/-", "value": "appended"},
        {"op": "test", "path": "/tree/children/0/secret", "value": "old"},
        {"op": "add", "path": "/name", "value": "plain"},
        {"op": "copy", "from": "/creds/password", "path": "/name"},
        {"op": "add", "path": "not a pointer", "value": "odd"},
        {"op": "remove", "path": "/creds/password"}
    ]);
    assert!(w.redact_patch(&mut ops));
    assert_eq!(
        ops,
        json!([
            {"op": "add", "path": "/creds", "value": {"user": "u", "password": "[redacted]"}},
            {"op": "replace", "path": "/creds/pin", "value": "[redacted]"},
            {"op": "add", "path": "/tokens/-", "value": "[redacted]"},
            {"op": "test", "path": "/tree/children/0/secret", "value": "[redacted]"},
            {"op": "add", "path": "/name", "value": "plain"},
            {"op": "copy", "from": "/creds/password", "path": "/name"},
            {"op": "add", "path": "not a pointer", "value": "[redacted]"},
            {"op": "remove", "path": "/creds/password"}
        ])
    );
    let mut secrets = SecretValues::default();
    w.collect_patch(&ops_before(), &mut secrets);
    assert_eq!(
        secrets.scrub("p4ss-word 1234 appended old plain u"),
        "[redacted] [redacted] [redacted] [redacted] plain u"
    );
}

fn ops_before() -> Value {
    json!([
        {"op": "add", "path": "/creds", "value": {"user": "u", "password": "p4ss-word"}},
        {"op": "replace", "path": "/creds/pin", "value": 1234},
        {"op": "add", "path": "/tokens/-", "value": "appended"},
        {"op": "test", "path": "/tree/children/0/secret", "value": "old"},
        {"op": "add", "path": "/name", "value": "plain"}
    ])
}

#[test]
fn text_loses_every_secret_long_ones_anywhere_short_ones_as_tokens() {
    let w = WriteOnly::of_schema(&schema());
    let secrets = w.secrets_of(&json!({
        "creds": {"user": "ada", "password": "qu\"ote-secret", "pin": 4711},
        "tokens": ["sk-long-token-123", "ab"]
    }));
    assert!(!secrets.is_empty());
    let text = r#"key sk-long-token-123 inside xsk-long-token-123x; pass {"password":"qu\"ote-secret"}; pin 4711, year 47110, ab, abc, "ab", ada"#;
    assert_eq!(
        secrets.scrub(text),
        r#"key [redacted] inside x[redacted]x; pass {"password":"[redacted]"}; pin [redacted], year 47110, [redacted], abc, "[redacted]", ada"#
    );
    let mut value = json!({"args": {"pin": 4711, "note": "use sk-long-token-123", "n": 4712}});
    secrets.scrub_json(&mut value);
    assert_eq!(
        value,
        json!({"args": {"pin": "[redacted]", "note": "use [redacted]", "n": 4712}})
    );
    assert_eq!(SecretValues::default().scrub(text), text);
}

#[test]
fn an_unreadable_schema_hides_everything_below_the_root() {
    let w = WriteOnly::of_schema(
        &json!({"writeOnly": true, "properties": {"a": {"$ref": "other.json"}}}),
    );
    assert!(w.covers("/a") && w.covers("/b/0"));
    let mut state = json!({"a": 1, "b": [2]});
    w.redact(&mut state);
    assert_eq!(state, json!({"a": "[redacted]", "b": "[redacted]"}));
}

/// Secrets and plain values are drawn from disjoint alphabets, so a plain value never
/// contains a secret.
fn secret() -> impl Strategy<Value = String> {
    "[A-Z]{2,12}".prop_map(|s| format!("S{s}"))
}

fn plain() -> impl Strategy<Value = String> {
    "[a-z ]{0,10}"
}

fn node(depth: u32) -> BoxedStrategy<(Value, Vec<String>)> {
    let leaf = (plain(), proptest::option::of(secret())).prop_map(|(label, secret)| {
        let mut node = json!({"label": label});
        let mut found = Vec::new();
        if let Some(s) = secret {
            node["secret"] = json!(s);
            found.push(s);
        }
        (node, found)
    });
    if depth == 0 {
        return leaf.boxed();
    }
    (leaf, proptest::collection::vec(node(depth - 1), 0..3))
        .prop_map(|((mut node, mut found), children)| {
            let mut items = Vec::new();
            for (child, secrets) in children {
                items.push(child);
                found.extend(secrets);
            }
            node["children"] = Value::Array(items);
            (node, found)
        })
        .boxed()
}

/// A state of `schema()` and the secrets it holds.
fn instance() -> impl Strategy<Value = (Value, Vec<String>)> {
    (
        plain(),
        (plain(), secret()),
        proptest::collection::vec(secret(), 0..4),
        proptest::collection::btree_map("[a-z]{1,5}", (any::<bool>(), plain(), secret()), 0..4),
        proptest::collection::btree_map("[a-z]{1,5}", secret(), 0..3),
        (
            plain(),
            secret(),
            proptest::collection::vec(0i64..100, 0..3),
        ),
        node(2),
    )
        .prop_map(
            |(name, (user, password), tokens, vault, extras, pair, (tree, tree_secrets))| {
                let mut secrets = vec![password.clone()];
                secrets.extend(tokens.iter().cloned());
                let mut vault_map = serde_json::Map::new();
                for (key, (is_key, plain, secret)) in vault {
                    if is_key {
                        vault_map.insert(format!("key_{key}"), json!(secret));
                        secrets.push(secret);
                    } else {
                        vault_map.insert(key, json!(plain));
                    }
                }
                secrets.extend(extras.values().cloned());
                secrets.push(pair.1.clone());
                secrets.extend(tree_secrets);
                let mut pair_items = vec![json!(pair.0), json!(pair.1)];
                pair_items.extend(pair.2.into_iter().map(|n| json!(n)));
                let state = json!({
                    "name": name,
                    "creds": {"user": user, "password": password},
                    "tokens": tokens,
                    "vault": vault_map,
                    "extras": extras,
                    "pair": pair_items,
                    "tree": tree,
                });
                (state, secrets)
            },
        )
}

/// Instance locations the validator itself annotates `"writeOnly": true`.
fn annotated(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
    let evaluation = validator.evaluate(instance);
    evaluation
        .iter_annotations()
        .filter(|entry| entry.annotations.value().get("writeOnly") == Some(&json!(true)))
        .map(|entry| entry.instance_location.as_str().to_owned())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Sound against the validator: every location JSON Schema's own evaluation annotates
    /// write-only is covered, and no secret survives redaction or text cleaning.
    #[test]
    fn nothing_the_validator_calls_write_only_gets_through((state, secrets) in instance()) {
        let document = schema();
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&document)
            .unwrap();
        prop_assert!(validator.is_valid(&state));
        let w = WriteOnly::of_schema(&document);
        let locations = annotated(&validator, &state);
        prop_assert!(!locations.is_empty() || secrets.is_empty());
        for location in &locations {
            prop_assert!(w.covers(location), "{} is annotated writeOnly", location);
        }
        let mut redacted = state.clone();
        w.redact(&mut redacted);
        let shown = serde_json::to_string(&redacted).unwrap();
        for secret in &secrets {
            prop_assert!(!shown.contains(secret.as_str()), "{} in {}", secret, shown);
        }
        // Every annotated location reads `[redacted]` now.
        for location in &locations {
            prop_assert_eq!(redacted.pointer(location), Some(&json!("[redacted]")));
        }
        // The same state as text (a prompt renders it pretty-printed) is cleaned by the
        // values collected from it; the plain values stay.
        let found = w.secrets_of(&state);
        let text = format!("state:\n{}\nend", serde_json::to_string_pretty(&state).unwrap());
        let clean = found.scrub(&text);
        for secret in &secrets {
            prop_assert!(!clean.contains(secret.as_str()), "{} in {}", secret, clean);
        }
        let name = serde_json::to_string(&state["name"]).unwrap();
        prop_assert!(clean.contains(name.as_str()), "{} lost from {}", name, clean);
        // A merge patch that writes the whole state is redacted the same way.
        let mut patch = state.clone();
        w.redact_patch(&mut patch);
        prop_assert_eq!(&patch, &redacted);
    }

    /// A bare pointer is covered exactly when the value at it in a state is redacted.
    #[test]
    fn covers_agrees_with_redaction((state, _) in instance()) {
        let w = WriteOnly::of_schema(&schema());
        let mut redacted = state.clone();
        w.redact(&mut redacted);
        let mut stack = vec![(String::new(), &state)];
        while let Some((at, value)) = stack.pop() {
            let shown = redacted.pointer(&at);
            if !at.is_empty() && !value.is_null() {
                let hidden = shown == Some(&json!("[redacted]"));
                // Below a redacted value there is nothing left to compare.
                if shown.is_some() {
                    prop_assert_eq!(w.covers(&at), hidden, "{}", at);
                }
            }
            match value {
                Value::Object(map) => {
                    for (k, v) in map {
                        stack.push((format!("{at}/{}", crate::json::escape_token(k)), v));
                    }
                }
                Value::Array(items) => {
                    for (i, v) in items.iter().enumerate() {
                        stack.push((format!("{at}/{i}"), v));
                    }
                }
                _ => {}
            }
        }
    }
}

#[test]
fn a_rejected_answer_is_read_for_the_values_it_tried_to_write() {
    let w = WriteOnly::of_schema(&schema());
    let mut secrets = SecretValues::default();
    let answer = json!({"reasoning": "r", "state_patch": {"creds": {"pin": "not-a-pin-123"}}, "action": {"tool": "finish", "args": {}}});
    w.collect_answer(None, &answer.to_string(), &mut secrets);
    // Not an answer the runtime accepts (no action), still JSON with a patch.
    let odd = json!({"state_patch": {"tokens": ["odd-token-456"]}});
    w.collect_answer(None, &odd.to_string(), &mut secrets);
    w.collect_answer(None, "not json at all", &mut secrets);
    w.collect_answer(
        Some(&json!({"a/b": "slashed-789"})),
        "ignored",
        &mut secrets,
    );
    assert_eq!(
        secrets.scrub("not-a-pin-123 odd-token-456 slashed-789"),
        "[redacted] [redacted] [redacted]"
    );
}
