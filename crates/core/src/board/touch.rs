//! Which locations a patch touches, judged from the patch alone.

use serde_json::{Map, Value};

use super::pointer::Pointer;
use crate::patch::StatePatch;

/// How a patch touches one location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TouchKind {
    /// The location's value is replaced, created or deleted (a merge patch's `null` or
    /// non-object member; a JSON Patch `add`, `remove`, `replace`, a `copy`'s `path`, both ends
    /// of a `move`).
    Write,
    /// A merge patch's object member: its own members are merged into the location when it is
    /// an object, and it is replaced by them when it is not.
    Merge,
    /// The patch's outcome depends on the value there without writing it (a `copy`'s `from`, a
    /// `test`'s `path`).
    Read,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Touch {
    pub pointer: Pointer,
    pub kind: TouchKind,
}

/// Every location `patch` touches and how, in patch order.
pub fn touches(patch: &StatePatch) -> Vec<Touch> {
    let mut out = Vec::new();
    match patch {
        StatePatch::Merge(members) => merge_touches(members, &Pointer::root(), &mut out),
        StatePatch::Json(ops) => {
            use json_patch::PatchOperation as Op;
            let at = |path: &dyn ToString| {
                // A path json-patch accepted is a pointer; should one not parse, the whole
                // document counts as touched (never fewer locations than the truth).
                Pointer::parse(&path.to_string()).unwrap_or_else(|_| Pointer::root())
            };
            for op in &ops.0 {
                let mut push = |pointer, kind| out.push(Touch { pointer, kind });
                match op {
                    Op::Add(o) => push(at(&o.path), TouchKind::Write),
                    Op::Remove(o) => push(at(&o.path), TouchKind::Write),
                    Op::Replace(o) => push(at(&o.path), TouchKind::Write),
                    Op::Move(o) => {
                        push(at(&o.from), TouchKind::Write);
                        push(at(&o.path), TouchKind::Write);
                    }
                    Op::Copy(o) => {
                        push(at(&o.from), TouchKind::Read);
                        push(at(&o.path), TouchKind::Write);
                    }
                    Op::Test(o) => push(at(&o.path), TouchKind::Read),
                }
            }
        }
    }
    out
}

fn merge_touches(members: &Map<String, Value>, at: &Pointer, out: &mut Vec<Touch>) {
    for (key, value) in members {
        let pointer = at.child(key.clone());
        match value {
            Value::Object(inner) => {
                out.push(Touch {
                    pointer: pointer.clone(),
                    kind: TouchKind::Merge,
                });
                merge_touches(inner, &pointer, out);
            }
            _ => out.push(Touch {
                pointer,
                kind: TouchKind::Write,
            }),
        }
    }
}

/// The locations `patch` writes (replaces, creates or deletes), sorted, each once. A merge
/// patch's `{"a": {"b": 1}}` writes `/a/b` only; `{"a": null}` and `{"a": 5}` write `/a`. In the
/// conflict rule ([`super::rebase`]) a location below an array stands for the whole array.
pub fn touched(patch: &StatePatch) -> Vec<Pointer> {
    let mut out: Vec<Pointer> = touches(patch)
        .into_iter()
        .filter(|t| t.kind == TouchKind::Write)
        .map(|t| t.pointer)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(value: Value) -> StatePatch {
        StatePatch::from_value(&value).unwrap()
    }

    fn strings(pointers: Vec<Pointer>) -> Vec<String> {
        pointers.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn merge_patches_write_their_leaves() {
        let p = patch(json!({"a": {"b": null, "c": {"d": [1]}}, "e": 5, "f": {}}));
        assert_eq!(strings(touched(&p)), ["/a/b", "/a/c/d", "/e"]);
        let merges: Vec<String> = touches(&p)
            .into_iter()
            .filter(|t| t.kind == TouchKind::Merge)
            .map(|t| t.pointer.to_string())
            .collect();
        assert_eq!(merges, ["/a", "/a/c", "/f"]);
    }

    #[test]
    fn json_patches_write_paths_and_read_sources() {
        let p = patch(json!([
            {"op": "test", "path": "/t", "value": 1},
            {"op": "add", "path": "/list/-", "value": 1},
            {"op": "copy", "from": "/src", "path": "/dst"},
            {"op": "move", "from": "/old", "path": "/new~1x"},
            {"op": "remove", "path": "/gone"},
            {"op": "replace", "path": "/r", "value": 2}
        ]));
        assert_eq!(
            strings(touched(&p)),
            ["/dst", "/gone", "/list/-", "/new~1x", "/old", "/r"]
        );
        let reads: Vec<String> = touches(&p)
            .into_iter()
            .filter(|t| t.kind == TouchKind::Read)
            .map(|t| t.pointer.to_string())
            .collect();
        assert_eq!(reads, ["/t", "/src"]);
    }
}
