//! The JSON Schema of a whole step answer, derived from the skill's state schema and its tools,
//! for providers that can constrain decoding (DESIGN.md §2): `reasoning` first, then
//! `state_patch` (the state schema with every property optional and nullable, recursively, as a
//! merge patch; read-only properties left out), then `action` (one branch per tool).

use serde_json::{Map, Value, json};

use crate::schema::StateSchema;
use crate::tool::ToolSpec;

/// How deep `$ref`s are inlined before giving up (cyclic schemas stay open there).
const MAX_DEPTH: usize = 12;

pub fn step_output_schema(state: &StateSchema, tools: &[ToolSpec]) -> Value {
    let document = state.document();
    let mut patch = patchify(document, document, 0);
    if let Value::Object(map) = &mut patch {
        // The root of a merge patch cannot be null: null would delete the whole state.
        map.remove("anyOf");
    }
    let branches: Vec<Value> = tools
        .iter()
        .map(|tool| {
            json!({
                "type": "object",
                "properties": {
                    "tool": {"const": tool.name},
                    "args": tool.input_schema,
                },
                "required": ["tool", "args"],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": 400, "description": "Brief reasoning; it is stored, never shown again."},

            "state_patch": patch,
            "action": {"anyOf": branches},
        },
        "required": ["reasoning", "state_patch", "action"],
        "additionalProperties": false,
    })
}

/// The merge-patch form of `schema`: objects keep their properties, all optional and each
/// nullable (null deletes); read-only properties are dropped; local `$ref`s are inlined.
fn patchify(schema: &Value, root: &Value, depth: usize) -> Value {
    let Value::Object(source) = schema else {
        return schema.clone();
    };
    if depth > MAX_DEPTH {
        return json!({});
    }
    if let Some(target) = source
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
    {
        return patchify(target, root, depth + 1);
    }
    let mut out = Map::new();
    for (key, value) in source {
        match key.as_str() {
            "$schema" | "$id" | "$defs" | "definitions" | "title" | "required" | "readOnly"
            | "default" | "examples" => {}
            "properties" => {
                let mut properties = Map::new();
                if let Value::Object(props) = value {
                    for (name, sub) in props {
                        if is_read_only(sub, root) {
                            continue;
                        }
                        properties.insert(name.clone(), nullable(patchify(sub, root, depth + 1)));
                    }
                }
                out.insert(key.clone(), Value::Object(properties));
            }
            "additionalProperties" | "patternProperties" if value.is_object() => {
                let mapped = if key == "patternProperties" {
                    Value::Object(
                        value
                            .as_object()
                            .map(|m| {
                                m.iter()
                                    .map(|(p, s)| {
                                        (p.clone(), nullable(patchify(s, root, depth + 1)))
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    )
                } else {
                    nullable(patchify(value, root, depth + 1))
                };
                out.insert(key.clone(), mapped);
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(out)
}

fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

fn is_read_only(schema: &Value, root: &Value) -> bool {
    if schema.get("readOnly").and_then(Value::as_bool) == Some(true) {
        return true;
    }
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| root.pointer(pointer))
        .and_then(|target| target.get("readOnly"))
        .and_then(Value::as_bool)
        == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SideEffect;

    #[test]
    fn patches_are_optional_nullable_and_skip_read_only_fields() {
        let state = StateSchema::compile(json!({
            "type": "object",
            "properties": {
                "locked": {"const": 1, "readOnly": true},
                "items": {"$ref": "#/$defs/items"}
            },
            "required": ["locked", "items"],
            "additionalProperties": false,
            "$defs": {"items": {"type": "object", "additionalProperties": {"type": "integer"}}}
        }))
        .unwrap();
        let tool = ToolSpec {
            name: "go".into(),
            description: "Go".into(),
            input_schema: json!({"type": "object"}),
            side_effect: SideEffect::ReadOnly,
            source: "t".into(),
            needs_approval: false,
        };
        let schema = step_output_schema(&state, &[tool]);
        let keys: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["reasoning", "state_patch", "action"]);
        let patch = &schema["properties"]["state_patch"];
        assert!(patch.get("required").is_none());
        assert!(patch["properties"].get("locked").is_none());
        let items = &patch["properties"]["items"]["anyOf"][0];
        assert_eq!(
            items["additionalProperties"]["anyOf"][1],
            json!({"type": "null"})
        );
        let validator = jsonschema::draft202012::new(&schema).unwrap();
        assert!(validator.is_valid(&json!({"reasoning": "r", "state_patch": {"items": {"a": null, "b": 2}}, "action": {"tool": "go", "args": {}}})));
        assert!(!validator.is_valid(&json!({"reasoning": "r", "state_patch": {"locked": 2}, "action": {"tool": "go", "args": {}}})));

        assert!(!validator.is_valid(
            &json!({"reasoning": "r", "state_patch": {}, "action": {"tool": "stop", "args": {}}})
        ));
    }
}
