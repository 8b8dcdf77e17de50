//! `"writeOnly": true` in a state schema: values that may be written (by the model, by an API
//! write, in an initial state) and that the model sees in its prompts, but that nothing shows a
//! user or an operator — not the API, its events, the CLI, exports or logs. Shown, they read
//! `[redacted]`.
//!
//! [`WriteOnly`] is compiled from the schema document: its graph of subschemas
//! (`schema_graph.rs`: `$ref`, `$dynamicRef`, `$defs` resolved by the jsonschema crate's own
//! `referencing` registry) read as an automaton over the reference tokens of a JSON pointer.
//! A location is write-only when some subschema that may apply there says `"writeOnly": true`,
//! and everything below a write-only location is write-only with it. Conservative on purpose,
//! so that no branch of the schema lets a secret through: every branch of `anyOf`/`oneOf`/
//! `if`-`then`-`else`/`dependentSchemas` counts whether or not it validates, `contains` and the
//! `unevaluated*` keywords count for every item and key, and `patternProperties` and
//! `additionalProperties` are decided exactly as the validator decides them (each pattern is
//! matched by a jsonschema validator built with the state schema's regex options).
//!
//! Three uses: [`WriteOnly::redact`] replaces the write-only values of a state (and
//! [`WriteOnly::redact_patch`] those of an RFC 7396 merge patch or RFC 6902 JSON Patch, by
//! where its values land); [`WriteOnly::collect`] / [`WriteOnly::collect_patch`] gather the
//! write-only values into [`SecretValues`], which removes their every occurrence from free
//! text — a prompt, an observation, a model's raw answer, an error message.

use std::collections::HashMap;

use serde_json::Value;

use crate::json::pointer_tokens;
use crate::schema_graph::{EdgeKind, Label, SchemaGraph};
use crate::secrets::REDACTED;

#[cfg(test)]
mod tests;
mod text;

pub use text::SecretValues;

/// Where write-only values are in the states of one schema.
pub struct WriteOnly {
    /// Node [`HIDDEN`] stands for "inside a write-only value"; the others are the schema's
    /// subschemas that can reach a write-only one (the rest are dropped).
    nodes: Vec<Node>,
    /// The root location: the root subschema and those applied with it.
    root: Vec<usize>,
    /// Compiled `patternProperties` patterns; `None` where a pattern does not compile.
    patterns: Vec<Option<jsonschema::Validator>>,
}

/// Inside a write-only value: every child is hidden too.
const HIDDEN: usize = 0;

#[derive(Default)]
struct Node {
    write_only: bool,
    /// Subschemas applied at the same location.
    same: Vec<usize>,
    /// Subschemas applied at a child, and which children.
    descend: Vec<(Child, usize)>,
}

/// Which children of an object or array a descending subschema applies to.
enum Child {
    /// `properties/NAME`.
    Key(String),
    /// `patternProperties/PATTERN` (an index into `patterns`): keys it matches.
    Pattern(usize),
    /// `additionalProperties`: keys that none of its owner's properties or patterns name.
    Additional {
        names: Vec<String>,
        patterns: Vec<usize>,
    },
    /// `unevaluatedProperties` (every key may be unevaluated).
    AnyKey,
    /// `prefixItems/INDEX`.
    Index(usize),
    /// `items`, from the index after the last `prefixItems`.
    IndexFrom(usize),
    /// `contains`, `unevaluatedItems`.
    AnyIndex,
}

/// One reference token, with what is known of the container it steps into.
#[derive(Clone, Copy)]
enum Token<'a> {
    /// A member of an object.
    Key(&'a str),
    /// An item of an array.
    Index(usize),
    /// A token of a bare JSON pointer: an object key, or an array index when it reads as one
    /// (`-`, JSON Patch's "after the last item", may be any index).
    Either(&'a str),
}

impl WriteOnly {
    /// The write-only locations of `document`, a state schema. A schema whose graph cannot be
    /// built (never the case for a schema that compiled as a `StateSchema`) hides every value
    /// below the root.
    pub fn of_schema(document: &Value) -> Self {
        if !mentions_write_only(document) {
            return Self::none();
        }
        match SchemaGraph::build(document) {
            Ok(graph) => Self::from_graph(&graph),
            Err(_) => Self::everything(),
        }
    }

    /// No write-only location.
    pub fn none() -> Self {
        Self {
            nodes: vec![hidden_node()],
            root: Vec::new(),
            patterns: Vec::new(),
        }
    }

    /// Every value below the root is write-only.
    pub fn everything() -> Self {
        let root = Node {
            write_only: false,
            same: Vec::new(),
            descend: vec![(Child::AnyKey, HIDDEN), (Child::AnyIndex, HIDDEN)],
        };
        Self {
            nodes: vec![hidden_node(), root],
            root: vec![1],
            patterns: Vec::new(),
        }
    }

    fn from_graph(graph: &SchemaGraph<'_>) -> Self {
        let count = graph.nodes.len();
        // Which subschemas can reach a write-only one (itself included), by any edge.
        let mut predecessors: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (from, node) in graph.nodes.iter().enumerate() {
            for edge in &node.edges {
                predecessors[edge.to].push(from);
            }
        }
        let write_only: Vec<bool> = graph
            .nodes
            .iter()
            .map(|n| is_write_only(n.schema))
            .collect();
        let mut live = write_only.clone();
        let mut stack: Vec<usize> = (0..count).filter(|&n| live[n]).collect();
        while let Some(n) = stack.pop() {
            for &p in &predecessors[n] {
                if !live[p] {
                    live[p] = true;
                    stack.push(p);
                }
            }
        }
        // Graph node n is node n + 1 here (node 0 is HIDDEN).
        let mut patterns: Vec<Option<jsonschema::Validator>> = Vec::new();
        let mut pattern_ids: HashMap<String, usize> = HashMap::new();
        let mut pattern_id = |pattern: &str| -> usize {
            *pattern_ids.entry(pattern.to_owned()).or_insert_with(|| {
                patterns.push(compile_pattern(pattern));
                patterns.len() - 1
            })
        };
        let mut nodes = vec![hidden_node()];
        for (n, node) in graph.nodes.iter().enumerate() {
            let mut out = Node {
                write_only: write_only[n],
                ..Node::default()
            };
            if live[n] {
                for edge in node.edges.iter().filter(|e| live[e.to]) {
                    let to = edge.to + 1;
                    match &edge.kind {
                        EdgeKind::Same => out.same.push(to),
                        EdgeKind::Descend(label) => {
                            let child = match label {
                                Label::Property(name) => Child::Key(name.clone()),
                                Label::Pattern { .. } => {
                                    // The keyword is `…/patternProperties/<pattern, escaped>`.
                                    let token = edge.keyword.rsplit('/').next().unwrap_or("");
                                    let pattern = token.replace("~1", "/").replace("~0", "~");
                                    Child::Pattern(pattern_id(&pattern))
                                }
                                Label::Additional { owner } => {
                                    let owner = graph.nodes[*owner].schema;
                                    let names = owner
                                        .get("properties")
                                        .and_then(Value::as_object)
                                        .map(|p| p.keys().cloned().collect())
                                        .unwrap_or_default();
                                    let patterns = owner
                                        .get("patternProperties")
                                        .and_then(Value::as_object)
                                        .map(|p| p.keys().map(|k| pattern_id(k)).collect())
                                        .unwrap_or_default();
                                    Child::Additional { names, patterns }
                                }
                                Label::UnevaluatedProperties => Child::AnyKey,
                                Label::Prefix(index) => Child::Index(*index),
                                Label::ItemsFrom(from) => Child::IndexFrom(*from),
                                Label::Contains | Label::UnevaluatedItems => Child::AnyIndex,
                                // Applies to keys, which are never redacted.
                                Label::Name => continue,
                            };
                            out.descend.push((child, to));
                        }
                    }
                }
            }
            nodes.push(out);
        }
        let mut this = Self {
            nodes,
            root: Vec::new(),
            patterns,
        };
        if live.first().copied().unwrap_or(false) {
            this.root = this.close(vec![1]);
        }
        this
    }

    /// `true` when no location of any state is write-only.
    pub fn is_empty(&self) -> bool {
        self.root.is_empty()
    }

    /// Whether the value at `pointer` (a JSON pointer into a state) is write-only or inside a
    /// write-only value. A token that reads as an array index is tried both as an index and
    /// as a key; a string that is not a JSON pointer counts as write-only.
    pub fn covers(&self, pointer: &str) -> bool {
        match self.locate(pointer) {
            Some(set) => self.hidden(&set),
            None => !self.is_empty(),
        }
    }

    /// Replaces every write-only value of `state` (but `null`) with `"[redacted]"`; `true`
    /// when something was replaced. A write-only root keeps its shape: each member is replaced.
    pub fn redact(&self, state: &mut Value) -> bool {
        if self.is_empty() {
            return false;
        }
        self.redact_at(state, &self.root, true)
    }

    /// Replaces the write-only values a patch writes: an RFC 7396 merge patch (an object,
    /// shaped like the state) or RFC 6902 operations (an array), whose `value`s are redacted
    /// by where their `path` puts them. Returns `true` when something was replaced.
    pub fn redact_patch(&self, patch: &mut Value) -> bool {
        if self.is_empty() {
            return false;
        }
        match patch {
            Value::Object(_) => self.redact_at(patch, &self.root, true),
            Value::Array(operations) => {
                let mut changed = false;
                for operation in operations {
                    let Some(map) = operation.as_object_mut() else {
                        continue;
                    };
                    let at = map
                        .get("path")
                        .and_then(Value::as_str)
                        .and_then(|path| self.locate(path))
                        .unwrap_or_else(|| vec![HIDDEN]);
                    if let Some(value) = map.get_mut("value") {
                        changed |= self.redact_at(value, &at, false);
                    }
                }
                changed
            }
            _ => false,
        }
    }

    /// Adds every write-only string and number of `state` to `secrets`.
    pub fn collect(&self, state: &Value, secrets: &mut SecretValues) {
        if !self.is_empty() {
            self.collect_at(state, &self.root, secrets);
        }
    }

    /// Adds every string and number a patch writes at a write-only location to `secrets`.
    pub fn collect_patch(&self, patch: &Value, secrets: &mut SecretValues) {
        if self.is_empty() {
            return;
        }
        match patch {
            Value::Object(_) => self.collect_at(patch, &self.root, secrets),
            Value::Array(operations) => {
                for operation in operations {
                    let at = operation
                        .get("path")
                        .and_then(Value::as_str)
                        .and_then(|path| self.locate(path))
                        .unwrap_or_else(|| vec![HIDDEN]);
                    if let Some(value) = operation.get("value") {
                        self.collect_at(value, &at, secrets);
                    }
                }
            }
            _ => {}
        }
    }

    /// Adds the write-only values one answer of a journal writes: its kept `patch`, or — for
    /// an answer rejected before a patch was kept — the `state_patch` read from its text (as
    /// the runtime parses answers, else from any JSON object with that member). An answer that
    /// cannot be read at all adds nothing.
    pub fn collect_answer(&self, patch: Option<&Value>, output: &str, secrets: &mut SecretValues) {
        if self.is_empty() {
            return;
        }
        match patch {
            Some(patch) => self.collect_patch(patch, secrets),
            None => {
                let written = match crate::output::parse_output(output) {
                    Ok(parsed) => Some(parsed.state_patch),
                    Err(_) => serde_json::from_str::<Value>(output.trim())
                        .ok()
                        .and_then(|v| v.get("state_patch").cloned()),
                };
                if let Some(patch) = written {
                    self.collect_patch(&patch, secrets);
                }
            }
        }
    }

    /// The write-only values of `state`, ready to clean text with.
    pub fn secrets_of(&self, state: &Value) -> SecretValues {
        let mut secrets = SecretValues::default();
        self.collect(state, &mut secrets);
        secrets
    }

    /// The location `pointer` names; `None` when it is not a JSON pointer.
    fn locate(&self, pointer: &str) -> Option<Vec<usize>> {
        let tokens = pointer_tokens(pointer)?;
        let mut set = self.root.clone();
        for token in &tokens {
            if set.is_empty() {
                break;
            }
            set = self.step(&set, Token::Either(token));
        }
        Some(set)
    }

    fn hidden(&self, set: &[usize]) -> bool {
        set.iter().any(|&n| self.nodes[n].write_only)
    }

    /// `set` with every subschema applied at the same location, sorted, each once.
    fn close(&self, mut set: Vec<usize>) -> Vec<usize> {
        let mut next = 0;
        while next < set.len() {
            for &to in &self.nodes[set[next]].same {
                if !set.contains(&to) {
                    set.push(to);
                }
            }
            next += 1;
        }
        set.sort_unstable();
        set
    }

    /// The location one token below `set`.
    fn step(&self, set: &[usize], token: Token<'_>) -> Vec<usize> {
        if self.hidden(set) {
            return vec![HIDDEN];
        }
        let mut next = Vec::new();
        for &n in set {
            for (child, to) in &self.nodes[n].descend {
                if self.applies(child, token) && !next.contains(to) {
                    next.push(*to);
                }
            }
        }
        if next.is_empty() {
            next
        } else {
            self.close(next)
        }
    }

    fn applies(&self, child: &Child, token: Token<'_>) -> bool {
        let (key, index) = match token {
            Token::Key(key) => (Some(key), None),
            Token::Index(index) => (None, Some(Some(index))),
            // `-` is the end of an array: any index may be meant.
            Token::Either("-") => (Some("-"), Some(None)),
            Token::Either(text) => (Some(text), array_index(text).map(Some)),
        };
        match child {
            Child::Key(name) => key == Some(name.as_str()),
            Child::Pattern(id) => key.is_some_and(|k| self.pattern_matches(*id, k)),
            Child::Additional { names, patterns } => key.is_some_and(|k| {
                !names.iter().any(|n| n == k)
                    && !patterns.iter().any(|&p| self.pattern_matches(p, k))
            }),
            Child::AnyKey => key.is_some(),
            Child::Index(i) => index.is_some_and(|at| at.is_none_or(|at| at == *i)),
            Child::IndexFrom(from) => index.is_some_and(|at| at.is_none_or(|at| at >= *from)),
            Child::AnyIndex => index.is_some(),
        }
    }

    /// Whether pattern `id` matches `key`; a pattern that did not compile matches every key
    /// (its subschema may apply anywhere).
    fn pattern_matches(&self, id: usize, key: &str) -> bool {
        match self.patterns.get(id) {
            Some(Some(validator)) => validator.is_valid(&Value::String(key.to_owned())),
            _ => true,
        }
    }

    fn redact_at(&self, value: &mut Value, set: &[usize], is_root: bool) -> bool {
        if set.is_empty() {
            return false;
        }
        if self.hidden(set) && !is_root {
            if value.is_null() {
                return false;
            }
            *value = Value::String(REDACTED.to_owned());
            return true;
        }
        let mut changed = false;
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    let next = self.step(set, Token::Key(key));
                    changed |= self.redact_at(child, &next, false);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter_mut().enumerate() {
                    let next = self.step(set, Token::Index(index));
                    changed |= self.redact_at(child, &next, false);
                }
            }
            _ => {}
        }
        changed
    }

    fn collect_at(&self, value: &Value, set: &[usize], secrets: &mut SecretValues) {
        if set.is_empty() {
            return;
        }
        if self.hidden(set) {
            secrets.add_value(value);
            return;
        }
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    self.collect_at(child, &self.step(set, Token::Key(key)), secrets);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    self.collect_at(child, &self.step(set, Token::Index(index)), secrets);
                }
            }
            _ => {}
        }
    }
}

impl std::fmt::Debug for WriteOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOnly")
            .field("subschemas", &(self.nodes.len() - 1))
            .field("empty", &self.is_empty())
            .finish()
    }
}

fn hidden_node() -> Node {
    Node {
        write_only: true,
        same: Vec::new(),
        descend: Vec::new(),
    }
}

/// An RFC 6901 array index: `0`, or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if token.len() > 1 && token.starts_with('0') {
        return None;
    }
    token.parse().ok()
}

/// A validator that accepts the strings `pattern` matches, as the state schema's validator
/// matches `patternProperties` (the linear-time regex engine).
pub(crate) fn compile_pattern(pattern: &str) -> Option<jsonschema::Validator> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(&serde_json::json!({"type": "string", "pattern": pattern}))
        .ok()
}

/// `true` when `schema` itself says `"writeOnly": true`.
fn is_write_only(schema: &Value) -> bool {
    schema.get("writeOnly").and_then(Value::as_bool) == Some(true)
}

/// `true` when some object in `document` has `"writeOnly": true` (a schema without one needs
/// no graph).
pub fn mentions_write_only(document: &Value) -> bool {
    let mut stack = vec![document];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if is_write_only(value) {
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
