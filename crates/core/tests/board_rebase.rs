//! Properties of the board core: rebasing disjoint writers never loses an update and commutes;
//! overlapping writers conflict exactly where they overlap; a patch the write check accepts
//! changes nothing outside its writes; a projection holds nothing outside its reads.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use skillstate_core::board::{
    BoardScope, Pointer, check_writes, project, project_pointers, rebase, touched,
};
use skillstate_core::patch::StatePatch;

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const CHILDREN: [&str; 3] = ["c0", "c1", "c2"];

fn ptr(tokens: &[&str]) -> Pointer {
    Pointer::from_tokens(tokens.iter().copied())
}

fn merge(value: Value) -> StatePatch {
    StatePatch::from_value(&value).unwrap()
}

// ---------------------------------------------------------------- (a) disjoint writers

/// Who owns one top-level key of the board.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Owner {
    P,
    Q,
    Split,
    Nobody,
}

/// What a writer does with a key it owns wholly.
#[derive(Debug, Clone)]
enum WholeOp {
    Leave,
    Delete,
    Scalar(i64),
    Leaves(Vec<(usize, Option<i64>)>),
}

/// What a writer does with one child it owns.
#[derive(Debug, Clone, Copy)]
enum LeafOp {
    Leave,
    Set(i64),
    Delete,
}

#[derive(Debug, Clone)]
struct KeyPlan {
    owner: Owner,
    /// absent (None), an object with these children, or a scalar (only for whole owners).
    base: Option<Result<Vec<(usize, i64)>, i64>>,
    whole: WholeOp,
    /// For split keys: each child's owner (0 P, 1 Q, 2 nobody) and what the owner does.
    leaves: Vec<(u8, LeafOp)>,
}

fn leaf_op() -> impl Strategy<Value = LeafOp> {
    prop_oneof![
        Just(LeafOp::Leave),
        (0i64..5).prop_map(LeafOp::Set),
        Just(LeafOp::Delete)
    ]
}

fn key_plan() -> impl Strategy<Value = KeyPlan> {
    let owner = prop_oneof![
        Just(Owner::P),
        Just(Owner::Q),
        Just(Owner::Split),
        Just(Owner::Nobody)
    ];
    let children = proptest::collection::vec((0usize..3, 0i64..5), 0..3);
    let base = prop_oneof![
        Just(None),
        children.prop_map(|c| Some(Ok(c))),
        (0i64..5).prop_map(|s| Some(Err(s))),
    ];
    let whole = prop_oneof![
        Just(WholeOp::Leave),
        Just(WholeOp::Delete),
        (0i64..5).prop_map(WholeOp::Scalar),
        proptest::collection::vec((0usize..3, proptest::option::of(0i64..5)), 1..3)
            .prop_map(WholeOp::Leaves),
    ];
    let leaves = proptest::collection::vec((0u8..3, leaf_op()), 3);
    (owner, base, whole, leaves).prop_map(|(owner, mut base, whole, leaves)| {
        if owner == Owner::Split && matches!(base, Some(Err(_))) {
            // Two writers merging into one scalar would each replace it: that is one location.
            base = None;
        }
        KeyPlan {
            owner,
            base,
            whole,
            leaves,
        }
    })
}

/// Who owns `/list` (0 P, 1 Q, 2 nobody) and whether its owner appends (JSON Patch) or replaces.
fn list_plan() -> impl Strategy<Value = (u8, bool, i64)> {
    (0u8..3, any::<bool>(), 0i64..5)
}

fn base_of(plans: &[KeyPlan]) -> Value {
    let mut doc = Map::new();
    for (key, plan) in KEYS.iter().zip(plans) {
        match &plan.base {
            None => {}
            Some(Ok(children)) => {
                let members: Map<String, Value> = children
                    .iter()
                    .map(|(c, v)| (CHILDREN[*c].to_owned(), json!(v)))
                    .collect();
                doc.insert((*key).to_owned(), Value::Object(members));
            }
            Some(Err(scalar)) => {
                doc.insert((*key).to_owned(), json!(scalar));
            }
        }
    }
    doc.insert("list".into(), json!([0, 1]));
    Value::Object(doc)
}

/// The merge patch of writer `me` (0 P, 1 Q), values tagged with the writer so that writes are
/// real changes.
fn writer_patch(
    me: u8,
    plans: &[KeyPlan],
    list: (u8, bool, i64),
    json_form: bool,
    base: &Value,
) -> StatePatch {
    let tag = |v: i64| json!(format!("{}{v}", if me == 0 { "p" } else { "q" }));
    let whole_owner = if me == 0 { Owner::P } else { Owner::Q };
    let mut members = Map::new();
    for (key, plan) in KEYS.iter().zip(plans) {
        let value = if plan.owner == whole_owner {
            match &plan.whole {
                WholeOp::Leave => None,
                WholeOp::Delete => Some(Value::Null),
                WholeOp::Scalar(s) => Some(tag(*s)),
                WholeOp::Leaves(leaves) => Some(Value::Object(
                    leaves
                        .iter()
                        .map(|(c, v)| (CHILDREN[*c].to_owned(), v.map_or(Value::Null, tag)))
                        .collect(),
                )),
            }
        } else if plan.owner == Owner::Split {
            let inner: Map<String, Value> = plan
                .leaves
                .iter()
                .enumerate()
                .filter(|(_, (owner, _))| *owner == me)
                .filter_map(|(c, (_, op))| match op {
                    LeafOp::Leave => None,
                    LeafOp::Set(v) => Some((CHILDREN[c].to_owned(), tag(*v))),
                    LeafOp::Delete => Some((CHILDREN[c].to_owned(), Value::Null)),
                })
                .collect();
            (!inner.is_empty()).then_some(Value::Object(inner))
        } else {
            None
        };
        if let Some(value) = value {
            members.insert((*key).to_owned(), value);
        }
    }
    let (list_owner, append, item) = list;
    if list_owner == me && !append {
        members.insert("list".into(), json!([tag(item)]));
    }
    if !json_form {
        if list_owner == me && append {
            // A merge patch cannot append: replace with the appended list instead.
            members.insert("list".into(), json!([0, 1, tag(item)]));
        }
        return StatePatch::Merge(members);
    }
    // The same change as a JSON Patch, judged against `base` (where every split key is an
    // object, see the caller).
    let mut ops = Vec::new();
    for (key, value) in &members {
        let at = format!("/{key}");
        match (value, base.get(key)) {
            (Value::Null, Some(_)) => ops.push(json!({"op": "remove", "path": at})),
            (Value::Null, None) => {}
            (Value::Object(inner), Some(Value::Object(existing))) => {
                for (child, v) in inner {
                    let path = format!("{at}/{child}");
                    match v {
                        Value::Null if existing.contains_key(child) => {
                            ops.push(json!({"op": "remove", "path": path}))
                        }
                        Value::Null => {}
                        v => ops.push(json!({"op": "add", "path": path, "value": v})),
                    }
                }
            }
            (Value::Object(inner), _) => {
                let kept: Map<String, Value> = inner
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                ops.push(json!({"op": "add", "path": at, "value": kept}));
            }
            (v, _) => ops.push(json!({"op": "add", "path": at, "value": v})),
        }
    }
    if list_owner == me && append {
        ops.push(json!({"op": "add", "path": "/list/-", "value": tag(item)}));
    }
    StatePatch::from_value(&Value::Array(ops)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// (a) Disjoint writers: the patch rebases, the result equals both serial orders, and
    /// neither writer's update is lost.
    #[test]
    fn disjoint_writers_rebase_and_commute(
        plans in proptest::collection::vec(key_plan(), 4),
        list in list_plan(),
        json_p in any::<bool>(),
        json_q in any::<bool>(),
    ) {
        let mut base = base_of(&plans);
        // JSON Patch needs the split objects to exist already.
        if json_p || json_q {
            for (key, plan) in KEYS.iter().zip(&plans) {
                if plan.owner == Owner::Split && base.get(key).is_none() {
                    base[*key] = json!({});
                }
            }
        }
        let p = writer_patch(0, &plans, list, json_p, &base);
        let q = writer_patch(1, &plans, list, json_q, &base);
        let after_q = q.apply(&base).unwrap();
        let after_p = p.apply(&base).unwrap();

        let rebased = rebase(&p, &base, &after_q);
        prop_assert!(rebased.is_ok(), "P conflicted: {:?}\np = {:?}\nq = {:?}\nbase = {}", rebased, p, q, base);
        let p_then = rebased.unwrap().patch.apply(&after_q).unwrap();
        let rebased = rebase(&q, &base, &after_p);
        prop_assert!(rebased.is_ok(), "Q conflicted: {:?}", rebased);
        let q_then = rebased.unwrap().patch.apply(&after_p).unwrap();
        prop_assert_eq!(&p_then, &q_then);
        for location in touched(&q) {
            prop_assert_eq!(location.get(&p_then), location.get(&after_q), "Q's {} lost", location);
        }
        for location in touched(&p) {
            prop_assert_eq!(location.get(&p_then), location.get(&after_p), "P's {} differs", location);
        }
    }
}

// ---------------------------------------------------------------- (b) overlapping writers

fn full_grid() -> Value {
    let mut doc = Map::new();
    for (k, key) in KEYS.iter().enumerate() {
        let children: Map<String, Value> = CHILDREN
            .iter()
            .enumerate()
            .map(|(c, child)| ((*child).to_owned(), json!(k * 10 + c)))
            .collect();
        doc.insert((*key).to_owned(), Value::Object(children));
    }
    doc.insert("list".into(), json!([0, 1, 2]));
    Value::Object(doc)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// (b) Overlapping writers: the conflict lists exactly the overlapping locations (a deleted
    /// object once, an array once) with their fresh values.
    #[test]
    fn overlapping_writers_conflict_exactly_where_they_overlap(
        p_leaves in proptest::collection::btree_set((0usize..4, 0usize..3), 0..6),
        q_leaves in proptest::collection::btree_set((0usize..4, 0usize..3), 0..6),
        q_deletes in proptest::collection::btree_set(0usize..4, 0..2),
        p_list in proptest::option::of(0usize..3),
        q_list in proptest::option::of(0usize..3),
        json_p in any::<bool>(),
    ) {
        let base = full_grid();
        // Q: the committed writer.
        let mut q = Map::new();
        for &(k, c) in &q_leaves {
            if !q_deletes.contains(&k) {
                q.entry(KEYS[k]).or_insert_with(|| json!({}))[CHILDREN[c]] = json!("q");
            }
        }
        for &k in &q_deletes {
            q.insert(KEYS[k].to_owned(), Value::Null);
        }
        let mut newest = merge(Value::Object(q)).apply(&base).unwrap();
        if let Some(j) = q_list {
            newest["list"][j] = json!("q");
        }
        // P: the late writer.
        let p = if json_p {
            let mut ops: Vec<Value> = p_leaves
                .iter()
                .map(|(k, c)| json!({"op": "replace", "path": format!("/{}/{}", KEYS[*k], CHILDREN[*c]), "value": "p"}))
                .collect();
            if let Some(i) = p_list {
                ops.push(json!({"op": "replace", "path": format!("/list/{i}"), "value": "p"}));
            }
            StatePatch::from_value(&Value::Array(ops)).unwrap()
        } else {
            let mut members = Map::new();
            for &(k, c) in &p_leaves {
                members.entry(KEYS[k]).or_insert_with(|| json!({}))[CHILDREN[c]] = json!("p");
            }
            if let Some(i) = p_list {
                let mut list = json!([0, 1, 2]);
                list[i] = json!("p");
                members.insert("list".into(), list);
            }
            merge(Value::Object(members))
        };
        prop_assert!(p.apply(&base).is_ok());

        let mut expected: Vec<Pointer> = Vec::new();
        for (k, key) in KEYS.iter().enumerate() {
            let p_here: Vec<usize> = p_leaves.iter().filter(|(pk, _)| *pk == k).map(|(_, c)| *c).collect();
            if q_deletes.contains(&k) {
                if !p_here.is_empty() {
                    expected.push(ptr(&[key]));
                }
                continue;
            }
            for c in p_here {
                if q_leaves.contains(&(k, c)) {
                    expected.push(ptr(&[key, CHILDREN[c]]));
                }
            }
        }
        if p_list.is_some() && q_list.is_some() {
            expected.push(ptr(&["list"]));
        }
        expected.sort();

        match rebase(&p, &base, &newest) {
            Ok(rebased) => {
                prop_assert!(expected.is_empty(), "no conflict reported, expected {:?}", expected);
                // Q's writes survive P.
                let done = rebased.patch.apply(&newest).unwrap();
                for &(k, c) in &q_leaves {
                    let at = ptr(&[KEYS[k], CHILDREN[c]]);
                    if !q_deletes.contains(&k) {
                        prop_assert_eq!(at.get(&done), Some(&json!("q")));
                    }
                }
                for &k in &q_deletes {
                    prop_assert!(done.get(KEYS[k]).is_none());
                }
            }
            Err(conflict) => {
                prop_assert_eq!(&conflict.pointers, &expected);
                prop_assert_eq!(conflict.fresh, project_pointers(&newest, &expected));
            }
        }
    }
}

// ---------------------------------------------------------------- random documents

const TOKENS: [&str; 6] = ["a", "b", "c", "0", "1", "-"];

fn document() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        (0i64..4).prop_map(|n| json!(n)),
        Just(json!("s"))
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("a".to_owned()),
                    Just("b".to_owned()),
                    Just("c".to_owned()),
                    Just("0".to_owned())
                ],
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn board() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map(
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("c".to_owned())
        ],
        document(),
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()))
}

fn pointer(min: usize) -> impl Strategy<Value = Pointer> {
    proptest::collection::vec(proptest::sample::select(&TOKENS[..]), min..4)
        .prop_map(|tokens| Pointer::from_tokens(tokens.iter().copied()))
}

/// Every location in `doc`: the root and every member and element, recursively.
fn locations(doc: &Value, at: Pointer, out: &mut Vec<Pointer>) {
    match doc {
        Value::Object(map) => {
            for (key, value) in map {
                locations(value, at.child(key.clone()), out);
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                locations(value, at.child(index.to_string()), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// A location near one of `writes` (itself, a child, its parent) or anywhere.
fn near(writes: Vec<Pointer>) -> BoxedStrategy<Pointer> {
    let pick = proptest::sample::select(writes);
    prop_oneof![
        pick.clone(),
        (pick.clone(), proptest::sample::select(&TOKENS[..])).prop_map(|(w, t)| w.child(t)),
        pick.prop_map(|w| w.parent().filter(|p| !p.is_root()).unwrap_or(w)),
        pointer(1),
    ]
    .boxed()
}

fn json_op(writes: Vec<Pointer>) -> impl Strategy<Value = Value> {
    let path = move || near(writes.clone()).prop_map(|p| p.to_string());
    prop_oneof![
        (path(), document()).prop_map(|(p, v)| json!({"op": "add", "path": p, "value": v})),
        path().prop_map(|p| json!({"op": "remove", "path": p})),
        (path(), document()).prop_map(|(p, v)| json!({"op": "replace", "path": p, "value": v})),
        (path(), path()).prop_map(|(f, p)| json!({"op": "move", "from": f, "path": p})),
        (path(), path()).prop_map(|(f, p)| json!({"op": "copy", "from": f, "path": p})),
    ]
}

/// A merge patch with members at locations near the writes, plus random members.
fn merge_near(writes: Vec<Pointer>) -> impl Strategy<Value = StatePatch> {
    (
        proptest::collection::vec((near(writes), document()), 0..3),
        board(),
    )
        .prop_map(|(members, mut doc)| {
            for (at, value) in members {
                let mut slot = &mut doc;
                for token in at.tokens() {
                    if !slot.is_object() {
                        *slot = json!({});
                    }
                    slot = &mut slot[token.as_str()];
                }
                *slot = value;
            }
            merge(doc)
        })
}

/// A board, writes at its locations or anywhere (no `-` token), and a patch aimed at and
/// around them.
fn state_writes_and_patch() -> impl Strategy<Value = (Value, Vec<Pointer>, StatePatch)> {
    board()
        .prop_flat_map(|state| {
            let mut present = Vec::new();
            locations(&state, Pointer::root(), &mut present);
            present.retain(|p| !p.is_root());
            let write = if present.is_empty() {
                pointer(1).boxed()
            } else {
                prop_oneof![3 => proptest::sample::select(present), 1 => pointer(1)].boxed()
            };
            (Just(state), proptest::collection::vec(write, 1..4))
        })
        .prop_map(|(state, writes)| {
            let kept: Vec<Pointer> = writes
                .into_iter()
                .filter(|w| !w.tokens().iter().any(|t| t == "-"))
                .collect();
            let kept = if kept.is_empty() {
                vec![Pointer::from_tokens(["a"])]
            } else {
                kept
            };
            (state, kept)
        })
        .prop_flat_map(|(state, writes)| {
            let patch = prop_oneof![
                merge_near(writes.clone()),
                proptest::collection::vec(json_op(writes.clone()), 1..4)
                    .prop_map(|ops| StatePatch::from_value(&Value::Array(ops)).unwrap()),
            ];
            (Just(state), Just(writes), patch)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// (c) A patch the write check accepts changes no location outside the writes: every other
    /// location keeps its value, except that an ancestor of a write may be created as an object
    /// and an object or array on the way keeps its kind (and an array its length).
    #[test]
    fn accepted_patches_change_only_their_writes(
        (state, writes, patch) in state_writes_and_patch(),
    ) {
        let scope = BoardScope { reads: vec![Pointer::root()], writes };
        let Ok(()) = check_writes(&patch, &state, &scope) else { return Ok(()) };
        let Ok(next) = patch.apply(&state) else { return Ok(()) };
        let mut all = Vec::new();
        locations(&state, Pointer::root(), &mut all);
        locations(&next, Pointer::root(), &mut all);
        for location in all {
            if scope.can_write(&location) {
                continue;
            }
            let (old, new) = (location.get(&state), location.get(&next));
            if scope.writes.iter().any(|w| w.is_within(&location)) {
                let kept = match (old, new) {
                    (None, None | Some(Value::Object(_))) => true,
                    (Some(Value::Object(_)), Some(Value::Object(_))) => true,
                    (Some(Value::Array(a)), Some(Value::Array(b))) => a.len() == b.len(),
                    (old, new) => old == new,
                };
                prop_assert!(kept, "ancestor {} of a write changed: {:?} -> {:?} (patch {:?})", location, old, new, patch);
            } else {
                prop_assert_eq!(old, new, "{} is outside the writes {:?} (patch {:?})", location, scope.writes, patch);
            }
        }
    }

    /// (c') A patch made only of members at write locations is accepted.
    #[test]
    fn patches_inside_the_writes_are_accepted(
        state in board(),
        writes in proptest::collection::vec(pointer(1), 1..4),
        values in proptest::collection::vec(document(), 4),
    ) {
        let writes: Vec<Pointer> = writes.into_iter().filter(|w| !w.tokens().iter().any(|t| t == "-")).collect();
        let scope = BoardScope { reads: vec![Pointer::root()], writes: writes.clone() };
        let ops: Vec<Value> = writes
            .iter()
            .zip(values)
            .map(|(w, v)| json!({"op": "replace", "path": w.to_string(), "value": v}))
            .collect();
        let patch = StatePatch::from_value(&Value::Array(ops)).unwrap();
        prop_assert_eq!(check_writes(&patch, &state, &scope), Ok(()));
    }

    /// (d) A projection holds every read location's value and nothing outside the reads but
    /// the containers leading to them and `null` placeholders in arrays.
    #[test]
    fn projection_holds_exactly_the_reads(
        state in board(),
        reads in proptest::collection::vec(pointer(0), 0..4),
    ) {
        let scope = BoardScope { reads: reads.clone(), writes: Vec::new() };
        let shown = project(&state, &scope);
        let mut reversed = reads.clone();
        reversed.reverse();
        prop_assert_eq!(&shown, &project(&state, &BoardScope { reads: reversed, writes: Vec::new() }));
        for read in &reads {
            prop_assert_eq!(read.get(&shown), read.get(&state), "read {}", read);
        }
        let mut all = Vec::new();
        locations(&shown, Pointer::root(), &mut all);
        for location in all {
            if location.is_root() && !scope.can_read(&location) {
                // The projection is always an object, `{}` when nothing is read.
                prop_assert!(shown.is_object());
                continue;
            }
            if scope.can_read(&location) {
                prop_assert_eq!(location.get(&shown), location.get(&state));
                continue;
            }
            let leads_to_read = reads.iter().any(|r| r.is_within(&location) && r.get(&state).is_some());
            let (here, there) = (location.get(&shown), location.get(&state));
            if leads_to_read {
                let same_kind = matches!((here, there), (Some(Value::Object(_)), Some(Value::Object(_))) | (Some(Value::Array(_)), Some(Value::Array(_))));
                prop_assert!(same_kind, "container {} is {:?} in the projection, {:?} in the state", location, here, there);
            } else {
                let placeholder = here == Some(&Value::Null)
                    && location.parent().and_then(|p| p.get(&shown).cloned()).is_some_and(|p| p.is_array());
                prop_assert!(placeholder, "{} = {:?} is outside the reads {:?}", location, here, reads);
            }
        }
    }
}
