//! A step of a task attached to a board: what its model sees and how its answer is checked.
//!
//! The board is *mounted* in the state the prompt shows, at `/board`: the task's own state with
//! one more member holding the board projected onto the skill's reads ([`mounted_view`]). The
//! model answers as any other — one `state_patch` — and patches the board under `/board` the
//! way it patches its own fields. [`validate_board_step`] splits that patch in two: the task's
//! part goes through the task's pipeline (its schema, read-only fields, state budget); the
//! board's part is checked against the skill's `[board] writes` ([`super::check_writes`]), then
//! applied to the whole board (not the projection) and checked against the board's schema and
//! read-only fields. Every rejection points where the model wrote: `/state_patch/board/...` in
//! its output, `/board/...` in the state it saw.
//!
//! A patch that moves or copies between the task's state and the board is refused: the two are
//! separate documents with separate journals.

use serde_json::{Map, Value};

use super::pointer::Pointer;
use super::project::project;
use super::rebase::Conflict;
use super::scope::BoardScope;
use super::write_check::check_writes;
use crate::json::state_hash;
use crate::outside::Outside;
use crate::patch::StatePatch;
use crate::schema::{StateSchema, WriteCheck};
use crate::schema_problem::ReaderView;
use crate::secrets::Redactor;
use crate::validate::{
    AcceptedStep, Document, RejectedStep, Rejection, RejectionKind, StepRules, check_action,
    check_patch_with, named_once, parse_answer, schema_rejections,
};

/// The member of the shown state that holds the board.
pub const MOUNT: &str = "board";

/// What a board's part of an answer is checked against.
pub struct BoardRules<'a> {
    pub schema: &'a StateSchema,
    pub scope: &'a BoardScope,
}

impl BoardRules<'_> {
    /// What the member reads of the board: its problems are rendered for this reader (who
    /// also stands for the readers of the task's journal, which never see write-only values).
    pub fn reader(&self) -> ReaderView<'_> {
        self.schema.view_of(&self.scope.reads)
    }
}

/// The board's part of an accepted answer, applied to the board version the prompt showed.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardChange {
    pub patch: StatePatch,
    pub new_state: Value,
    pub state_hash: String,
}

/// The state a board member's prompt shows: its own state with the board's reads at `/board`.
pub fn mounted_view(task_state: &Value, board_state: &Value, scope: &BoardScope) -> Value {
    let mut view = match task_state {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    view.insert(MOUNT.to_owned(), project(board_state, scope));
    Value::Object(view)
}

/// Whether a task state schema leaves `/board` free for the mount: a skill whose own state has
/// a top-level `board` member cannot be attached (the two would collide).
pub fn mount_is_free(task_state: &Value) -> bool {
    task_state.get(MOUNT).is_none()
}

/// Why tasks of `skill` cannot be attached to a board, when they cannot: the skill declares no
/// `[board]` table (nothing to read or write), or its own state has, or its schema declares, a
/// top-level `board` member, where the board is shown. Checked before a task joins, so a
/// refused join stores nothing.
pub fn join_problem(skill: &crate::Skill) -> Option<String> {
    if skill.settings().board.is_none() {
        return Some(format!(
            "skill `{}` has no [board] table in skill.toml; declare what it reads and writes there ([board] reads = [\"/plan\"], writes = [\"/plan/mine\"])",
            skill.name()
        ));
    }
    let schema = skill.schema.document();
    let declared = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(MOUNT))
        || schema
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|name| name == MOUNT));
    if declared || !mount_is_free(&skill.definition.initial_state) {
        return Some(format!(
            "the own state of skill `{}` has a top-level `{MOUNT}` member (in state.schema.json or state.init.json), where the board is shown to the model; rename that member",
            skill.name()
        ));
    }
    None
}

/// A patch split into the task's part and the board's part.
struct Split {
    task: Value,
    board: Option<Value>,
    /// For a JSON Patch board part: the index in the model's array of each board operation.
    board_indices: Vec<usize>,
}

fn split_patch(raw: &Value, rejections: &mut Vec<Rejection>) -> Option<Split> {
    match raw {
        Value::Object(members) => {
            let mut task = members.clone();
            let board = match task.remove(MOUNT) {
                None => None,
                Some(Value::Object(inner)) if inner.is_empty() => None,
                Some(Value::Object(inner)) => Some(Value::Object(inner)),
                Some(_) => {
                    rejections.push(shape(
                        format!("/state_patch/{MOUNT}"),
                        "the board cannot be deleted or replaced; patch its members: {\"board\": {\"part\": ...}}",
                    ));
                    return None;
                }
            };
            Some(Split {
                task: Value::Object(task),
                board,
                board_indices: Vec::new(),
            })
        }
        Value::Array(ops) => {
            let mut task_ops = Vec::new();
            let mut board_ops = Vec::new();
            let mut board_indices = Vec::new();
            let mut ok = true;
            for (index, op) in ops.iter().enumerate() {
                let side = |field: &str| -> Option<Result<bool, ()>> {
                    let path = op.get(field)?.as_str()?;
                    Some(on_board(path))
                };
                let path_side = side("path");
                let from_side = side("from");
                match (path_side, from_side) {
                    (Some(Err(())), _) => {
                        rejections.push(shape(
                            format!("/state_patch/{index}/path"),
                            "the board cannot be removed or replaced as a whole; name a location inside it (/board/part)",
                        ));
                        ok = false;
                    }
                    (_, Some(Err(()))) => {
                        rejections.push(shape(
                            format!("/state_patch/{index}/from"),
                            "the board as a whole cannot be moved or copied; name a location inside it",
                        ));
                        ok = false;
                    }
                    (Some(Ok(to)), Some(Ok(from))) if to != from => {
                        rejections.push(shape(
                            format!("/state_patch/{index}/from"),
                            "moves and copies between the task's state and the board are not allowed: they are separate documents; write the value itself",
                        ));
                        ok = false;
                    }
                    (Some(Ok(true)), _) => {
                        let mut op = op.clone();
                        strip(&mut op, "path");
                        strip(&mut op, "from");
                        board_ops.push(op);
                        board_indices.push(index);
                    }
                    // Not on the board, or shaped wrongly (the task's pipeline reports it).
                    _ => task_ops.push(op.clone()),
                }
            }
            ok.then(|| Split {
                task: Value::Array(task_ops),
                board: (!board_ops.is_empty()).then_some(Value::Array(board_ops)),
                board_indices,
            })
        }
        // Not a patch at all: the task's pipeline reports the shape.
        other => Some(Split {
            task: other.clone(),
            board: None,
            board_indices: Vec::new(),
        }),
    }
}

/// The board's part of a board member's `state_patch`, as [`validate_board_step`] splits it
/// (paths relative to the board); `None` when it has none or does not split.
pub fn board_part(state_patch: &Value) -> Option<Value> {
    let mut ignored = Vec::new();
    split_patch(state_patch, &mut ignored).and_then(|split| split.board)
}

/// `Ok(true)` for a path inside the board, `Ok(false)` outside it, `Err` for the board itself.
fn on_board(path: &str) -> Result<bool, ()> {
    let mount = format!("/{MOUNT}");
    if path == mount {
        return Err(());
    }
    Ok(path.starts_with(&format!("{mount}/")))
}

fn strip(op: &mut Value, field: &str) {
    let prefix_len = MOUNT.len() + 1;
    if let Some(Value::String(path)) = op.get_mut(field)
        && path.len() > prefix_len
    {
        *path = path[prefix_len..].to_owned();
    }
}

fn shape(pointer: String, message: &str) -> Rejection {
    Rejection {
        kind: RejectionKind::PatchShape,
        document: Document::Output,
        pointer,
        message: message.to_owned(),
    }
}

/// Runs the whole pipeline on the answer of a task attached to a board: `task_state` is the
/// task's own state, `board_state` the whole board at the version the prompt showed (projected
/// onto the skill's reads in the prompt). Only read.
pub fn validate_board_step(
    rules: &StepRules<'_>,
    board: &BoardRules<'_>,
    task_state: &Value,
    board_state: &Value,
    raw_output: &str,
) -> Result<AcceptedStep, RejectedStep> {
    let parsed = parse_answer(raw_output)?;
    let mut rejections = Vec::new();
    let split = split_patch(&parsed.state_patch, &mut rejections);
    let mut task_part = None;
    let mut board_part = None;
    if let Some(split) = split {
        task_part = check_patch_with(
            rules.schema,
            rules.state_token_budget,
            task_state,
            &split.task,
            "/state_patch",
            &rules.schema.whole_view(),
            &mut rejections,
        );
        if let Some(raw_board) = &split.board {
            board_part = check_board_patch(
                board,
                board_state,
                raw_board,
                &split.board_indices,
                &mut rejections,
            );
        }
    }
    let action = check_action(rules.catalog, &parsed.action, &mut rejections);
    let board_ok = board_part.as_ref().is_none_or(Option::is_some);
    match (task_part, action) {
        (Some((patch, new_state, state_tokens)), Some(action))
            if rejections.is_empty() && board_ok =>
        {
            Ok(AcceptedStep {
                reasoning: parsed.reasoning,
                patch,
                action,
                state_hash: state_hash(&new_state),
                new_state,
                state_tokens,
                board: board_part.flatten(),
            })
        }
        _ => Err(RejectedStep {
            parsed: Some(Box::new(parsed)),
            rejections,
        }),
    }
}

/// `None` when there is no board part; `Some(None)` when it was rejected.
fn check_board_patch(
    board: &BoardRules<'_>,
    board_state: &Value,
    raw: &Value,
    indices: &[usize],
    rejections: &mut Vec<Rejection>,
) -> Option<Option<BoardChange>> {
    let output_pointer = |pointer: &str| -> String {
        match raw {
            // `/3/path` of the board's operations is the model's `/state_patch/<index>/path`.
            Value::Array(_) => {
                let mut tokens = pointer.splitn(3, '/').skip(1);
                let index = tokens.next().and_then(|t| t.parse::<usize>().ok());
                let rest = tokens.next().map(|r| format!("/{r}")).unwrap_or_default();
                match index.and_then(|i| indices.get(i)) {
                    Some(original) => format!("/state_patch/{original}{rest}"),
                    None => "/state_patch".to_owned(),
                }
            }
            _ => format!("/state_patch/{MOUNT}{pointer}"),
        }
    };
    let patch = match StatePatch::from_value(raw) {
        Ok(patch) => patch,
        Err(problem) => {
            rejections.push(Rejection {
                kind: RejectionKind::PatchShape,
                document: Document::Output,
                pointer: output_pointer(&problem.pointer),
                message: problem.message,
            });
            return Some(None);
        }
    };
    if let Err(outside) = check_writes(&patch, board_state, board.scope) {
        rejections.extend(outside.into_iter().map(mounted));
        return Some(None);
    }
    match apply_board(board.schema, &patch, board_state, &board.reader()) {
        Ok(change) => Some(Some(change)),
        Err(problems) => {
            rejections.extend(problems.into_iter().map(mounted));
            Some(None)
        }
    }
}

/// Applies a board patch to `board_state` and checks the result against the board's schema and
/// read-only fields: what an accepted answer's board part, and the same patch rebased onto a
/// newer version, must pass. Rejection pointers are into the board (not yet mounted); schema
/// problems are rendered for `reader` (the writer's reads: [`BoardRules::reader`]).
pub fn apply_board(
    schema: &StateSchema,
    patch: &StatePatch,
    board_state: &Value,
    reader: &ReaderView<'_>,
) -> Result<BoardChange, Vec<Rejection>> {
    let new_state = patch.apply(board_state).map_err(|problem| {
        vec![Rejection {
            kind: RejectionKind::PatchApply,
            document: Document::State,
            pointer: problem.pointer,
            message: problem.message,
        }]
    })?;
    match schema.check_write(board_state, &new_state) {
        WriteCheck::Fine => {}
        WriteCheck::ReadOnly(read_only) => {
            return Err(named_once(read_only, reader)
                .into_iter()
                .map(|pointer| Rejection {
                    kind: RejectionKind::ReadOnly,
                    document: Document::State,
                    message: if pointer.is_empty() {
                        format!(
                            "{} is read-only; leave it out of the patch",
                            crate::json::pointer_for_humans(&pointer, "board")
                        )
                    } else {
                        format!("{pointer} of the board is read-only; leave it out of the patch")
                    },
                    pointer,
                })
                .collect());
        }
        WriteCheck::Invalid(problems) => {
            return Err(schema_rejections(
                &problems,
                reader,
                "the board",
                "its schema",
            ));
        }
    }
    Ok(BoardChange {
        patch: patch.clone(),
        state_hash: state_hash(&new_state),
        new_state,
    })
}

/// A rejection whose state pointer is into the board, re-pointed into the shown state.
pub fn mounted(mut rejection: Rejection) -> Rejection {
    if rejection.document == Document::State {
        rejection.pointer = format!("/{MOUNT}{}", rejection.pointer);
    }
    rejection
}

/// Longest fresh value a conflict rejection quotes, in bytes of JSON.
const MAX_FRESH_BYTES: usize = 400;

/// The rejections that tell a writer its answer met others' writes: one per conflicting
/// location, with its fresh value as far as the writer's reads show it, write-only values
/// (of the board's `schema`) reading `[redacted]`: a rejection is kept in the task's journal,
/// whose readers never see them.
pub fn conflict_rejections(
    conflict: &Conflict,
    newest: &Value,
    scope: &BoardScope,
    schema: &StateSchema,
    secrets: &Redactor,
) -> Vec<Rejection> {
    let mut visible = project(newest, scope);
    schema.write_only().redact(&mut visible);
    conflict
        .pointers
        .iter()
        .map(|pointer| {
            let fresh = match pointer.get(&visible) {
                Some(value) => {
                    // A board value may have been written from outside (the service's PATCH):
                    // redacted before it is cut.
                    let clipped = Outside::from(value).clipped(secrets, MAX_FRESH_BYTES);
                    let ellipsis = if clipped.cut { "…" } else { "" };
                    format!("it is now {}{ellipsis}", clipped.text)
                }
                None if pointer.get(newest).is_some() => {
                    "its new value lies outside what this skill reads".to_owned()
                }
                None => "it was deleted".to_owned(),
            };
            Rejection {
                kind: RejectionKind::BoardConflict,
                document: Document::State,
                pointer: format!("/{MOUNT}{}", pointer_text(pointer)),
                message: format!(
                    "another writer changed this part of the board after your answer was computed ({fresh}); the board shown now is the newest — recompute your patch from it"
                ),
            }
        })
        .collect()
}

fn pointer_text(pointer: &Pointer) -> String {
    pointer.to_string()
}
