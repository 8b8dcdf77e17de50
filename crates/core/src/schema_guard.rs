//! The schema guard: refuses state schemas whose validation would never end or take
//! exponential time, before any of them is used. Run by `StateSchema::compile`, so
//! `skillstate validate`, skill loading and stored definitions all go through it.
//!
//! It works on the graph of `schema_graph.rs`, where an edge applies a subschema either at the
//! same instance location (`$ref`, `$dynamicRef`, `allOf`, `anyOf`, `oneOf`, `not`, `if`,
//! `then`, `else`, `dependentSchemas`) or at a child of it (`properties`, `patternProperties`,
//! `additionalProperties`, `unevaluatedProperties`, `prefixItems`, `items`, `contains`,
//! `unevaluatedItems`, `propertyNames`). Three rules, each linear in the size of the schema
//! (one strongly-connected-components pass and one pass in topological order each):
//!
//! 1. **No cycle at one location.** A cycle of same-location edges (`a → b → a` through
//!    `$ref`s, `{"allOf": [{"$ref": "#"}]}`, …) applies itself forever to the same value; it is
//!    meaningless and refused, with the cycle spelled out. Recursion that descends into the value
//!    (trees, lists, nested maps) is fine.
//! 2. **Bounded fan-out at one location.** With rule 1 the same-location edges form a DAG; the
//!    number of subschema applications one subschema causes at its own location is the number
//!    of paths out of it, counted by dynamic programming (saturating). More than
//!    [`MAX_APPLICATIONS_PER_LOCATION`] is refused (`anyOf` of three `$ref`s, each again an
//!    `anyOf` of three, twenty levels deep, is 3^20).
//! 3. **Recursion never multiplies.** Multiplicity can also compound with the depth of the
//!    instance: if a recursive subschema is reached twice at one location and each copy descends
//!    back into it, a value nested `d` deep costs `2^d`. For every subschema `u` that lies on a
//!    recursion (a cycle of the whole graph), the recursive continuations of `u` (the
//!    descending edges reachable from `u` through same-location edges whose target leads back
//!    into a recursion) must apply to pairwise different children: two `properties` with the
//!    same name, a `patternProperties`/`additionalProperties`/`unevaluatedProperties` next to
//!    any other object edge (except `additionalProperties` beside its own schema's `properties`
//!    and `patternProperties`), overlapping array positions, two `propertyNames`, or the same
//!    edge reached along two paths all count as a collision. Then each recursion is walked by at
//!    most one thread per child, and ordinary trees (`left`/`right` properties), lists
//!    (`items`) and JSON-like values (an array branch and an object branch) stay legal, while
//!    `oneOf: [A, B]` where both `A` and `B` recurse through the same property name is refused
//!    (its validation is exponential in the depth). A continuation set larger than
//!    [`MAX_RECURSIVE_CONTINUATIONS`] is refused too, which keeps the check linear.

use std::collections::HashMap;

use crate::schema::SchemaDefect;
use crate::schema_graph::{EdgeKind, Label, SchemaGraph, strongly_connected};

/// Most subschema applications one subschema may cause at one instance location.
pub const MAX_APPLICATIONS_PER_LOCATION: u64 = 10_000;

/// Most recursive continuations one recursive subschema may have.
pub const MAX_RECURSIVE_CONTINUATIONS: usize = 256;

/// Every defect the guard finds in `graph` (empty when the schema is safe to use).
pub(crate) fn check(graph: &SchemaGraph<'_>) -> Vec<SchemaDefect> {
    let n = graph.nodes.len();
    let same: Vec<Vec<usize>> = graph
        .nodes
        .iter()
        .map(|node| {
            node.edges
                .iter()
                .filter(|e| e.kind == EdgeKind::Same)
                .map(|e| e.to)
                .collect()
        })
        .collect();

    // Rule 1: same-location cycles.
    let same_sccs = strongly_connected(&same);
    let mut defects = Vec::new();
    for component in &same_sccs {
        let cyclic = component.len() > 1 || same[component[0]].contains(&component[0]);
        if cyclic {
            defects.push(cycle_defect(graph, &same, component));
        }
    }
    if !defects.is_empty() {
        return defects;
    }

    // Rule 2: paths through same-location edges, in topological order (`strongly_connected`
    // emits a component after every component it reaches).
    let mut applications = vec![1u64; n];
    for component in &same_sccs {
        let v = component[0];
        let total = same[v]
            .iter()
            .fold(1u64, |sum, &w| sum.saturating_add(applications[w]));
        applications[v] = total;
        if total > MAX_APPLICATIONS_PER_LOCATION {
            defects.push(SchemaDefect {
                pointer: graph.nodes[v].pointer.clone(),
                message: format!(
                    "applying this subschema applies more than {MAX_APPLICATIONS_PER_LOCATION} subschemas to one value (through $ref, allOf, anyOf, oneOf, not, if/then/else, dependentSchemas fanning out again and again); validation would take exponential time. Refer to shared definitions fewer times or flatten the combinators"
                ),
            });
            return defects;
        }
    }

    // Rule 3: recursion never multiplies.
    let all: Vec<Vec<usize>> = graph
        .nodes
        .iter()
        .map(|node| node.edges.iter().map(|e| e.to).collect())
        .collect();
    let all_sccs = strongly_connected(&all);
    let mut recursive = vec![false; n];
    let mut leads_to_recursion = vec![false; n];
    for component in &all_sccs {
        let cyclic = component.len() > 1 || all[component[0]].contains(&component[0]);
        let reaches = cyclic
            || component
                .iter()
                .any(|&v| all[v].iter().any(|&w| leads_to_recursion[w]));
        for &v in component {
            recursive[v] = cyclic;
            leads_to_recursion[v] = reaches;
        }
    }
    // Continuations: (node, edge index) of recursive descending edges reachable through
    // same-location paths, with multiplicity; `None` once over the limit.
    let mut continuations: Vec<Option<Vec<(usize, usize)>>> = vec![Some(Vec::new()); n];
    for component in &same_sccs {
        let v = component[0];
        let mut found: Option<Vec<(usize, usize)>> = Some(Vec::new());
        for (i, edge) in graph.nodes[v].edges.iter().enumerate() {
            let next = match &edge.kind {
                EdgeKind::Descend(_) if leads_to_recursion[edge.to] => Some(vec![(v, i)]),
                EdgeKind::Descend(_) => continue,
                EdgeKind::Same => continuations[edge.to].clone(),
            };
            found = match (found, next) {
                (Some(mut list), Some(more))
                    if list.len() + more.len() <= MAX_RECURSIVE_CONTINUATIONS =>
                {
                    list.extend(more);
                    Some(list)
                }
                _ => None,
            };
        }
        if recursive[v] {
            match &found {
                None => defects.push(SchemaDefect {
                    pointer: graph.nodes[v].pointer.clone(),
                    message: format!(
                        "this recursive subschema continues into more than {MAX_RECURSIVE_CONTINUATIONS} recursive subschemas; simplify the recursion"
                    ),
                }),
                Some(list) => {
                    if let Some((a, b)) = collision(graph, list) {
                        defects.push(SchemaDefect {
                            pointer: graph.nodes[v].pointer.clone(),
                            message: format!(
                                "this recursive subschema applies two recursive subschemas to the same child ({} and {}), so every level of nesting multiplies the work of validation (exponential in the depth of the value). Make the recursive branches apply to different property names or positions, or merge them into one",
                                graph.nodes[a.0].edges[a.1].keyword,
                                graph.nodes[b.0].edges[b.1].keyword
                            ),
                        });
                        return defects;
                    }
                }
            }
        }
        continuations[v] = found;
    }
    defects
}

/// Two continuations that may apply to the same child, if any.
fn collision(
    graph: &SchemaGraph<'_>,
    list: &[(usize, usize)],
) -> Option<((usize, usize), (usize, usize))> {
    type At = (usize, usize);
    let mut names: Vec<(&str, At)> = Vec::new();
    let mut seen_names: HashMap<&str, At> = HashMap::new();
    let mut patterns: Vec<(At, usize)> = Vec::new();
    let mut additionals: Vec<(At, usize)> = Vec::new();
    let mut unevaluated: Vec<At> = Vec::new();
    let mut object_edges: Vec<At> = Vec::new();
    let mut prefixes: HashMap<usize, At> = HashMap::new();
    let mut items_from: Vec<(At, usize)> = Vec::new();
    let mut any_items: Vec<At> = Vec::new();
    let mut array_edges: Vec<At> = Vec::new();
    let mut key_names: Vec<At> = Vec::new();
    for &e in list {
        let EdgeKind::Descend(label) = &graph.nodes[e.0].edges[e.1].kind else {
            continue;
        };
        match label {
            Label::Property(name) => {
                if let Some(&other) = seen_names.get(name.as_str()) {
                    return Some((other, e));
                }
                seen_names.insert(name, e);
                names.push((name, e));
                object_edges.push(e);
            }
            Label::Pattern { owner } => {
                patterns.push((e, *owner));
                object_edges.push(e);
            }
            Label::Additional { owner } => {
                additionals.push((e, *owner));
                object_edges.push(e);
            }
            Label::UnevaluatedProperties => {
                unevaluated.push(e);
                object_edges.push(e);
            }
            Label::Prefix(index) => {
                if let Some(&other) = prefixes.get(index) {
                    return Some((other, e));
                }
                prefixes.insert(*index, e);
                array_edges.push(e);
            }
            Label::ItemsFrom(from) => {
                items_from.push((e, *from));
                array_edges.push(e);
            }
            Label::Contains | Label::UnevaluatedItems => {
                any_items.push(e);
                array_edges.push(e);
            }
            Label::Name => key_names.push(e),
        }
    }
    let pair = |edges: &[At]| (edges.len() > 1).then(|| (edges[0], edges[1]));
    if !unevaluated.is_empty()
        && let Some(found) = pair(&object_edges)
    {
        return Some(found);
    }
    if !any_items.is_empty()
        && let Some(found) = pair(&array_edges)
    {
        return Some(found);
    }
    if let Some(found) = pair(&key_names) {
        return Some(found);
    }
    if items_from.len() > 1 {
        return Some((items_from[0].0, items_from[1].0));
    }
    if let Some(&(items, from)) = items_from.first() {
        let mut overlapping: Vec<(&usize, &At)> = prefixes
            .iter()
            .filter(|(index, _)| **index >= from)
            .collect();
        overlapping.sort();
        if let Some(&(_, other)) = overlapping.first() {
            return Some((*other, items));
        }
    }
    // Wildcards over object keys: patterns may match anything (they are not decided here);
    // `additionalProperties` skips its own schema's properties and patterns.
    if patterns.len() > 1 {
        return Some((patterns[0].0, patterns[1].0));
    }
    if additionals.len() > 1 {
        return Some((additionals[0].0, additionals[1].0));
    }
    if let (Some(&(p, p_owner)), Some(&(a, a_owner))) = (patterns.first(), additionals.first())
        && p_owner != a_owner
    {
        return Some((p, a));
    }
    if let (Some(&(p, _)), Some(&(_, other))) = (patterns.first(), names.first()) {
        return Some((other, p));
    }
    if let Some(&(a, owner)) = additionals.first() {
        let own = graph.nodes[owner].schema.get("properties");
        for &(name, other) in &names {
            if own.and_then(|p| p.get(name)).is_none() {
                return Some((other, a));
            }
        }
    }
    None
}

/// A defect naming one cycle inside `component`.
fn cycle_defect(graph: &SchemaGraph<'_>, same: &[Vec<usize>], component: &[usize]) -> SchemaDefect {
    let start = component[0];
    let inside: std::collections::HashSet<usize> = component.iter().copied().collect();
    // Breadth-first search from `start` back to itself inside the component.
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut last = None;
    'search: while let Some(v) = queue.pop_front() {
        for &w in &same[v] {
            if w == start {
                last = Some(v);
                break 'search;
            }
            if inside.contains(&w) && !parent.contains_key(&w) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start];
    let mut at = last.unwrap_or(start);
    while at != start {
        path.push(at);
        at = parent.get(&at).copied().unwrap_or(start);
    }
    path.push(start);
    let len = path.len();
    path[1..len - 1].reverse();
    let shown: Vec<String> = path
        .iter()
        .map(|&v| {
            let p = &graph.nodes[v].pointer;
            if p.is_empty() {
                "#".to_owned()
            } else {
                format!("#{p}")
            }
        })
        .collect();
    SchemaDefect {
        pointer: graph.nodes[start].pointer.clone(),
        message: format!(
            "these subschemas apply each other to the same value in a cycle ({}), so validating any value would never end; a recursive schema must descend into the value (through properties, items, ...) before it refers back",
            shown.join(" → ")
        ),
    }
}
