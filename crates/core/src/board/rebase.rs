//! Rebasing a patch computed on an older board version onto the newest one (the rule is in the
//! module docs of [`super`]).

use std::collections::BTreeSet;

use serde_json::Value;

use super::pointer::Pointer;
use super::project::project_pointers;
use super::touch::{TouchKind, touches};
use crate::patch::StatePatch;

/// The patch may be applied to the newest version as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Rebased {
    pub patch: StatePatch,
}

/// The patch meets changes committed since its base version.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    /// Each conflicting location, sorted; none lies within another.
    pub pointers: Vec<Pointer>,
    /// The newest version projected onto `pointers` (the shape [`super::project`] gives): the
    /// fresh values to show the writer. A location missing here was deleted. The runtime shows
    /// it projected once more onto the writer's reads.
    pub fresh: Value,
}

/// Decides whether `patch`, computed on `base`, still applies to `newest` (see the module docs
/// of [`super`] for the rule).
pub fn rebase(patch: &StatePatch, base: &Value, newest: &Value) -> Result<Rebased, Conflict> {
    let mut conflicts = BTreeSet::new();
    let differs = |at: &Pointer| at.get(base) != at.get(newest);
    for touch in touches(patch) {
        // 1. A written or read location whose value changed.
        if touch.kind != TouchKind::Merge && differs(&touch.pointer) {
            conflicts.insert(touch.pointer.clone());
        }
        // 2. A location the patch merges into, or a proper ancestor of any touched location,
        //    that changed other than by staying (or becoming, from absent) an object.
        let merged = (touch.kind == TouchKind::Merge).then(|| touch.pointer.clone());
        for container in touch.pointer.ancestors().chain(merged) {
            let still_object = container.get(newest).is_some_and(Value::is_object)
                && container.get(base).is_none_or(Value::is_object);
            if !still_object && differs(&container) {
                conflicts.insert(container);
            }
        }
    }
    if conflicts.is_empty() {
        return Ok(Rebased {
            patch: patch.clone(),
        });
    }
    // Sorted, an ancestor comes first: keep only the outermost locations.
    let mut pointers: Vec<Pointer> = Vec::new();
    for pointer in conflicts {
        if !pointers.iter().any(|kept| pointer.is_within(kept)) {
            pointers.push(pointer);
        }
    }
    let fresh = project_pointers(newest, &pointers);
    Err(Conflict { pointers, fresh })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(value: Value) -> StatePatch {
        StatePatch::from_value(&value).unwrap()
    }

    fn conflict_at(p: Value, base: &Value, newest: &Value) -> Vec<String> {
        match rebase(&patch(p), base, newest) {
            Ok(_) => Vec::new(),
            Err(conflict) => conflict.pointers.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn disjoint_members_of_one_object_rebase() {
        let base = json!({"plan": {"front": 1, "back": 1}});
        let newest = json!({"plan": {"front": 1, "back": 2, "ops": 1}});
        let p = patch(json!({"plan": {"front": 5}}));
        let rebased = rebase(&p, &base, &newest).unwrap();
        assert_eq!(
            rebased.patch.apply(&newest).unwrap(),
            json!({"plan": {"front": 5, "back": 2, "ops": 1}})
        );
        // Both writers creating members of a missing object is no conflict either.
        assert_eq!(
            conflict_at(json!({"a": {"x": 1}}), &json!({}), &json!({"a": {"y": 1}})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_changed_location_conflicts_with_its_fresh_value() {
        let base = json!({"plan": {"front": 1, "back": 1}});
        let newest = json!({"plan": {"front": 2, "back": 1}});
        let err = rebase(&patch(json!({"plan": {"front": 5}})), &base, &newest).unwrap_err();
        assert_eq!(err.pointers, [Pointer::parse("/plan/front").unwrap()]);
        assert_eq!(err.fresh, json!({"plan": {"front": 2}}));
        // Changed below a replaced location, or deleted.
        let base = json!({"a": {"b": {"c": 1}}});
        assert_eq!(
            conflict_at(
                json!({"a": {"b": 7}}),
                &base,
                &json!({"a": {"b": {"c": 2}}})
            ),
            ["/a/b"]
        );
        assert_eq!(
            conflict_at(json!({"a": {"b": null}}), &base, &json!({"a": {}})),
            ["/a/b"]
        );
    }

    #[test]
    fn an_ancestor_deleted_or_replaced_conflicts_at_the_ancestor() {
        let base = json!({"a": {"b": 1, "c": 1}});
        assert_eq!(
            conflict_at(json!({"a": {"c": 2}}), &base, &json!({})),
            ["/a"]
        );
        assert_eq!(
            conflict_at(json!({"a": {"d": 2}}), &base, &json!({"a": 5})),
            ["/a"]
        );
        let err = rebase(&patch(json!({"a": {"d": 2}})), &base, &json!({})).unwrap_err();
        assert_eq!(err.fresh, json!({}));
        // A merge into an empty object still needs the object.
        assert_eq!(
            conflict_at(json!({"a": {}}), &base, &json!({"a": [1]})),
            ["/a"]
        );
    }

    #[test]
    fn an_array_is_one_location() {
        let base = json!({"list": [1, 2, 3], "x": 0});
        let newest = json!({"list": [1, 2, 4], "x": 0});
        assert_eq!(
            conflict_at(
                json!([{"op": "replace", "path": "/list/0", "value": 9}]),
                &base,
                &newest
            ),
            ["/list"]
        );
        assert_eq!(
            conflict_at(
                json!([{"op": "add", "path": "/list/-", "value": 9}]),
                &base,
                &newest
            ),
            ["/list"]
        );
        assert!(
            rebase(
                &patch(json!([{"op": "add", "path": "/list/-", "value": 9}])),
                &base,
                &json!({"list": [1, 2, 3], "x": 1})
            )
            .is_ok()
        );
    }

    #[test]
    fn sources_a_patch_copies_or_tests_count() {
        let base = json!({"src": 1, "dst": 0});
        let newest = json!({"src": 2, "dst": 0});
        assert_eq!(
            conflict_at(
                json!([{"op": "copy", "from": "/src", "path": "/dst"}]),
                &base,
                &newest
            ),
            ["/src"]
        );
        assert_eq!(
            conflict_at(
                json!([{"op": "test", "path": "/src", "value": 1}, {"op": "replace", "path": "/dst", "value": 1}]),
                &base,
                &newest
            ),
            ["/src"]
        );
    }
}
