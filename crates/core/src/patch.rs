//! State patches: RFC 7396 merge patches and RFC 6902 JSON Patches, applied atomically to a copy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::escape_token;

/// A validated-shape patch. Which RFC applies follows from the JSON type: object → merge patch,
/// array → JSON Patch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StatePatch {
    Json(json_patch::Patch),
    Merge(serde_json::Map<String, Value>),
}

/// Why a value is not a usable patch, or why it cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchProblem {
    /// Pointer into the patch document (for shape problems) or into the state (for apply problems).
    pub pointer: String,
    pub message: String,
}

/// Where a patch writes, and how: `replaces` means everything at and below the location may
/// change; otherwise the location is only merged into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    pub pointer: String,
    pub replaces: bool,
}

impl StatePatch {
    /// Checks the shape of a raw `state_patch` value.
    pub fn from_value(value: &Value) -> Result<Self, PatchProblem> {
        match value {
            Value::Object(map) => Ok(StatePatch::Merge(map.clone())),
            Value::Array(ops) => {
                for (index, op) in ops.iter().enumerate() {
                    if let Err(error) =
                        serde_json::from_value::<json_patch::PatchOperation>(op.clone())
                    {
                        return Err(PatchProblem {
                            pointer: format!("/{index}"),
                            message: format!(
                                "not a JSON Patch operation ({error}); each operation is {{\"op\": \"add|remove|replace|move|copy|test\", \"path\": \"/json/pointer\", ...}}"
                            ),
                        });
                    }
                }
                let patch =
                    serde_json::from_value(value.clone()).map_err(|error| PatchProblem {
                        pointer: String::new(),
                        message: format!("not a JSON Patch: {error}"),
                    })?;
                Ok(StatePatch::Json(patch))
            }
            other => Err(PatchProblem {
                pointer: String::new(),
                message: format!(
                    "state_patch must be an object (JSON Merge Patch) or an array (JSON Patch), found {}; use {{}} for no change",
                    type_name(other)
                ),
            }),
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            StatePatch::Merge(map) => Value::Object(map.clone()),
            StatePatch::Json(patch) => serde_json::to_value(patch).unwrap_or(Value::Null),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            StatePatch::Merge(map) => map.is_empty(),
            StatePatch::Json(patch) => patch.0.is_empty(),
        }
    }

    /// Applies the patch to a copy of `state`; `state` itself is never modified.
    pub fn apply(&self, state: &Value) -> Result<Value, PatchProblem> {
        let mut next = state.clone();
        match self {
            StatePatch::Merge(map) => json_patch::merge(&mut next, &Value::Object(map.clone())),
            // Applied without json-patch's undo log: the copy is dropped on failure anyway,
            // and its undo of some failed patches panics ("unable to undo applied patches").
            StatePatch::Json(patch) => {
                json_patch::patch_unsafe(&mut next, patch).map_err(|error| PatchProblem {
                    pointer: error.path.to_string(),
                    message: format!(
                        "JSON Patch operation {} failed: {}",
                        error.operation, error.kind
                    ),
                })?;
            }
        }
        Ok(next)
    }

    /// Applies the patch to `state` itself, for replaying a journal whose patches were all
    /// checked when they were written: no copy per step. On an error `state` may hold part of
    /// the patch; a replay then stops.
    pub fn apply_in_place(&self, state: &mut Value) -> Result<(), PatchProblem> {
        match self {
            StatePatch::Merge(map) => {
                json_patch::merge(state, &Value::Object(map.clone()));
                Ok(())
            }
            StatePatch::Json(patch) => {
                json_patch::patch_unsafe(state, patch).map_err(|error| PatchProblem {
                    pointer: error.path.to_string(),
                    message: format!(
                        "JSON Patch operation {} failed: {}",
                        error.operation, error.kind
                    ),
                })
            }
        }
    }

    /// Every location the patch writes, judged against the current `state`.
    pub fn touches(&self, state: &Value) -> Vec<Touch> {
        let mut out = Vec::new();
        match self {
            StatePatch::Merge(map) => merge_touches(map, Some(state), String::new(), &mut out),
            StatePatch::Json(patch) => {
                for op in &patch.0 {
                    use json_patch::PatchOperation as Op;
                    match op {
                        Op::Add(o) => out.push(Touch {
                            pointer: o.path.to_string(),
                            replaces: true,
                        }),
                        Op::Remove(o) => out.push(Touch {
                            pointer: o.path.to_string(),
                            replaces: true,
                        }),
                        Op::Replace(o) => out.push(Touch {
                            pointer: o.path.to_string(),
                            replaces: true,
                        }),
                        Op::Copy(o) => out.push(Touch {
                            pointer: o.path.to_string(),
                            replaces: true,
                        }),
                        Op::Move(o) => {
                            out.push(Touch {
                                pointer: o.from.to_string(),
                                replaces: true,
                            });
                            out.push(Touch {
                                pointer: o.path.to_string(),
                                replaces: true,
                            });
                        }
                        Op::Test(_) => {}
                    }
                }
            }
        }
        out
    }
}

fn merge_touches(
    patch: &serde_json::Map<String, Value>,
    target: Option<&Value>,
    at: String,
    out: &mut Vec<Touch>,
) {
    for (key, value) in patch {
        let pointer = format!("{at}/{}", escape_token(key));
        let current = target.and_then(|t| t.get(key));
        match (value, current) {
            (Value::Object(inner), Some(Value::Object(_))) => {
                out.push(Touch {
                    pointer: pointer.clone(),
                    replaces: false,
                });
                merge_touches(inner, current, pointer, out);
            }
            (Value::Object(inner), _) => {
                // A merge into a non-object replaces it with the patch's object.
                out.push(Touch {
                    pointer: pointer.clone(),
                    replaces: true,
                });
                merge_touches(inner, None, pointer, out);
            }
            _ => out.push(Touch {
                pointer,
                replaces: true,
            }),
        }
    }
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null_and_leaves_input_untouched() {
        let state = json!({"inventory": {"shelf_1": "item_1", "shelf_2": "item_2"}});
        let patch =
            StatePatch::from_value(&json!({"inventory": {"shelf_1": null, "shelf_3": "item_3"}}))
                .unwrap();
        let next = patch.apply(&state).unwrap();
        assert_eq!(
            next,
            json!({"inventory": {"shelf_2": "item_2", "shelf_3": "item_3"}})
        );
        assert_eq!(state["inventory"]["shelf_1"], "item_1");
    }

    #[test]
    fn json_patch_is_atomic() {
        let state = json!({"list": [1, 2]});
        let patch = StatePatch::from_value(&json!([
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "remove", "path": "/missing"}
        ]))
        .unwrap();
        let err = patch.apply(&state).unwrap_err();
        assert_eq!(err.pointer, "/missing");
        assert!(err.message.contains("operation 1"));
        assert_eq!(state, json!({"list": [1, 2]}));
    }

    #[test]
    fn a_failing_patch_whose_undo_would_fail_is_an_error_not_a_panic() {
        let state = json!({"a": [{}, []]});
        let patch = StatePatch::from_value(&json!([
            {"op": "move", "from": "/a/0", "path": "/a"},
            {"op": "remove", "path": "/a"},
            {"op": "add", "path": "/a/a", "value": null}
        ]))
        .unwrap();
        let err = patch.apply(&state).unwrap_err();
        assert_eq!(err.pointer, "/a/a");
        assert_eq!(state, json!({"a": [{}, []]}));
    }

    #[test]
    fn shape_errors_name_the_operation() {
        let err = StatePatch::from_value(
            &json!([{"op": "add", "path": "/a", "value": 1}, {"op": "explode"}]),
        )
        .unwrap_err();
        assert_eq!(err.pointer, "/1");
        let err = StatePatch::from_value(&json!("set a to 1")).unwrap_err();
        assert!(err.message.contains("found a string"));
        assert!(StatePatch::from_value(&Value::Null).is_err());
    }

    #[test]
    fn touches_distinguish_merge_from_replace() {
        let state = json!({"a": {"b": 1}, "c": 2});
        let patch = StatePatch::from_value(&json!({"a": {"b": null}, "c": {"d": 1}})).unwrap();
        assert_eq!(
            patch.touches(&state),
            vec![
                Touch {
                    pointer: "/a".into(),
                    replaces: false
                },
                Touch {
                    pointer: "/a/b".into(),
                    replaces: true
                },
                Touch {
                    pointer: "/c".into(),
                    replaces: true
                },
                Touch {
                    pointer: "/c/d".into(),
                    replaces: true
                },
            ]
        );
    }
}
