//! Projection: the part of a board a skill reads, which is what its prompt shows.

use serde_json::{Map, Value};

use super::pointer::{Pointer, array_index};
use super::scope::BoardScope;

/// The union of the subtrees at `scope.reads` in `state`, in the document's shape: every object
/// on the way to a read keeps only the members that lead to a read, and every array on the way
/// keeps its indices — elements before the last one read that are not read themselves show as
/// `null`, and nothing follows the last one read. A read whose location is missing is simply
/// absent. The result is always an object (`{}` when nothing is read), and depends only on the
/// state and the set of reads (not on their order).
pub fn project(state: &Value, scope: &BoardScope) -> Value {
    project_pointers(state, &scope.reads)
}

/// [`project`] over any list of pointers (a conflict's fresh values use it too).
pub fn project_pointers(state: &Value, pointers: &[Pointer]) -> Value {
    let mut reads: Vec<&Pointer> = pointers.iter().collect();
    reads.sort();
    reads.dedup();
    // Sorted, an ancestor comes before its descendants: keep only the outermost reads.
    let mut outermost: Vec<&Pointer> = Vec::new();
    for read in reads {
        if !outermost.iter().any(|kept| read.is_within(kept)) {
            outermost.push(read);
        }
    }
    let mut out = Value::Object(Map::new());
    for read in outermost {
        if read.is_root() {
            return match state {
                Value::Object(_) => state.clone(),
                _ => Value::Object(Map::new()),
            };
        }
        if let Some(value) = read.get(state) {
            insert(&mut out, state, read.tokens(), value);
        }
    }
    out
}

/// Puts `value` at `tokens` in `out`, building the containers on the way in the shape they have
/// in `source`.
fn insert(out: &mut Value, source: &Value, tokens: &[String], value: &Value) {
    let Some((token, rest)) = tokens.split_first() else {
        *out = value.clone();
        return;
    };
    match source {
        Value::Object(members) => {
            let Some(next_source) = members.get(token) else {
                return;
            };
            if !out.is_object() {
                *out = Value::Object(Map::new());
            }
            if let Value::Object(map) = out {
                let slot = map.entry(token.clone()).or_insert(Value::Null);
                insert(slot, next_source, rest, value);
            }
        }
        Value::Array(items) => {
            let Some((index, next_source)) =
                array_index(token).and_then(|i| items.get(i).map(|item| (i, item)))
            else {
                return;
            };
            if !out.is_array() {
                *out = Value::Array(Vec::new());
            }
            if let Value::Array(slots) = out {
                if slots.len() <= index {
                    slots.resize(index + 1, Value::Null);
                }
                insert(&mut slots[index], next_source, rest, value);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(reads: &[&str]) -> BoardScope {
        BoardScope {
            reads: reads.iter().map(|r| Pointer::parse(r).unwrap()).collect(),
            writes: Vec::new(),
        }
    }

    #[test]
    fn keeps_the_shape_and_only_what_is_read() {
        let state = json!({
            "plan": {"goal": "ship", "owner": "ana"},
            "api": {"routes": ["/a", "/b"]},
            "frontend": {"done": false},
            "list": [{"x": 1, "y": 2}, 7, {"x": 3, "y": 4}, 9]
        });
        let got = project(
            &state,
            &scope(&["/plan/goal", "/api", "/list/2/x", "/missing/x"]),
        );
        assert_eq!(
            got,
            json!({
                "plan": {"goal": "ship"},
                "api": {"routes": ["/a", "/b"]},
                "list": [null, null, {"x": 3}]
            })
        );
    }

    #[test]
    fn nested_and_repeated_reads_are_one_union_whatever_the_order() {
        let state = json!({"a": {"b": 1, "c": {"d": 2}}, "e": 3});
        let one = project(&state, &scope(&["/a/c/d", "/a", "/a/b"]));
        let two = project(&state, &scope(&["/a", "/a/c/d"]));
        assert_eq!(one, json!({"a": {"b": 1, "c": {"d": 2}}}));
        assert_eq!(one, two);
        assert_eq!(project(&state, &scope(&["", "/e"])), state);
        assert_eq!(project(&state, &scope(&[])), json!({}));
        assert_eq!(project(&state, &scope(&["/e/f", "/a/b/c"])), json!({}));
    }
}
