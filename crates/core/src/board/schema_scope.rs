//! A board's schema seen through a scope: what a reader limited to some pointers is shown of
//! the schema ([`project_schema`]), and which pointers of a skill's scope name nothing the
//! schema declares ([`undeclared`]).
//!
//! Both walk the schema's graph of subschemas (`schema_graph.rs`, references resolved as the
//! validator resolves them) along a pointer's tokens: at each location, the subschemas that
//! apply there; at its child `token`, those its `properties`, matching `patternProperties`,
//! `additionalProperties` (for a key none of the others name), `prefixItems` and `items`
//! apply.
//!
//! # What a limited reader is shown of the schema
//!
//! [`project_schema`] keeps every subschema that applies, whatever the instance, at a location
//! the reader reads whole: everything it says is about that location's own members. On the way
//! to a read (the root, and every ancestor of a read that is not within one), it keeps only
//! `type` (when the subschemas applied there agree on one), `readOnly`/`writeOnly`, `required`
//! restricted to the members that lead to a read, and `properties` (or, for an array,
//! `prefixItems` up to the index read) leading to the reads. Everything else there is left out,
//! because it speaks of members the reader cannot see or counts them: other `properties`,
//! `required` members and `dependentRequired`/`dependentSchemas` entries, `propertyNames`,
//! `patternProperties`, `additionalProperties`, `unevaluatedProperties`, `min`/
//! `maxProperties`, `if`/`then`/`else`, `allOf`/`anyOf`/`oneOf`/`not`, `const`/`enum`,
//! `title`/`description`/`$comment`, and the subschemas of conditional branches. References in
//! the kept parts point at copies under `$defs` with names of their own (`part1`, ...), so no
//! name of the original `$defs` is shown; `$id`, `$anchor`, `$dynamicAnchor`, nested `$defs`
//! and `$comment` are dropped from the copies. The result describes the readable part only:
//! the board may refuse a write that it accepts.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value, json};

use super::pointer::{Pointer, array_index};
use crate::schema_graph::{EdgeKind, Label, SchemaGraph};

/// Keywords dropped from every copied subschema.
const DROPPED_IN_COPIES: [&str; 7] = [
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$defs",
    "definitions",
    "$comment",
    "$schema",
];

struct Walker<'a> {
    graph: SchemaGraph<'a>,
    patterns: HashMap<String, Option<jsonschema::Validator>>,
}

/// How a child subschema is reached.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Member,
    Item,
}

impl<'a> Walker<'a> {
    fn new(document: &'a Value) -> Option<Self> {
        Some(Self {
            graph: SchemaGraph::build(document).ok()?,
            patterns: HashMap::new(),
        })
    }

    /// `nodes` with every subschema applied at the same location: all of them (`all`), or only
    /// those applied whatever the instance (`$ref`, `$dynamicRef`, `allOf`).
    fn closure(&self, mut nodes: Vec<usize>, all: bool) -> Vec<usize> {
        let mut next = 0;
        while next < nodes.len() {
            for edge in &self.graph.nodes[nodes[next]].edges {
                let always = edge.keyword.ends_with("/$ref")
                    || edge.keyword.ends_with("/$dynamicRef")
                    || edge
                        .keyword
                        .rsplit('/')
                        .nth(1)
                        .is_some_and(|parent| parent == "allOf");
                if edge.kind == EdgeKind::Same && (all || always) && !nodes.contains(&edge.to) {
                    nodes.push(edge.to);
                }
            }
            next += 1;
        }
        nodes
    }

    fn pattern_matches(&mut self, pattern: &str, key: &str) -> bool {
        let compiled = self
            .patterns
            .entry(pattern.to_owned())
            .or_insert_with(|| crate::write_only::compile_pattern(pattern));
        match compiled {
            Some(validator) => validator.is_valid(&Value::String(key.to_owned())),
            // A pattern that does not compile never compiled into the board's validator either.
            None => false,
        }
    }

    /// The subschemas that apply to child `token` of a location where `at` apply.
    fn children(&mut self, at: &[usize], token: &str) -> Vec<(usize, Via)> {
        let mut out: Vec<(usize, Via)> = Vec::new();
        let index = array_index(token);
        let edges: Vec<(usize, Label, String)> = at
            .iter()
            .flat_map(|&n| self.graph.nodes[n].edges.iter())
            .filter_map(|e| match &e.kind {
                EdgeKind::Descend(label) => Some((e.to, label.clone(), e.keyword.clone())),
                EdgeKind::Same => None,
            })
            .collect();
        for (to, label, keyword) in edges {
            let via = match label {
                Label::Property(name) => (name == token).then_some(Via::Member),
                Label::Pattern { .. } => {
                    let pattern = unescape(keyword.rsplit('/').next().unwrap_or(""));
                    self.pattern_matches(&pattern, token).then_some(Via::Member)
                }
                Label::Additional { owner } => {
                    let schema = self.graph.nodes[owner].schema;
                    let named = schema
                        .get("properties")
                        .and_then(Value::as_object)
                        .is_some_and(|p| p.contains_key(token));
                    let patterns: Vec<String> = schema
                        .get("patternProperties")
                        .and_then(Value::as_object)
                        .map(|p| p.keys().cloned().collect())
                        .unwrap_or_default();
                    let matched = patterns.iter().any(|p| self.pattern_matches(p, token));
                    (!named && !matched).then_some(Via::Member)
                }
                Label::Prefix(i) => (index == Some(i)).then_some(Via::Item),
                Label::ItemsFrom(from) => index.is_some_and(|i| i >= from).then_some(Via::Item),
                Label::UnevaluatedProperties
                | Label::Contains
                | Label::UnevaluatedItems
                | Label::Name => None,
            };
            if let Some(via) = via
                && !out.iter().any(|(n, _)| *n == to)
            {
                out.push((to, via));
            }
        }
        out
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// The board schema `document` as a reader of `reads` is shown it (the rules of the module
/// documentation). A read of `""` shows the whole schema; a schema whose graph cannot be
/// built (never one a board was created with) shows `{"type": "object"}`.
pub fn project_schema(document: &Value, reads: &[Pointer]) -> Value {
    if reads.iter().any(Pointer::is_root) {
        return document.clone();
    }
    let Some(mut walker) = Walker::new(document) else {
        return json!({"type": "object"});
    };
    let mut copies = Copies::default();
    let tails: Vec<&[String]> = reads.iter().map(Pointer::tokens).collect();
    let root = walker.closure(vec![0], false);
    let mut out = on_the_way(&mut walker, &mut copies, &root, &tails);
    if let Value::Object(map) = &mut out {
        if let Some(declared) = document.get("$schema") {
            map.insert("$schema".into(), declared.clone());
        }
        let defs = copies.finish(&walker);
        if !defs.is_empty() {
            map.insert("$defs".into(), Value::Object(defs));
        }
    }
    out
}

/// The projected subschema of a location on the way to the reads `tails` (each the rest of a
/// read's tokens below it, none empty), where the subschemas `at` apply whatever the instance.
fn on_the_way(
    walker: &mut Walker<'_>,
    copies: &mut Copies,
    at: &[usize],
    tails: &[&[String]],
) -> Value {
    let mut out = Map::new();
    let schemas: Vec<&Value> = at.iter().map(|&n| walker.graph.nodes[n].schema).collect();
    let types: Vec<&Value> = schemas.iter().filter_map(|s| s.get("type")).collect();
    if let Some(first) = types.first()
        && types.iter().all(|t| t == first)
    {
        out.insert("type".into(), (*first).clone());
    }
    for flag in ["readOnly", "writeOnly"] {
        if schemas
            .iter()
            .any(|s| s.get(flag) == Some(&Value::Bool(true)))
        {
            out.insert(flag.into(), Value::Bool(true));
        }
    }
    // The reads below, grouped by their first token, in token order.
    let mut groups: BTreeMap<&str, Vec<&[String]>> = BTreeMap::new();
    for tail in tails {
        if let Some((first, rest)) = tail.split_first() {
            groups.entry(first.as_str()).or_default().push(rest);
        }
    }
    let mut properties = Map::new();
    let mut items: BTreeMap<usize, Value> = BTreeMap::new();
    for (token, rests) in groups {
        let children = walker.children(at, token);
        if children.is_empty() {
            continue;
        }
        let by_item = children.iter().all(|(_, via)| *via == Via::Item);
        let nodes: Vec<usize> = children.iter().map(|(n, _)| *n).collect();
        let shown = if rests.iter().any(|rest| rest.is_empty()) {
            copies.keep_all(walker, &nodes)
        } else {
            let below = walker.closure(nodes, false);
            on_the_way(walker, copies, &below, &rests)
        };
        match (by_item, array_index(token)) {
            (true, Some(index)) => {
                items.insert(index, shown);
            }
            _ => {
                properties.insert(token.to_owned(), shown);
            }
        }
    }
    let required: Vec<Value> = schemas
        .iter()
        .filter_map(|s| s.get("required").and_then(Value::as_array))
        .flatten()
        .filter(|name| name.as_str().is_some_and(|n| properties.contains_key(n)))
        .cloned()
        .fold(Vec::new(), |mut kept, name| {
            if !kept.contains(&name) {
                kept.push(name);
            }
            kept
        });
    if !properties.is_empty() {
        out.insert("properties".into(), Value::Object(properties));
    }
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    if let Some((&last, _)) = items.last_key_value() {
        let mut prefix = vec![Value::Bool(true); last + 1];
        for (index, shown) in items {
            prefix[index] = shown;
        }
        out.insert("prefixItems".into(), Value::Array(prefix));
    }
    Value::Object(out)
}

/// The subschemas copied for readable locations, and those their references need, each under a
/// name of its own in `$defs`.
#[derive(Default)]
struct Copies {
    /// Graph node → its name in `$defs`, in the order first referenced.
    named: Vec<(usize, String)>,
}

impl Copies {
    fn name_of(&mut self, node: usize) -> String {
        if let Some((_, name)) = self.named.iter().find(|(n, _)| *n == node) {
            return name.clone();
        }
        let name = format!("part{}", self.named.len() + 1);
        self.named.push((node, name.clone()));
        name
    }

    /// The subschemas `nodes` (all applied at one readable location) as one.
    fn keep_all(&mut self, walker: &Walker<'_>, nodes: &[usize]) -> Value {
        let mut parts: Vec<Value> = nodes.iter().map(|&n| self.copy(walker, n)).collect();
        if parts.len() == 1 {
            parts.remove(0)
        } else {
            json!({"allOf": parts})
        }
    }

    /// A copy of subschema `node` whose references name copies under `$defs`.
    fn copy(&mut self, walker: &Walker<'_>, node: usize) -> Value {
        let root = &walker.graph.nodes[node];
        let mut copy = root.schema.clone();
        // Every subschema inside this one (by its place in the document), with its references;
        // not those under its own `$defs`, which the copy drops.
        let inside = |pointer: &str| {
            let Some(rest) = pointer.strip_prefix(root.pointer.as_str()) else {
                return false;
            };
            (rest.is_empty() || rest.starts_with('/'))
                && !rest
                    .split('/')
                    .any(|token| token == "$defs" || token == "definitions")
        };
        let mut rewrites: Vec<(String, String)> = Vec::new();
        for other in &walker.graph.nodes {
            if !inside(&other.pointer) {
                continue;
            }
            for edge in &other.edges {
                let dynamic = edge.keyword.ends_with("/$dynamicRef");
                if edge.keyword.ends_with("/$ref") || dynamic {
                    let name = self.name_of(edge.to);
                    rewrites.push((edge.keyword[root.pointer.len()..].to_owned(), name));
                }
            }
        }
        for (keyword, name) in rewrites {
            let Some((holder, key)) = keyword.rsplit_once('/') else {
                continue;
            };
            if let Some(Value::Object(map)) = copy.pointer_mut(holder) {
                map.remove(key);
                map.insert("$ref".into(), Value::String(format!("#/$defs/{name}")));
            }
        }
        strip(&mut copy);
        copy
    }

    /// The `$defs` of the projection: every referenced subschema, copied in turn.
    fn finish(&mut self, walker: &Walker<'_>) -> Map<String, Value> {
        let mut defs = Map::new();
        let mut done = 0;
        while done < self.named.len() {
            let (node, name) = self.named[done].clone();
            let copy = self.copy(walker, node);
            defs.insert(name, copy);
            done += 1;
        }
        defs
    }
}

/// Removes the keywords of [`DROPPED_IN_COPIES`] from every subschema position of a copy
/// (object values; keys of `properties` and the like are names, not keywords, and stay).
fn strip(value: &mut Value) {
    let Value::Object(map) = value else { return };
    for keyword in DROPPED_IN_COPIES {
        map.remove(keyword);
    }
    for (key, child) in map.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "dependentSchemas" => {
                if let Value::Object(subs) = child {
                    subs.values_mut().for_each(strip);
                }
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(subs) = child {
                    subs.iter_mut().for_each(strip);
                }
            }
            "not"
            | "if"
            | "then"
            | "else"
            | "items"
            | "contains"
            | "additionalProperties"
            | "unevaluatedProperties"
            | "unevaluatedItems"
            | "propertyNames" => strip(child),
            _ => {}
        }
    }
}

/// Why `pointer` names nothing in the board schema `document`, when it does not: a location
/// the schema forbids (`additionalProperties: false`, `items: false`, a type without members),
/// or a member that an object whose members the schema lists does not list. `None` when some
/// subschema, in any branch, declares the location, or when the schema leaves the location
/// open (an object without `properties`, `{}`): then nothing can be said.
pub fn undeclared(document: &Value, pointer: &Pointer) -> Option<String> {
    let mut walker = Walker::new(document)?;
    let mut at = walker.closure(vec![0], true);
    let mut here = Pointer::root();
    for token in pointer.tokens() {
        let place = if here.is_root() {
            "the board's root".to_owned()
        } else {
            format!("\"{here}\"")
        };
        let children = walker.children(&at, token);
        let live: Vec<usize> = children
            .iter()
            .map(|(n, _)| *n)
            .filter(|&n| walker.graph.nodes[n].schema != &Value::Bool(false))
            .collect();
        if !live.is_empty() {
            at = walker.closure(live, true);
            here = here.child(token.clone());
            continue;
        }
        if !children.is_empty() {
            return Some(format!(
                "the schema forbids \"{token}\" at {place} (its `additionalProperties`, `prefixItems` or `items` is false)"
            ));
        }
        // `unevaluatedProperties` with a schema admits any key the others leave.
        let admits_any = at.iter().any(|&n| {
            walker.graph.nodes[n].edges.iter().any(|e| {
                e.kind == EdgeKind::Descend(Label::UnevaluatedProperties)
                    && walker.graph.nodes[e.to].schema != &Value::Bool(false)
            })
        });
        if admits_any {
            return None;
        }
        let schemas: Vec<&Value> = at.iter().map(|&n| walker.graph.nodes[n].schema).collect();
        let containers = ["object", "array"];
        let types: Vec<&str> = schemas
            .iter()
            .filter_map(|s| s.get("type"))
            .flat_map(|t| match t {
                Value::String(one) => vec![one.as_str()],
                Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            })
            .collect();
        if !types.is_empty() && types.iter().all(|t| !containers.contains(t)) {
            return Some(format!(
                "{place} is a {} in the schema, which has no members",
                types[0]
            ));
        }
        let mut listed: Vec<String> = schemas
            .iter()
            .filter_map(|s| s.get("properties").and_then(Value::as_object))
            .flat_map(|p| p.keys().cloned())
            .collect();
        listed.sort();
        listed.dedup();
        let has_patterns = schemas.iter().any(|s| s.get("patternProperties").is_some());
        if !listed.is_empty() || has_patterns {
            let names: Vec<String> = listed.iter().map(|n| format!("\"{n}\"")).collect();
            return Some(format!(
                "the schema lists no member \"{token}\" at {place}{}",
                if names.is_empty() {
                    " (and none of its patternProperties matches)".to_owned()
                } else {
                    format!(" (it lists {})", names.join(", "))
                }
            ));
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(list: &[&str]) -> Vec<Pointer> {
        list.iter().map(|p| Pointer::parse(p).unwrap()).collect()
    }

    #[test]
    fn a_limited_reader_sees_only_what_lies_on_the_way_to_its_reads() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "TOP-SECRET-TITLE",
            "type": "object",
            "required": ["pub", "vault_x"],
            "maxProperties": 4,
            "dependentRequired": {"pub": ["vault_x"]},
            "propertyNames": {"enum": ["pub", "vault_x", "deep"]},
            "if": {"properties": {"vault_x": {"const": 1}}}, "then": {"required": ["deep"]},
            "properties": {
                "pub": {"$ref": "#/$defs/vault_def"},
                "vault_x": {"type": "integer"},
                "deep": {"type": "object", "properties": {"mine": {"type": "array", "items": {"$ref": "#/$defs/item"}}, "theirs_y": {}}}
            },
            "$defs": {
                "vault_def": {"type": "object", "properties": {"a": {"type": "string"}}},
                "item": {"type": "integer", "$comment": "vault_x"}
            }
        });
        let shown = project_schema(&schema, &reads(&["/pub", "/deep/mine"]));
        let text = shown.to_string();
        for hidden in [
            "vault",
            "theirs_y",
            "TOP-SECRET",
            "maxProperties",
            "dependentRequired",
            "propertyNames",
        ] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
        assert_eq!(shown["required"], json!(["pub"]));
        assert_eq!(shown["properties"]["deep"]["type"], "object");
        // What the reader reads is described in full; references point at renamed copies.
        let pub_ref = shown["properties"]["pub"]["$ref"].as_str().unwrap();
        let def = shown.pointer(&pub_ref[1..]).unwrap();
        assert_eq!(def["properties"]["a"]["type"], "string");
        let item_ref = shown["properties"]["deep"]["properties"]["mine"]["items"]["$ref"]
            .as_str()
            .unwrap();
        assert_eq!(
            shown.pointer(&item_ref[1..]).unwrap(),
            &json!({"type": "integer"})
        );
        // The projection is a schema that compiles.
        crate::StateSchema::compile(shown.clone()).unwrap();
        assert_eq!(project_schema(&schema, &reads(&["", "/pub"])), schema);
    }

    #[test]
    fn array_reads_show_the_items_up_to_the_index() {
        let schema = json!({
            "type": "object",
            "properties": {"list": {"type": "array", "prefixItems": [{"const": "zero"}], "items": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {}}}}}
        });
        let shown = project_schema(&schema, &reads(&["/list/2/x"]));
        assert_eq!(
            shown["properties"]["list"],
            json!({"type": "array", "prefixItems": [true, true, {"type": "object", "properties": {"x": {"type": "integer"}}}]})
        );
    }

    #[test]
    fn undeclared_pointers_are_named_with_the_reason() {
        let schema = json!({
            "type": "object",
            "properties": {
                "plan": {"type": "object", "additionalProperties": false, "properties": {"goal": {}}},
                "api": {"type": "string"},
                "open": {"type": "object"},
                "list": {"type": "array", "items": {"properties": {"x": {}}}}
            },
            "anyOf": [{"properties": {"extra": {}}}, {}]
        });
        let check = |p: &str| undeclared(&schema, &Pointer::parse(p).unwrap());
        assert_eq!(check("/plan/goal"), None);
        assert_eq!(check("/extra"), None);
        assert_eq!(check("/open/anything/below"), None);
        assert_eq!(check("/list/3/x"), None);
        assert!(check("/plna").unwrap().contains("lists no member \"plna\""));
        assert!(check("/plan/gaol").unwrap().contains("forbids \"gaol\""));
        assert!(check("/api/x").unwrap().contains("is a string"));
        assert!(
            check("/list/0/y")
                .unwrap()
                .contains("lists no member \"y\"")
        );
        assert_eq!(
            undeclared(&json!({"type": "object"}), &Pointer::parse("/x").unwrap()),
            None
        );
    }
}
