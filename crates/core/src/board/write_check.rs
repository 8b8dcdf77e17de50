//! The write check: a patch may change only locations within its skill's writes, and may copy
//! or test only what its skill reads.

use serde_json::{Map, Value};

use super::pointer::Pointer;
use super::scope::BoardScope;
use super::touch::{TouchKind, touches};
use crate::json::pointer_for_humans;
use crate::patch::StatePatch;
use crate::validate::{Document, Rejection, RejectionKind};

/// Checks `patch`, about to be applied to `state`, against `scope`. Every offending location is
/// reported once, with its pointer into the state:
/// - a merge patch member outside the writes is refused where it stands (`{"a": null}` at `/a`,
///   `{"a": 5}` at `/a`), unless it is an object on the way to a write (`{"plan": {"frontend":
///   …}}` with writes `["/plan/frontend"]`): then only its members are judged. Such an object may
///   create a missing ancestor, but not replace one that holds a non-object (that would delete
///   a value outside the writes);
/// - a JSON Patch `add`, `remove`, `replace` or a `copy`'s `path` outside the writes is refused,
///   and so are both ends of a `move`. `add`, `remove`, `copy` and `move` at an array index shift
///   the elements after it, so they count as writing the whole array;
/// - a `copy`'s `from` and a `test`'s `path` must lie within the reads
///   (`RejectionKind::OutsideReadScope`): a skill copies only what its prompt shows.
///
/// Operations after one that fails to apply are not judged (the pipeline reports the failure).
pub fn check_writes(
    patch: &StatePatch,
    state: &Value,
    scope: &BoardScope,
) -> Result<(), Vec<Rejection>> {
    let mut out = Vec::new();
    match patch {
        StatePatch::Merge(members) => {
            check_merge(members, &Pointer::root(), Some(state), scope, &mut out)
        }
        StatePatch::Json(ops) => check_json(ops, state, scope, &mut out),
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|r: &Rejection| seen.insert((r.kind.as_str(), r.pointer.clone())));
    if out.is_empty() { Ok(()) } else { Err(out) }
}

fn check_merge(
    members: &Map<String, Value>,
    at: &Pointer,
    current: Option<&Value>,
    scope: &BoardScope,
    out: &mut Vec<Rejection>,
) {
    for (key, value) in members {
        let pointer = at.child(key.clone());
        if scope.can_write(&pointer) {
            continue;
        }
        let leads_to_write = scope.writes.iter().any(|w| w.is_within(&pointer));
        let existing = current.and_then(Value::as_object).and_then(|m| m.get(key));
        match (value, existing) {
            (Value::Object(inner), None | Some(Value::Object(_))) if leads_to_write => {
                check_merge(inner, &pointer, existing, scope, out);
            }
            // What it holds is named only when the skill reads it.
            (Value::Object(_), Some(other)) if leads_to_write => out.push(outside_writes(
                &pointer,
                scope,
                &if !scope.can_read(&pointer) {
                    "; it holds something this skill does not read, which merging an object into would replace".to_owned()
                } else if other.is_array() {
                    "; it holds an array, which merging an object into would replace: change the elements this skill owns with a JSON Patch `replace` instead".to_owned()
                } else {
                    format!(
                        "; it holds {}, which merging an object into would replace, and it is not this skill's to replace",
                        crate::patch::type_name(other)
                    )
                },
            )),
            _ => out.push(outside_writes(&pointer, scope, "")),
        }
    }
}

fn check_json(
    ops: &json_patch::Patch,
    state: &Value,
    scope: &BoardScope,
    out: &mut Vec<Rejection>,
) {
    let mut running = state.clone();
    for op in &ops.0 {
        let shifts = !matches!(op, json_patch::PatchOperation::Replace(_));
        let single = StatePatch::Json(json_patch::Patch(vec![op.clone()]));
        for touch in touches(&single) {
            match touch.kind {
                TouchKind::Read => {
                    if !scope.can_read(&touch.pointer) {
                        out.push(outside_reads(&touch.pointer, scope));
                    }
                }
                TouchKind::Write | TouchKind::Merge => {
                    let location = match touch.pointer.parent() {
                        Some(parent)
                            if shifts && parent.get(&running).is_some_and(Value::is_array) =>
                        {
                            parent
                        }
                        _ => touch.pointer,
                    };
                    if !scope.can_write(&location) {
                        out.push(outside_writes(&location, scope, ""));
                    }
                }
            }
        }
        match single.apply(&running) {
            Ok(next) => running = next,
            Err(_) => return,
        }
    }
}

fn list(pointers: &[Pointer]) -> String {
    let shown: Vec<String> = pointers.iter().map(|p| format!("\"{p}\"")).collect();
    format!("[{}]", shown.join(", "))
}

fn outside_writes(location: &Pointer, scope: &BoardScope, detail: &str) -> Rejection {
    Rejection {
        kind: RejectionKind::OutsideWriteScope,
        document: Document::State,
        pointer: location.to_string(),
        message: format!(
            "{} is outside what this skill may write on the board (writes = {}){detail}; leave it out of state_patch, another writer owns it",
            pointer_for_humans(&location.to_string(), "board"),
            list(&scope.writes)
        ),
    }
}

fn outside_reads(location: &Pointer, scope: &BoardScope) -> Rejection {
    Rejection {
        kind: RejectionKind::OutsideReadScope,
        document: Document::State,
        pointer: location.to_string(),
        message: format!(
            "{} is outside what this skill reads on the board (reads = {}); copy from and test only locations the prompt shows",
            pointer_for_humans(&location.to_string(), "board"),
            list(&scope.reads)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(reads: &[&str], writes: &[&str]) -> BoardScope {
        let parse = |list: &[&str]| list.iter().map(|p| Pointer::parse(p).unwrap()).collect();
        BoardScope {
            reads: parse(reads),
            writes: parse(writes),
        }
    }

    fn refused(patch: Value, state: &Value, scope: &BoardScope) -> Vec<(RejectionKind, String)> {
        let patch = StatePatch::from_value(&patch).unwrap();
        match check_writes(&patch, state, scope) {
            Ok(()) => Vec::new(),
            Err(rejections) => rejections
                .into_iter()
                .map(|r| (r.kind, r.pointer))
                .collect(),
        }
    }

    #[test]
    fn merge_patches_are_judged_member_by_member() {
        let state = json!({"plan": {"frontend": {"done": false}, "backend": 1}, "api": 2, "n": 3});
        let s = scope(&["/plan", "/api"], &["/plan/frontend", "/api"]);
        assert_eq!(
            refused(
                json!({"plan": {"frontend": {"done": true}}, "api": null}),
                &state,
                &s
            ),
            []
        );
        let write = RejectionKind::OutsideWriteScope;
        assert_eq!(
            refused(
                json!({"plan": {"backend": null, "frontend": 1}, "n": {"x": 1}}),
                &state,
                &s
            ),
            [(write, "/plan/backend".into()), (write, "/n".into())]
        );
        // A non-object on the way to a write replaces the whole location.
        assert_eq!(
            refused(json!({"plan": 5}), &state, &s),
            [(write, "/plan".into())]
        );
        // Missing ancestors may be created; non-object ones may not be merged into.
        let s = scope(&["/a"], &["/a/b/c"]);
        assert_eq!(refused(json!({"a": {"b": {"c": 1}}}), &json!({}), &s), []);
        let rejections = refused(
            json!({"a": {"b": {"c": 1}}}),
            &json!({"a": {"b": "text"}}),
            &s,
        );
        assert_eq!(rejections, [(write, "/a/b".into())]);
        let patch = StatePatch::from_value(&json!({"a": {"0": 1}})).unwrap();
        let s = scope(&["/a"], &["/a/0"]);
        let rejections = check_writes(&patch, &json!({"a": [5]}), &s).unwrap_err();
        assert!(
            rejections[0].message.contains("JSON Patch `replace`"),
            "{}",
            rejections[0]
        );
    }

    #[test]
    fn json_patches_check_paths_sources_and_array_shifts() {
        let state = json!({"mine": {"list": [1, 2]}, "theirs": {"x": 1}, "list": [1, 2, 3]});
        let s = scope(&["/mine", "/theirs", "/list/1"], &["/mine", "/list/1"]);
        assert_eq!(
            refused(
                json!([
                    {"op": "copy", "from": "/theirs/x", "path": "/mine/y"},
                    {"op": "test", "path": "/mine/y", "value": 1},
                    {"op": "replace", "path": "/list/1", "value": 9},
                    {"op": "add", "path": "/mine/list/0", "value": 0}
                ]),
                &state,
                &s
            ),
            []
        );
        let write = RejectionKind::OutsideWriteScope;
        let read = RejectionKind::OutsideReadScope;
        assert_eq!(
            refused(
                json!([
                    {"op": "remove", "path": "/list/1"},
                    {"op": "copy", "from": "/list/0", "path": "/mine/z"},
                    {"op": "move", "from": "/theirs/x", "path": "/mine/x"},
                    {"op": "add", "path": "/other", "value": 1}
                ]),
                &state,
                &s
            ),
            [
                (write, "/list".into()),
                (read, "/list/0".into()),
                (write, "/theirs/x".into()),
                (write, "/other".into())
            ]
        );
    }

    #[test]
    fn messages_say_what_to_do() {
        let patch = StatePatch::from_value(&json!({"api": 1})).unwrap();
        let rejections = check_writes(&patch, &json!({}), &scope(&["/api"], &[])).unwrap_err();
        assert_eq!(rejections[0].pointer, "/api");
        assert!(rejections[0].message.contains("writes = []"));
        assert!(
            rejections[0]
                .message
                .contains("leave it out of state_patch")
        );
    }
}
