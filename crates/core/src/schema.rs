//! The state schema: JSON Schema 2020-12 validation, and which instance locations are read-only.
//!
//! Read-only-ness is decided by the schema's own evaluation, never by a walk of our own:
//! JSON Schema 2020-12 reports `readOnly` as an annotation at each instance location it
//! applies to, from exactly the subschemas that validate (failed `anyOf`/`oneOf` branches and a
//! failed `if` drop theirs). `changed_read_only_locations` evaluates the state before and after
//! a patch and compares the values at every location annotated read-only in either.
//!
//! Patterns are matched with the linear-time `regex` engine, not a backtracking one: every
//! match finishes, so an evaluation is never cut short (a backtracking engine that gives up
//! makes the validator report no annotations at all) and no string a model writes can make
//! validation backtrack for long. Look-around and back-references are refused at compile time.

use std::sync::Mutex;

use serde_json::Value;

use crate::board::Pointer;
use crate::json::escape_token;
use crate::schema_graph::{EdgeKind, Label, PropertyPath, SchemaGraph};
use crate::schema_problem::{ReaderView, SchemaProblem};
use crate::write_only::WriteOnly;

/// A compiled state schema. Keeps the source document because prompts and the derived output
/// schema need it, and the compiled validator because every step validates against it.
pub struct StateSchema {
    document: Value,
    validator: jsonschema::Validator,
    /// `false` when no `"readOnly": true` appears anywhere: read-only checks are skipped.
    has_read_only: bool,
    /// Where every `readOnly` sits, when each ends a plain chain of `properties`
    /// ([`SchemaGraph::property_chain_read_only`]): then the annotations of a valid state are
    /// these locations it has, found without an annotating evaluation (which cost more than
    /// the rest of a step's validation on the warehouse's state).
    property_read_only: Option<Vec<PropertyPath>>,
    /// Its `writeOnly` locations: no problem is rendered with what they hold.
    write_only: WriteOnly,
    /// The last states evaluated for read-only annotations, newest first: a step's state before
    /// is the previous step's state after, so each state is evaluated once, not twice.
    recent: Mutex<Vec<(Value, Vec<String>)>>,
}

/// How many evaluated states `StateSchema` remembers.
const RECENT_EVALUATIONS: usize = 2;

/// What [`StateSchema::check_write`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCheck {
    Fine,
    /// Read-only locations the write changes, topmost first.
    ReadOnly(Vec<String>),
    /// The new state breaks the schema (never empty).
    Invalid(Vec<SchemaProblem>),
}

/// Why a document is not a usable state schema, located by JSON pointer into the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaDefect {
    pub pointer: String,
    pub message: String,
}

const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// How far below the root `declared_read_only_properties` looks.
const MAX_DECLARED_DEPTH: usize = 16;

impl StateSchema {
    /// Compiles `document` as a Draft 2020-12 schema (checked against the meta-schema and by
    /// the schema guard); the first defect found, see [`StateSchema::compile_all`].
    pub fn compile(document: Value) -> Result<Self, SchemaDefect> {
        Self::compile_all(document).map_err(|mut defects| defects.swap_remove(0))
    }

    /// Compiles `document`, or returns every defect found (never an empty list).
    pub fn compile_all(document: Value) -> Result<Self, Vec<SchemaDefect>> {
        if let Some(declared) = document.get("$schema") {
            let declared_str = declared.as_str().unwrap_or_default();
            if declared_str.trim_end_matches('#') != DRAFT_2020_12 {
                return Err(vec![SchemaDefect {
                    pointer: "/$schema".into(),
                    message: format!(
                        "state schemas must be JSON Schema 2020-12; found {declared}. Set \"$schema\" to \"{DRAFT_2020_12}\" or remove it"
                    ),
                }]);
            }
        }
        if !document.is_object() {
            return Err(vec![SchemaDefect {
                pointer: String::new(),
                message: "a state schema must be a JSON object".into(),
            }]);
        }
        if let Some(kind) = document.get("type")
            && kind != "object"
        {
            return Err(vec![SchemaDefect {
                pointer: "/type".into(),
                message: format!(
                    "the state is a JSON object (patches merge into it), so the root schema must have \"type\": \"object\", not {kind}"
                ),
            }]);
        }
        // The guard runs before the validator is built, so nothing ever evaluates a schema it
        // refuses.
        let (defects, bare_ifs, property_read_only) = match SchemaGraph::build(&document) {
            Ok(graph) => (
                crate::schema_guard::check(&graph),
                bare_ifs(&graph),
                graph.property_chain_read_only(),
            ),
            Err(defects) => (defects, Vec::new(), None),
        };
        if !defects.is_empty() {
            return Err(defects);
        }
        // The validator skips an `if` that has neither `then` nor `else`, and with it the
        // annotations (`readOnly` among them) the specification collects from it. `"then":
        // true` changes no validation outcome and makes the validator evaluate it.
        let mut evaluated = document.clone();
        for pointer in bare_ifs {
            if let Some(Value::Object(map)) = evaluated.pointer_mut(&pointer) {
                map.insert("then".into(), Value::Bool(true));
            }
        }
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(&evaluated)
            .map_err(|error| {
                let instance_path = error.instance_path().to_string();
                vec![SchemaDefect {
                    pointer: instance_path,
                    message: format!(
                        "not a valid JSON Schema 2020-12: {error} (patterns use the linear-time regex syntax: no look-around, no back-references)"
                    ),
                }]
            })?;
        let has_read_only = mentions_read_only(&document);
        let write_only = WriteOnly::of_schema(&document);
        Ok(Self {
            document,
            validator,
            has_read_only,
            property_read_only,
            write_only,
            recent: Mutex::new(Vec::new()),
        })
    }

    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Every violation of the schema by `instance`, in the validator's order, kept without
    /// the instance: text only through [`SchemaProblem::render`], for one reader.
    pub fn violations(&self, instance: &Value) -> Vec<SchemaProblem> {
        self.validator
            .iter_errors(instance)
            .map(|error| SchemaProblem::of_error(&error))
            .collect()
    }

    /// The schema's `writeOnly` locations.
    pub fn write_only(&self) -> &WriteOnly {
        &self.write_only
    }

    /// A reader of the whole instance (write-only values excepted): the task's own state, a
    /// board read without limits.
    pub fn whole_view(&self) -> ReaderView<'_> {
        ReaderView::whole(&self.write_only)
    }

    /// A reader of `reads` only: a board member, an API key limited to board pointers.
    pub fn view_of<'a>(&'a self, reads: &'a [Pointer]) -> ReaderView<'a> {
        ReaderView::reads(reads, &self.write_only)
    }

    pub fn is_valid(&self, instance: &Value) -> bool {
        self.validator.is_valid(instance)
    }

    /// `true` when the schema says `"readOnly": true` somewhere.
    pub fn has_read_only(&self) -> bool {
        self.has_read_only
    }

    /// Instance locations (JSON pointers) that evaluating `instance` annotates with
    /// `"readOnly": true`, each once, in evaluation order. Empty when the instance fails the
    /// schema: JSON Schema drops every annotation of a failed evaluation.
    pub fn read_only_annotations(&self, instance: &Value) -> Vec<String> {
        self.annotations_given(instance, None)
    }

    /// `read_only_annotations`, with the instance's validity when already known.
    fn annotations_given(&self, instance: &Value, valid: Option<bool>) -> Vec<String> {
        if !self.has_read_only || valid == Some(false) {
            return Vec::new();
        }
        if let Some(paths) = &self.property_read_only {
            if !valid.unwrap_or_else(|| self.validator.is_valid(instance)) {
                return Vec::new();
            }
            return paths
                .iter()
                .filter(|path| holds(instance, &path.names))
                .map(|path| path.pointer.clone())
                .collect();
        }
        let evaluation = self.validator.evaluate(instance);
        let mut found: Vec<String> = Vec::new();
        for entry in evaluation.iter_annotations() {
            if crate::schema_graph::is_read_only(entry.annotations.value()) {
                let location = entry.instance_location.as_str();
                if !found.iter().any(|f| f == location) {
                    found.push(location.to_owned());
                }
            }
        }
        found
    }

    /// The read-only locations whose value differs between `before` and `after` (a value that
    /// appears or disappears counts, and so does any change below the location): every location
    /// annotated read-only when evaluating either state. Each is reported once, topmost first,
    /// and a location inside another reported one is left out.
    pub fn changed_read_only_locations(&self, before: &Value, after: &Value) -> Vec<String> {
        self.changed_given(before, after, None)
    }

    /// Checks a write from `before` to `after`: the read-only locations it changes, else the
    /// schema violations of `after` (as `changed_read_only_locations`, then `violations`),
    /// validating `after` once where a state is valid.
    pub fn check_write(&self, before: &Value, after: &Value) -> WriteCheck {
        let valid = self.validator.is_valid(after);
        let read_only = self.changed_given(before, after, Some(valid));
        if !read_only.is_empty() {
            WriteCheck::ReadOnly(read_only)
        } else if valid {
            WriteCheck::Fine
        } else {
            let violations = self.violations(after);
            // The validator's two answers agree; should they not, its errors decide, as
            // they did before this shortcut.
            if violations.is_empty() {
                WriteCheck::Fine
            } else {
                WriteCheck::Invalid(violations)
            }
        }
    }

    fn changed_given(
        &self,
        before: &Value,
        after: &Value,
        after_valid: Option<bool>,
    ) -> Vec<String> {
        if !self.has_read_only {
            return Vec::new();
        }
        let mut locations = self.remembered_annotations(before, None);
        for location in self.remembered_annotations(after, after_valid) {
            if !locations.contains(&location) {
                locations.push(location);
            }
        }
        let mut changed: Vec<String> = locations
            .into_iter()
            .filter(|l| before.pointer(l) != after.pointer(l))
            .collect();
        changed.sort_by(|a, b| {
            let depth = |p: &str| p.matches('/').count();
            depth(a).cmp(&depth(b)).then_with(|| a.cmp(b))
        });
        let mut reported: Vec<String> = Vec::new();
        for location in changed {
            if !reported
                .iter()
                .any(|r| crate::json::pointer_is_within(&location, r))
            {
                reported.push(location);
            }
        }
        reported
    }

    /// `read_only_annotations`, reusing the result for a state evaluated recently.
    fn remembered_annotations(&self, state: &Value, valid: Option<bool>) -> Vec<String> {
        if let Ok(recent) = self.recent.lock()
            && let Some((_, found)) = recent.iter().find(|(seen, _)| seen == state)
        {
            return found.clone();
        }
        let found = self.annotations_given(state, valid);
        if let Ok(mut recent) = self.recent.lock() {
            recent.insert(0, (state.clone(), found.clone()));
            recent.truncate(RECENT_EVALUATIONS);
        }
        found
    }

    /// Read-only properties named by the schema's `properties`, for telling the model up front
    /// (enforcement does not use this: see [`StateSchema::changed_read_only_locations`]).
    /// Follows `$ref`s and combinators; visits each subschema a bounded number of times.
    pub fn declared_read_only_properties(&self) -> Vec<String> {
        let Ok(graph) = SchemaGraph::build(&self.document) else {
            return Vec::new();
        };
        let read_only = graph.read_only_closure();
        let same = graph.same_edges();
        let mut budget = 4 * graph.nodes.len() + 64;
        let mut found: Vec<String> = Vec::new();
        let mut stack = vec![(0usize, String::new(), 0usize)];
        while let Some((node, at, depth)) = stack.pop() {
            if budget == 0 {
                break;
            }
            budget -= 1;
            if read_only[node] {
                if !found.contains(&at) {
                    found.push(at);
                }
                continue;
            }
            if depth >= MAX_DECLARED_DEPTH {
                continue;
            }
            // Same-location closure in document order, each subschema once.
            let mut closure = vec![node];
            let mut next = 0;
            while next < closure.len() {
                for &w in &same[closure[next]] {
                    if !closure.contains(&w) && closure.len() < 256 {
                        closure.push(w);
                    }
                }
                next += 1;
            }
            let mut children = Vec::new();
            for &s in &closure {
                for edge in &graph.nodes[s].edges {
                    if let EdgeKind::Descend(Label::Property(name)) = &edge.kind {
                        children.push((edge.to, format!("{at}/{}", escape_token(name)), depth + 1));
                    }
                }
            }
            stack.extend(children.into_iter().rev());
        }
        found
    }
}

/// Whether `instance` has the property chain `names`, each step an object holding the next
/// name (what `properties` applies to).
fn holds(instance: &Value, names: &[String]) -> bool {
    let mut at = instance;
    for name in names {
        match at.as_object().and_then(|object| object.get(name)) {
            Some(value) => at = value,
            None => return false,
        }
    }
    true
}

/// Pointers of the subschemas that have `if` but neither `then` nor `else`.
fn bare_ifs(graph: &SchemaGraph<'_>) -> Vec<String> {
    graph
        .nodes
        .iter()
        .filter(|node| {
            node.schema.get("if").is_some()
                && node.schema.get("then").is_none()
                && node.schema.get("else").is_none()
        })
        .map(|node| node.pointer.clone())
        .collect()
}

/// `true` when some object in `document` has `"readOnly": true`.
fn mentions_read_only(document: &Value) -> bool {
    let mut stack = vec![document];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if map.get("readOnly") == Some(&Value::Bool(true)) {
                    return true;
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    false
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

    /// The annotations of an annotating evaluation, for comparing with the shortcut.
    fn evaluated(schema: &StateSchema, instance: &Value) -> Vec<String> {
        let evaluation = schema.validator.evaluate(instance);
        let mut found: Vec<String> = Vec::new();
        for entry in evaluation.iter_annotations() {
            let location = entry.instance_location.as_str().to_owned();
            if crate::schema_graph::is_read_only(entry.annotations.value())
                && !found.contains(&location)
            {
                found.push(location);
            }
        }
        found.sort();
        found
    }

    #[test]
    fn read_only_at_the_end_of_property_chains_needs_no_evaluation() {
        let s = StateSchema::compile(json!({
            "type": "object",
            "properties": {
                "count": {"const": 500, "readOnly": true},
                "meta": {
                    "type": "object",
                    "properties": {"a/b~c": {"type": "string", "readOnly": true}, "free": {}},
                    "anyOf": [{"required": ["free"]}, {"required": ["a/b~c"]}]
                },
                "items": {"type": "object", "additionalProperties": {"type": "string"}}
            },
            "$defs": {"unused": {"readOnly": true}},
            "required": ["items"]
        }))
        .unwrap();
        assert!(s.property_read_only.is_some());
        for instance in [
            json!({"count": 500, "meta": {"a/b~c": "x"}, "items": {}}),
            json!({"meta": {"free": 1}, "items": {"k": "v"}}),
            json!({"count": 500, "meta": [1], "items": {}}),
            json!({"count": 500, "items": {}, "meta": {"a/b~c": "x", "free": 2}}),
            // Invalid: no annotations at all.
            json!({"count": 501, "meta": {"a/b~c": "x"}, "items": {}}),
            json!({"count": 500}),
        ] {
            let mut quick = s.read_only_annotations(&instance);
            quick.sort();
            assert_eq!(quick, evaluated(&s, &instance), "{instance}");
        }
        assert_eq!(
            s.read_only_annotations(&json!({"count": 500, "meta": {"a/b~c": "x"}, "items": {}})),
            vec!["/count", "/meta/a~1b~0c"]
        );
        // `$ref`, `items`: evaluated as before.
        assert!(schema().property_read_only.is_none());
        let under_any_of = StateSchema::compile(json!({
            "type": "object",
            "anyOf": [{"properties": {"a": {"readOnly": true}}}, {"required": ["b"]}]
        }))
        .unwrap();
        assert!(under_any_of.property_read_only.is_none());
    }

    #[test]
    fn read_only_comes_from_evaluation() {
        let s = schema();
        let state =
            json!({"facility": {"shelves": 500}, "inventory": {}, "log": [{"at": 1}, {"at": 2}]});
        assert_eq!(
            s.read_only_annotations(&state),
            vec!["/facility", "/log/0/at", "/log/1/at"]
        );
        let mut after = state.clone();
        after["facility"]["shelves"] = json!(501);
        after["log"][1]["what"] = json!("x");
        assert_eq!(
            s.changed_read_only_locations(&state, &after),
            vec!["/facility"]
        );
        after["log"].as_array_mut().unwrap().push(json!({"at": 3}));
        assert_eq!(
            s.changed_read_only_locations(&state, &after),
            vec!["/facility", "/log/2/at"]
        );
        assert_eq!(s.declared_read_only_properties(), vec!["/facility"]);
    }

    #[test]
    fn violations_carry_instance_pointers() {
        let s = schema();
        let v = s.violations(&json!({"inventory": {"shelf_1": 7}}));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].location().to_string(), "/inventory/shelf_1");
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
