//! The JSON Schema of a whole step answer, derived from the skill's state schema and its tools, for
//! providers that can constrain decoding (docs/models.md, "Models": constrained output): `reasoning` first,
//! then `state_patch` (the state schema with every property optional and nullable, recursively, as
//! a merge patch; read-only properties left out), then `action` (one branch per tool).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::schema::StateSchema;
use crate::schema_graph::{EdgeKind, SchemaGraph};
use crate::tool::ToolSpec;

pub fn step_output_schema(state: &StateSchema, tools: &[ToolSpec]) -> Value {
    let document = state.document();
    let (mut patch, defs) = match SchemaGraph::build(document) {
        Ok(graph) => {
            let mut deriver = Deriver::new(&graph);
            let patch = deriver.patch(document);
            (patch, deriver.finish())
        }
        // Unreachable for a compiled schema; an open patch is still a usable answer form.
        Err(_) => (json!({"type": "object"}), Map::new()),
    };
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
    let mut schema = json!({
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": 400, "description": "Brief reasoning; it is stored, never shown again."},

            "state_patch": patch,
            "action": {"anyOf": branches},
        },
        "required": ["reasoning", "state_patch", "action"],
        "additionalProperties": false,
    });
    if !defs.is_empty()
        && let Value::Object(map) = &mut schema
    {
        map.insert("$defs".into(), Value::Object(defs));
    }
    schema
}

/// Builds the merge-patch form of the state schema. Every `$ref` target becomes one entry of
/// the output's `$defs` (`patch_N` in merge-patch form, `full_N` as it is), derived once, so the
/// work is linear in the size of the schema whatever its references and recursion.
struct Deriver<'g, 'a> {
    graph: &'g SchemaGraph<'a>,
    node_of: HashMap<*const Value, usize>,
    read_only: Vec<bool>,
    defs: Map<String, Value>,
    pending: Vec<(usize, bool)>,
    named: HashMap<(usize, bool), String>,
}

impl<'g, 'a> Deriver<'g, 'a> {
    fn new(graph: &'g SchemaGraph<'a>) -> Self {
        Self {
            graph,
            node_of: graph
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.schema as *const Value, i))
                .collect(),
            read_only: graph.read_only_closure(),
            defs: Map::new(),
            pending: Vec::new(),
            named: HashMap::new(),
        }
    }

    /// Derives every definition referred to so far (and those they refer to).
    fn finish(mut self) -> Map<String, Value> {
        while let Some((node, as_patch)) = self.pending.pop() {
            let schema = self.graph.nodes[node].schema;
            let body = if as_patch {
                self.patch(schema)
            } else {
                self.full(schema)
            };
            let name = self.named[&(node, as_patch)].clone();
            self.defs.insert(name, body);
        }
        self.defs.sort_keys();
        self.defs
    }

    /// `#/$defs/NAME` for the target of the `$ref` in `schema`, queued for derivation.
    fn reference(&mut self, schema: &Value, as_patch: bool) -> Option<String> {
        let node = *self.node_of.get(&(schema as *const Value))?;
        let target = self.graph.nodes[node]
            .edges
            .iter()
            .find(|e| e.kind == EdgeKind::Same && e.keyword.ends_with("/$ref"))?
            .to;
        let name = match self.named.get(&(target, as_patch)) {
            Some(name) => name.clone(),
            None => {
                let name = format!("{}_{target}", if as_patch { "patch" } else { "full" });
                self.named.insert((target, as_patch), name.clone());
                self.pending.push((target, as_patch));
                name
            }
        };
        Some(format!("#/$defs/{name}"))
    }

    fn is_read_only(&self, schema: &Value) -> bool {
        self.node_of
            .get(&(schema as *const Value))
            .is_some_and(|&n| self.read_only[n])
    }

    /// The merge-patch form of `schema`: objects keep their properties, all optional and each
    /// nullable (null deletes); read-only properties are dropped; `$ref`s point at the patch
    /// form of their target.
    fn patch(&mut self, schema: &Value) -> Value {
        let Value::Object(source) = schema else {
            return schema.clone();
        };
        let mut out = Map::new();
        for (key, value) in source {
            match key.as_str() {
                "$schema" | "$id" | "$defs" | "definitions" | "title" | "required" | "readOnly"
                | "default" | "examples" => {}
                "$ref" => {
                    if let Some(target) = self.reference(schema, true) {
                        out.insert(key.clone(), Value::String(target));
                    }
                }
                "properties" => {
                    let mut properties = Map::new();
                    if let Value::Object(props) = value {
                        for (name, sub) in props {
                            if self.is_read_only(sub) {
                                continue;
                            }
                            let patched = self.patch(sub);
                            properties.insert(name.clone(), nullable(patched));
                        }
                    }
                    out.insert(key.clone(), Value::Object(properties));
                }
                "patternProperties" if value.is_object() => {
                    let mut patterns = Map::new();
                    if let Value::Object(subs) = value {
                        for (pattern, sub) in subs {
                            let patched = self.patch(sub);
                            patterns.insert(pattern.clone(), nullable(patched));
                        }
                    }
                    out.insert(key.clone(), Value::Object(patterns));
                }
                "additionalProperties" if value.is_object() => {
                    let patched = self.patch(value);
                    out.insert(key.clone(), nullable(patched));
                }
                _ => {
                    out.insert(key.clone(), self.full(value));
                }
            }
        }
        Value::Object(out)
    }

    /// `value` as it is, with every `$ref` of a subschema pointing at its target's `$defs` entry.
    fn full(&mut self, value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, sub) in map {
                    if key == "$ref"
                        && let Some(target) = self.reference(value, false)
                    {
                        out.insert(key.clone(), Value::String(target));
                        continue;
                    }
                    if key == "$defs" || key == "definitions" {
                        continue;
                    }
                    out.insert(key.clone(), self.full(sub));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(|i| self.full(i)).collect()),
            other => other.clone(),
        }
    }
}

fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
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
        let reference = patch["properties"]["items"]["anyOf"][0]["$ref"]
            .as_str()
            .unwrap();
        let items = &schema["$defs"][reference.trim_start_matches("#/$defs/")];
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
