//! The state schema as a graph of subschemas, for the static analyses that are not validation:
//! the schema guard (`schema_guard.rs`), the read-only properties named in prompts and the
//! derived output schema.
//!
//! Every subschema position of JSON Schema 2020-12 is a node, visited once (by its address in the
//! document, so a subschema reached both by nesting and by `$ref` is one node). Edges say how a
//! subschema is applied: at the same instance location (`$ref`, `$dynamicRef`, `allOf`, `anyOf`,
//! `oneOf`, `not`, `if`, `then`, `else`, `dependentSchemas`) or at a child of it (`properties`,
//! `patternProperties`, `additionalProperties`, `unevaluatedProperties`, `prefixItems`, `items`,
//! `contains`, `unevaluatedItems`, `propertyNames`). `$ref`s are resolved by the jsonschema
//! crate's own `referencing` registry, so `$id`, `$anchor`, percent-encoding and `~0`/`~1`
//! mean exactly what they mean to the validator. Building the graph is linear in the size of the
//! document.

use std::collections::HashMap;
use std::sync::Arc;

use jsonschema::{Draft, Registry, Uri};
use serde_json::Value;

use crate::json::escape_token;
use crate::schema::SchemaDefect;

/// Which child of an instance a descending edge applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Label {
    /// `properties/NAME`.
    Property(String),
    /// `patternProperties/PATTERN` of node `owner`.
    Pattern {
        owner: usize,
    },
    /// `additionalProperties` of node `owner`: keys none of its properties or patterns match.
    Additional {
        owner: usize,
    },
    UnevaluatedProperties,
    /// `prefixItems/INDEX`.
    Prefix(usize),
    /// `items`, which applies from index `n` on (`n` = length of the sibling `prefixItems`).
    ItemsFrom(usize),
    Contains,
    UnevaluatedItems,
    /// `propertyNames`: applies to each key as a string.
    Name,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EdgeKind {
    /// Applied to the same instance location.
    Same,
    /// Applied to a child (or the keys) of the instance.
    Descend(Label),
}

#[derive(Debug, Clone)]
pub(crate) struct Edge {
    pub to: usize,
    pub kind: EdgeKind,
    /// JSON pointer of the keyword (into the schema) that makes this edge, for messages.
    pub keyword: String,
}

pub(crate) struct Node<'a> {
    /// JSON pointer of the subschema in the document.
    pub pointer: String,
    pub schema: &'a Value,
    pub edges: Vec<Edge>,
}

pub(crate) struct SchemaGraph<'a> {
    /// Node 0 is the root.
    pub nodes: Vec<Node<'a>>,
}

const SAME_SINGLE: [&str; 4] = ["not", "if", "then", "else"];
const SAME_ARRAYS: [&str; 3] = ["allOf", "anyOf", "oneOf"];

impl<'a> SchemaGraph<'a> {
    /// Builds the graph of `document`; every `$ref` that cannot be followed inside the document
    /// is a defect.
    pub(crate) fn build(document: &'a Value) -> Result<Self, Vec<SchemaDefect>> {
        let pointers = address_pointers(document);
        let registry = Registry::new()
            .draft(Draft::Draft202012)
            .retrieve_known_draft_meta_schemas(false)
            .add(ROOT_URI, document)
            .and_then(|builder| builder.prepare())
            .map_err(|error| indexing_defects(&pointers, &error.to_string()))?;
        let root_base = Arc::new(Uri::parse(ROOT_URI.to_owned()).map_err(|_| {
            vec![SchemaDefect {
                pointer: String::new(),
                message: "internal error: the root URI does not parse".into(),
            }]
        })?);

        let mut builder = Builder {
            nodes: Vec::new(),
            bases: Vec::new(),
            ids: HashMap::new(),
            queue: Vec::new(),
            defects: Vec::new(),
            dynamic_refs: Vec::new(),
        };
        builder.intern(document, String::new(), root_base);
        while let Some(id) = builder.queue.pop() {
            builder.expand(id, &registry, &pointers);
        }
        builder.link_dynamic_anchors();
        if builder.defects.is_empty() {
            Ok(SchemaGraph {
                nodes: builder.nodes,
            })
        } else {
            Err(builder.defects)
        }
    }
}

const ROOT_URI: &str = "json-schema:///";

struct Builder<'a> {
    nodes: Vec<Node<'a>>,
    bases: Vec<Arc<Uri<String>>>,
    ids: HashMap<*const Value, usize>,
    queue: Vec<usize>,
    defects: Vec<SchemaDefect>,
    /// `(node, keyword pointer, anchor name)` of every `$dynamicRef` with a plain-name fragment.
    dynamic_refs: Vec<(usize, String, String)>,
}

impl<'a> Builder<'a> {
    fn intern(&mut self, schema: &'a Value, pointer: String, base: Arc<Uri<String>>) -> usize {
        if let Some(&id) = self.ids.get(&(schema as *const Value)) {
            return id;
        }
        let id = self.nodes.len();
        self.ids.insert(schema as *const Value, id);
        self.nodes.push(Node {
            pointer,
            schema,
            edges: Vec::new(),
        });
        self.bases.push(base);
        self.queue.push(id);
        id
    }

    fn expand(
        &mut self,
        id: usize,
        registry: &Registry<'_>,
        pointers: &HashMap<*const Value, (String, &'a Value)>,
    ) {
        let schema = self.nodes[id].schema;
        let Value::Object(map) = schema else {
            return;
        };
        let at = self.nodes[id].pointer.clone();
        let mut base = Arc::clone(&self.bases[id]);
        if let Some(Value::String(own_id)) = map.get("$id") {
            match registry.resolve_uri(&base.borrow(), own_id) {
                Ok(resolved) => base = resolved,
                Err(error) => self.defects.push(SchemaDefect {
                    pointer: format!("{at}/$id"),
                    message: format!("\"$id\" is not a usable URI: {error}"),
                }),
            }
        }
        let mut edges = Vec::new();
        let child = |this: &mut Self,
                     edges: &mut Vec<Edge>,
                     value: &'a Value,
                     keyword: String,
                     kind: EdgeKind| {
            if value.is_object() || value.is_boolean() {
                let to = this.intern(value, keyword.clone(), Arc::clone(&base));
                edges.push(Edge { to, kind, keyword });
            }
        };
        for (key, value) in map {
            let keyword = format!("{at}/{}", escape_token(key));
            match (key.as_str(), value) {
                (k, _) if SAME_SINGLE.contains(&k) => {
                    child(self, &mut edges, value, keyword, EdgeKind::Same)
                }
                (k, Value::Array(items)) if SAME_ARRAYS.contains(&k) => {
                    for (i, item) in items.iter().enumerate() {
                        child(
                            self,
                            &mut edges,
                            item,
                            format!("{keyword}/{i}"),
                            EdgeKind::Same,
                        );
                    }
                }
                ("dependentSchemas", Value::Object(subs)) => {
                    for (name, sub) in subs {
                        let at = format!("{keyword}/{}", escape_token(name));
                        child(self, &mut edges, sub, at, EdgeKind::Same);
                    }
                }
                ("properties", Value::Object(subs)) => {
                    for (name, sub) in subs {
                        let at = format!("{keyword}/{}", escape_token(name));
                        let label = Label::Property(name.clone());
                        child(self, &mut edges, sub, at, EdgeKind::Descend(label));
                    }
                }
                ("patternProperties", Value::Object(subs)) => {
                    for (name, sub) in subs {
                        let at = format!("{keyword}/{}", escape_token(name));
                        let label = Label::Pattern { owner: id };
                        child(self, &mut edges, sub, at, EdgeKind::Descend(label));
                    }
                }
                ("additionalProperties", _) => {
                    let label = Label::Additional { owner: id };
                    child(self, &mut edges, value, keyword, EdgeKind::Descend(label));
                }
                ("unevaluatedProperties", _) => {
                    let label = Label::UnevaluatedProperties;
                    child(self, &mut edges, value, keyword, EdgeKind::Descend(label));
                }
                ("prefixItems", Value::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        let label = Label::Prefix(i);
                        child(
                            self,
                            &mut edges,
                            item,
                            format!("{keyword}/{i}"),
                            EdgeKind::Descend(label),
                        );
                    }
                }
                ("items", _) => {
                    let from = map
                        .get("prefixItems")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    let label = Label::ItemsFrom(from);
                    child(self, &mut edges, value, keyword, EdgeKind::Descend(label));
                }
                ("contains", _) => child(
                    self,
                    &mut edges,
                    value,
                    keyword,
                    EdgeKind::Descend(Label::Contains),
                ),
                ("unevaluatedItems", _) => {
                    let label = Label::UnevaluatedItems;
                    child(self, &mut edges, value, keyword, EdgeKind::Descend(label));
                }
                ("propertyNames", _) => child(
                    self,
                    &mut edges,
                    value,
                    keyword,
                    EdgeKind::Descend(Label::Name),
                ),
                ("$defs" | "definitions", Value::Object(subs)) => {
                    // Not applied by themselves; nodes so that `$ref`s into them share identity
                    // and unused definitions are checked too.
                    for (name, sub) in subs {
                        if sub.is_object() || sub.is_boolean() {
                            let at = format!("{keyword}/{}", escape_token(name));
                            self.intern(sub, at, Arc::clone(&base));
                        }
                    }
                }
                ("$ref" | "$dynamicRef", Value::String(reference)) => {
                    if key == "$dynamicRef"
                        && let Some(name) = reference.strip_prefix('#')
                        && !name.starts_with('/')
                        && !name.is_empty()
                    {
                        self.dynamic_refs
                            .push((id, keyword.clone(), name.to_owned()));
                    }
                    match registry.resolver((*base).clone()).lookup(reference) {
                        Ok(resolved) => {
                            let target = resolved.contents();
                            match pointers.get(&(target as *const Value)) {
                                Some((pointer, target)) => {
                                    let target_base = resolved.resolver().base_uri();
                                    let to = self.intern(target, pointer.clone(), target_base);
                                    edges.push(Edge {
                                        to,
                                        kind: EdgeKind::Same,
                                        keyword,
                                    });
                                }
                                None => self.defects.push(SchemaDefect {
                                    pointer: keyword,
                                    message: format!(
                                        "\"{reference}\" refers outside this schema document; a state schema must be self-contained: copy what it needs under \"$defs\" and refer to \"#/$defs/NAME\""
                                    ),
                                }),
                            }
                        }
                        Err(error) => self.defects.push(SchemaDefect {
                            pointer: keyword,
                            message: format!(
                                "\"{reference}\" cannot be resolved inside this schema document ({error}); refer to a subschema of this document, e.g. \"#/$defs/NAME\""
                            ),
                        }),
                    }
                }
                _ => {}
            }
        }
        self.nodes[id].edges = edges;
    }

    /// A `$dynamicRef` may land on any `$dynamicAnchor` of the same name in the dynamic scope;
    /// the analyses assume every one of them.
    fn link_dynamic_anchors(&mut self) {
        let refs = std::mem::take(&mut self.dynamic_refs);
        if refs.is_empty() {
            return;
        }
        let mut anchors: HashMap<&str, Vec<usize>> = HashMap::new();
        for (n, node) in self.nodes.iter().enumerate() {
            if let Some(name) = node.schema.get("$dynamicAnchor").and_then(Value::as_str) {
                anchors.entry(name).or_default().push(n);
            }
        }
        let mut extra = Vec::new();
        for (from, keyword, name) in refs {
            for &to in anchors
                .get(name.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                extra.push((
                    from,
                    Edge {
                        to,
                        kind: EdgeKind::Same,
                        keyword: keyword.clone(),
                    },
                ));
            }
        }
        for (from, edge) in extra {
            let known = self.nodes[from]
                .edges
                .iter()
                .any(|e| e.to == edge.to && e.keyword == edge.keyword);
            if !known {
                self.nodes[from].edges.push(edge);
            }
        }
    }
}

/// Why the registry could not index the document: most likely a `$ref` to another document,
/// which is named where it is (in document order); otherwise the registry's own words.
fn indexing_defects(
    pointers: &HashMap<*const Value, (String, &Value)>,
    error: &str,
) -> Vec<SchemaDefect> {
    let mut defects: Vec<SchemaDefect> = pointers
        .values()
        .filter_map(|(pointer, value)| {
            let reference = value.get("$ref").or_else(|| value.get("$dynamicRef"))?.as_str()?;
            (!reference.starts_with('#')).then(|| SchemaDefect {
                pointer: format!("{pointer}/$ref"),
                message: format!(
                    "\"{reference}\" refers outside this schema document ({error}); a state schema must be self-contained: copy what it needs under \"$defs\" and refer to \"#/$defs/NAME\""
                ),
            })
        })
        .collect();
    defects.sort_by(|a, b| a.pointer.cmp(&b.pointer));
    if defects.is_empty() {
        defects.push(SchemaDefect {
            pointer: String::new(),
            message: format!("the schema's references cannot be indexed: {error}"),
        });
    }
    defects
}

/// The JSON pointer of every value in `document`, by address.
fn address_pointers(document: &Value) -> HashMap<*const Value, (String, &Value)> {
    let mut out = HashMap::new();
    let mut stack = vec![(document, String::new())];
    while let Some((value, pointer)) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    stack.push((child, format!("{pointer}/{}", escape_token(key))));
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    stack.push((child, format!("{pointer}/{i}")));
                }
            }
            _ => {}
        }
        out.insert(value as *const Value, (pointer, value));
    }
    out
}

impl SchemaGraph<'_> {
    /// Same-location successors of every node.
    pub(crate) fn same_edges(&self) -> Vec<Vec<usize>> {
        self.nodes
            .iter()
            .map(|node| {
                node.edges
                    .iter()
                    .filter(|e| e.kind == EdgeKind::Same)
                    .map(|e| e.to)
                    .collect()
            })
            .collect()
    }

    /// For every node: whether it, or a subschema applied at the same location whenever it
    /// validates (`$ref`, `allOf`, `anyOf`, `oneOf`, `if`/`then`/`else`, `dependentSchemas`;
    /// not `not`), says `"readOnly": true`. Conservative across branches on purpose.
    pub(crate) fn read_only_closure(&self) -> Vec<bool> {
        let mut marked: Vec<bool> = self.nodes.iter().map(|n| is_read_only(n.schema)).collect();
        let edges: Vec<Vec<usize>> = self
            .nodes
            .iter()
            .map(|node| {
                node.edges
                    .iter()
                    .filter(|e| e.kind == EdgeKind::Same && !e.keyword.ends_with("/not"))
                    .map(|e| e.to)
                    .collect()
            })
            .collect();
        // Components come successors first; inside a (refused, but possible here) cycle the
        // mark is shared.
        for component in strongly_connected(&edges) {
            let any = component
                .iter()
                .any(|&v| marked[v] || edges[v].iter().any(|&w| marked[w]));
            for v in component {
                marked[v] = any;
            }
        }
        marked
    }
}

/// `true` when `schema` itself says `"readOnly": true`.
/// A `readOnly` subschema reached from the root through `properties` alone: its JSON pointer
/// and the property names on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PropertyPath {
    pub pointer: String,
    pub names: Vec<String>,
}

impl SchemaGraph<'_> {
    /// The locations of every `readOnly` subschema, when each one is reached from the root by
    /// exactly one chain of `properties` and by nothing else (no `$ref`, combinator,
    /// conditional, `items`, pattern or additional properties on the way or into it); `None`
    /// otherwise. For such a schema, evaluating a VALID instance annotates read-only exactly
    /// the ones of these locations the instance has (each step of the chain applies to the
    /// property whenever the object holds it, and succeeds since the whole instance does), so
    /// the annotations need no evaluation. A subschema nothing applies (an unreferenced
    /// `$defs` entry) annotates nothing and is left out.
    pub(crate) fn property_chain_read_only(&self) -> Option<Vec<PropertyPath>> {
        let mut incoming: Vec<Vec<(usize, &EdgeKind)>> = vec![Vec::new(); self.nodes.len()];
        for (from, node) in self.nodes.iter().enumerate() {
            for edge in &node.edges {
                incoming.get_mut(edge.to)?.push((from, &edge.kind));
            }
        }
        let mut found = Vec::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if !is_read_only(node.schema) || (id != 0 && incoming[id].is_empty()) {
                continue;
            }
            // Up the only edge into each node, to the root; a node has at most one parent on
            // the way, so `nodes.len()` steps reach the root or prove a loop.
            let mut names = Vec::new();
            let mut at = id;
            for _ in 0..=self.nodes.len() {
                if at == 0 {
                    break;
                }
                match incoming[at].as_slice() {
                    [(parent, EdgeKind::Descend(Label::Property(name)))] => {
                        names.push(name.clone());
                        at = *parent;
                    }
                    _ => return None,
                }
            }
            if at != 0 || !incoming[0].is_empty() {
                return None;
            }
            names.reverse();
            let pointer = names
                .iter()
                .map(|n| format!("/{}", escape_token(n)))
                .collect();
            found.push(PropertyPath { pointer, names });
        }
        Some(found)
    }
}

pub(crate) fn is_read_only(schema: &Value) -> bool {
    schema.get("readOnly").and_then(Value::as_bool) == Some(true)
}

/// Tarjan's strongly connected components, iteratively (no recursion, whatever the depth).
/// Components come out in reverse topological order: a component is emitted after every
/// component it can reach.
pub(crate) fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0;
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(start, 0)];
        index[start] = next_index;
        low[start] = next_index;
        next_index += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(top) = work.last_mut() {
            let v = top.0;
            if let Some(&w) = edges[v].get(top.1) {
                top.1 += 1;
                if index[w] == usize::MAX {
                    index[w] = next_index;
                    low[w] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                component.reverse();
                components.push(component);
            }
        }
    }
    components
}
