//! The state schema: JSON Schema 2020-12 validation and the read-only map derived from it.

use serde_json::Value;

use crate::json::{escape_token, pointer_tokens};

/// A compiled state schema. Keeps the source document because read-only lookups and prompts
/// need it, and the compiled validator because every step validates against it.
pub struct StateSchema {
    document: Value,
    validator: jsonschema::Validator,
}

/// One way an instance fails the schema, located by JSON pointer into the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    pub pointer: String,
    pub message: String,
}

/// Why a document is not a usable state schema, located by JSON pointer into the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaDefect {
    pub pointer: String,
    pub message: String,
}

const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

impl StateSchema {
    /// Compiles `document` as a Draft 2020-12 schema (checked against the meta-schema).
    pub fn compile(document: Value) -> Result<Self, SchemaDefect> {
        if let Some(declared) = document.get("$schema") {
            let declared_str = declared.as_str().unwrap_or_default();
            if declared_str.trim_end_matches('#') != DRAFT_2020_12 {
                return Err(SchemaDefect {
                    pointer: "/$schema".into(),
                    message: format!(
                        "state schemas must be JSON Schema 2020-12; found {declared}. Set \"$schema\" to \"{DRAFT_2020_12}\" or remove it"
                    ),
                });
            }
        }
        if !document.is_object() {
            return Err(SchemaDefect {
                pointer: String::new(),
                message: "a state schema must be a JSON object".into(),
            });
        }
        if let Some(kind) = document.get("type")
            && kind != "object"
        {
            return Err(SchemaDefect {
                pointer: "/type".into(),
                message: format!(
                    "the state is a JSON object (patches merge into it), so the root schema must have \"type\": \"object\", not {kind}"
                ),
            });
        }
        let validator = jsonschema::draft202012::new(&document).map_err(|error| {
            let instance_path = error.instance_path().to_string();
            SchemaDefect {
                pointer: instance_path,
                message: format!("not a valid JSON Schema 2020-12: {error}"),
            }
        })?;
        Ok(Self {
            document,
            validator,
        })
    }

    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Every violation of the schema by `instance`, in the validator's order.
    pub fn violations(&self, instance: &Value) -> Vec<SchemaViolation> {
        self.validator
            .iter_errors(instance)
            .map(|error| SchemaViolation {
                pointer: error.instance_path().to_string(),
                message: error.to_string(),
            })
            .collect()
    }

    pub fn is_valid(&self, instance: &Value) -> bool {
        self.validator.is_valid(instance)
    }

    /// `true` when the instance location `pointer` (or any location above it) is governed by a
    /// subschema marked `"readOnly": true`.
    pub fn is_read_only_at(&self, pointer: &str) -> bool {
        let Some(tokens) = pointer_tokens(pointer) else {
            return false;
        };
        let mut frontier = vec![&self.document];
        for depth in 0..=tokens.len() {
            let mut expanded = Vec::new();
            for schema in frontier {
                self.expand(schema, &mut expanded, 0);
            }
            if expanded.iter().any(|s| is_read_only(s)) {
                return true;
            }
            let Some(token) = tokens.get(depth) else {
                break;
            };
            frontier = expanded
                .into_iter()
                .flat_map(|s| child_schemas(s, token))
                .collect();
            if frontier.is_empty() {
                break;
            }
        }
        false
    }

    /// Instance pointers inside `state` that hold read-only values (the topmost of each subtree).
    pub fn read_only_locations(&self, state: &Value) -> Vec<String> {
        let mut found = Vec::new();
        self.collect_read_only(&self.document, state, String::new(), &mut found);
        found
    }

    /// Read-only locations named by the schema's `properties`, for telling the model up front.
    pub fn declared_read_only_properties(&self) -> Vec<String> {
        let mut found = Vec::new();
        self.collect_declared(&self.document, String::new(), &mut found, 0);
        found
    }

    fn collect_declared(&self, schema: &Value, at: String, found: &mut Vec<String>, depth: usize) {
        if depth > 16 {
            return;
        }
        let mut expanded = Vec::new();
        self.expand(schema, &mut expanded, 0);
        if expanded.iter().any(|s| is_read_only(s)) {
            found.push(at);
            return;
        }
        for s in expanded {
            if let Some(Value::Object(props)) = s.get("properties") {
                for (name, sub) in props {
                    self.collect_declared(
                        sub,
                        format!("{at}/{}", escape_token(name)),
                        found,
                        depth + 1,
                    );
                }
            }
        }
    }

    fn collect_read_only(
        &self,
        schema: &Value,
        instance: &Value,
        at: String,
        found: &mut Vec<String>,
    ) {
        let mut expanded = Vec::new();
        self.expand(schema, &mut expanded, 0);
        if expanded.iter().any(|s| is_read_only(s)) {
            found.push(at);
            return;
        }
        match instance {
            Value::Object(map) => {
                for (key, child) in map {
                    for sub in expanded.iter().flat_map(|s| child_schemas(s, key)) {
                        self.collect_read_only(
                            sub,
                            child,
                            format!("{at}/{}", escape_token(key)),
                            found,
                        );
                    }
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    let key = index.to_string();
                    for sub in expanded.iter().flat_map(|s| child_schemas(s, &key)) {
                        self.collect_read_only(sub, child, format!("{at}/{index}"), found);
                    }
                }
            }
            _ => {}
        }
        found.dedup();
    }

    /// Adds `schema` and every subschema that applies to the same instance location through
    /// local `$ref` and the `allOf`/`anyOf`/`oneOf` combinators. Conservative on purpose: a
    /// read-only mark in any branch protects the location.
    fn expand<'a>(&'a self, schema: &'a Value, out: &mut Vec<&'a Value>, depth: usize) {
        if depth > 32 {
            return;
        }
        out.push(schema);
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str)
            && let Some(target) = self.resolve_local(reference)
        {
            self.expand(target, out, depth + 1);
        }
        for combinator in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = schema.get(combinator) {
                for branch in branches {
                    self.expand(branch, out, depth + 1);
                }
            }
        }
    }

    fn resolve_local(&self, reference: &str) -> Option<&Value> {
        let fragment = reference.strip_prefix('#')?;
        self.document.pointer(fragment)
    }
}

fn is_read_only(schema: &Value) -> bool {
    schema.get("readOnly").and_then(Value::as_bool) == Some(true)
}

/// Subschemas that govern the child named `token` of an instance governed by `schema`.
fn child_schemas<'a>(schema: &'a Value, token: &str) -> Vec<&'a Value> {
    let mut children = Vec::new();
    let mut matched_named = false;
    if let Some(sub) = schema.get("properties").and_then(|p| p.get(token)) {
        children.push(sub);
        matched_named = true;
    }
    if let Some(Value::Object(patterns)) = schema.get("patternProperties") {
        for (pattern, sub) in patterns {
            if pattern_matches(pattern, token) {
                children.push(sub);
                matched_named = true;
            }
        }
    }
    if !matched_named
        && let Some(sub) = schema.get("additionalProperties")
        && sub.is_object()
    {
        children.push(sub);
    }
    if let Ok(index) = token.parse::<usize>() {
        let prefix = schema.get("prefixItems").and_then(Value::as_array);
        match prefix.and_then(|p| p.get(index)) {
            Some(sub) => children.push(sub),
            None => {
                if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                    children.push(sub);
                }
            }
        }
    }
    children
}

/// Pattern matching for `patternProperties` without a regex engine in the pure core: exact
/// anchored literals and prefix patterns are matched; anything more complex is assumed to match,
/// which only makes read-only protection stricter, never weaker.
fn pattern_matches(pattern: &str, token: &str) -> bool {
    let special = |c: char| "\\.+*?()|[]{}^$".contains(c);
    if let Some(literal) = pattern.strip_prefix('^') {
        let literal_part: String = literal.chars().take_while(|c| !special(*c)).collect();
        if !token.starts_with(&literal_part) {
            return false;
        }
        if let Some(exact) = literal.strip_suffix('$')
            && !exact.chars().any(special)
        {
            return token == exact;
        }
        return true;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> StateSchema {
        StateSchema::compile(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "facility": {"$ref": "#/$defs/facility"},
                "inventory": {"type": "object", "additionalProperties": {"type": "string"}},
                "log": {"type": "array", "items": {"type": "object", "properties": {"at": {"type": "integer", "readOnly": true}}}}
            },
            "required": ["inventory"],
            "$defs": {"facility": {"type": "object", "readOnly": true}}
        }))
        .unwrap()
    }

    #[test]
    fn read_only_follows_refs_and_descendants() {
        let s = schema();
        assert!(s.is_read_only_at("/facility"));
        assert!(s.is_read_only_at("/facility/shelves"));
        assert!(!s.is_read_only_at("/inventory/shelf_1"));
        assert!(s.is_read_only_at("/log/3/at"));
        assert!(!s.is_read_only_at("/log/3/what"));
        let state =
            json!({"facility": {"shelves": 500}, "inventory": {}, "log": [{"at": 1}, {"at": 2}]});
        assert_eq!(
            s.read_only_locations(&state),
            vec!["/facility", "/log/0/at", "/log/1/at"]
        );
        assert_eq!(s.declared_read_only_properties(), vec!["/facility"]);
    }

    #[test]
    fn violations_carry_instance_pointers() {
        let s = schema();
        let v = s.violations(&json!({"inventory": {"shelf_1": 7}}));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].pointer, "/inventory/shelf_1");
        assert!(!s.violations(&json!({})).is_empty());
    }

    #[test]
    fn rejects_non_schemas() {
        let err =
            StateSchema::compile(json!({"type": "object", "properties": {"a": {"type": 12}}}))
                .err()
                .unwrap();
        assert!(err.message.contains("not a valid JSON Schema"), "{err:?}");
        let err = StateSchema::compile(json!({"type": "array"}))
            .err()
            .unwrap();
        assert_eq!(err.pointer, "/type");
        let err =
            StateSchema::compile(json!({"$schema": "http://json-schema.org/draft-07/schema#"}))
                .err()
                .unwrap();
        assert_eq!(err.pointer, "/$schema");
    }
}
