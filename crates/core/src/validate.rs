//! The validation pipeline (step 3 of docs/concepts.md, "How a step works"): parse (strict JSON) → patch
//! shape → apply to a copy → read-only locations → schema → state budget → action. The current
//! state is never modified; the caller gets either everything needed to commit, or every problem
//! found.
//!
//! Read-only-ness is decided after the patch is applied, by the schema's own evaluation of the
//! state before and after (`StateSchema::changed_read_only_locations`): any location annotated
//! `readOnly` in either whose value differs is refused, whatever kind of patch changed it. It
//! comes before the schema check, so a write to a read-only field is reported as `read_only`
//! even when the new state also breaks the schema (whose failed evaluation drops every
//! annotation; the old state's still count).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::state_hash;
use crate::output::{ParsedOutput, RawAction, parse_output};
use crate::patch::StatePatch;
use crate::schema::{StateSchema, WriteCheck};
use crate::schema_problem::ReaderView;
use crate::tokens::count_tokens;
use crate::tool::{ASK_USER, FINISH, ToolCatalog};

/// Which check a rejection comes from, in pipeline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    Parse,
    PatchShape,
    PatchApply,
    ReadOnly,
    Schema,
    StateBudget,
    UnknownTool,
    ToolArgs,
    /// A board patch writes a location outside its skill's `[board] writes`.
    OutsideWriteScope,
    /// A board patch copies or tests a location outside its skill's `[board] reads`.
    OutsideReadScope,
    /// A board patch meets another writer's commit since the version it was computed on
    /// (`board::rebase`); the answer is recomputed from the fresh values.
    BoardConflict,
}

impl RejectionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectionKind::Parse => "parse",
            RejectionKind::PatchShape => "patch_shape",
            RejectionKind::PatchApply => "patch_apply",
            RejectionKind::ReadOnly => "read_only",
            RejectionKind::Schema => "schema",
            RejectionKind::StateBudget => "state_budget",
            RejectionKind::UnknownTool => "unknown_tool",
            RejectionKind::ToolArgs => "tool_args",
            RejectionKind::OutsideWriteScope => "outside_write_scope",
            RejectionKind::OutsideReadScope => "outside_read_scope",
            RejectionKind::BoardConflict => "board_conflict",
        }
    }
}

/// Which document a rejection's pointer points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Document {
    /// The model's output object (`/state_patch/...`, `/action/args/...`).
    Output,
    /// The state as it would be after the patch.
    State,
}

/// One reason a model output was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub document: Document,
    pub pointer: String,
    pub message: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let doc = match self.document {
            Document::Output => "output",
            Document::State => "state",
        };
        let place = if self.pointer.is_empty() {
            crate::json::pointer_for_humans("", doc)
        } else {
            format!("{doc} {}", self.pointer)
        };
        write!(f, "[{}] {place}: {}", self.kind.as_str(), self.message)
    }
}

/// The action of an accepted step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Tool { name: String, args: Value },
    Finish { result: Value },
    AskUser { question: String },
}

impl Action {
    /// The `{tool, args}` form the model used, which is also how the journal stores it.
    pub fn to_call_json(&self) -> Value {
        match self {
            Action::Tool { name, args } => serde_json::json!({"tool": name, "args": args}),
            Action::Finish { result } => {
                serde_json::json!({"tool": FINISH, "args": {"result": result}})
            }
            Action::AskUser { question } => {
                serde_json::json!({"tool": ASK_USER, "args": {"question": question}})
            }
        }
    }

    pub fn from_call_json(value: &Value) -> Option<Action> {
        let name = value.get("tool")?.as_str()?;
        let args = value
            .get("args")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        Some(Self::from_raw(name, args))
    }

    fn from_raw(name: &str, args: Value) -> Action {
        match name {
            FINISH => Action::Finish {
                result: args.get("result").cloned().unwrap_or(Value::Null),
            },
            ASK_USER => Action::AskUser {
                question: args
                    .get("question")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            },
            _ => Action::Tool {
                name: name.to_owned(),
                args,
            },
        }
    }

    /// Short human form: `ship(item=item_1, shelf=shelf_4)`.
    pub fn summary(&self) -> String {
        let (name, args) = match self {
            Action::Tool { name, args } => (name.as_str(), args.clone()),
            Action::Finish { result } => (FINISH, serde_json::json!({"result": result})),
            Action::AskUser { question } => (ASK_USER, serde_json::json!({"question": question})),
        };
        let rendered: Vec<String> = match &args {
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect(),
            Value::Null => Vec::new(),
            other => vec![other.to_string()],
        };
        format!("{name}({})", rendered.join(", "))
    }
}

/// Everything the pipeline checks against.
pub struct StepRules<'a> {
    pub schema: &'a StateSchema,
    pub catalog: &'a ToolCatalog,
    pub state_token_budget: usize,
}

/// An output that passed every check: ready to commit.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedStep {
    pub reasoning: String,
    pub patch: StatePatch,
    pub action: Action,
    pub new_state: Value,
    pub state_hash: String,
    /// The new state's size in o200k_base tokens of its compact JSON; `None` when it was not
    /// counted because its byte length already fits the state budget.
    pub state_tokens: Option<usize>,
    /// The board's part of the answer of a task attached to a board (`board::step`).
    pub board: Option<crate::board::BoardChange>,
}

/// An output that failed: every problem found, and what could be parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedStep {
    pub parsed: Option<Box<ParsedOutput>>,
    pub rejections: Vec<Rejection>,
}

/// The first check of every answer: its outer shape, or a `parse` rejection.
pub(crate) fn parse_answer(raw_output: &str) -> Result<ParsedOutput, RejectedStep> {
    parse_output(raw_output).map_err(|problem| RejectedStep {
        parsed: None,
        rejections: vec![Rejection {
            kind: RejectionKind::Parse,
            document: Document::Output,
            pointer: problem.pointer,
            message: problem.message,
        }],
    })
}

/// Runs the whole pipeline on one raw model output. `state` is only read.
pub fn validate_step(
    rules: &StepRules<'_>,
    state: &Value,
    raw_output: &str,
) -> Result<AcceptedStep, RejectedStep> {
    let parsed = parse_answer(raw_output)?;
    let mut rejections = Vec::new();
    let patched = check_patch(rules, state, &parsed.state_patch, &mut rejections);
    let action = check_action(rules.catalog, &parsed.action, &mut rejections);
    match (patched, action) {
        (Some((patch, new_state, state_tokens)), Some(action)) if rejections.is_empty() => {
            Ok(AcceptedStep {
                reasoning: parsed.reasoning,
                patch,
                action,
                state_hash: state_hash(&new_state),
                new_state,
                state_tokens,
                board: None,
            })
        }
        _ => Err(RejectedStep {
            parsed: Some(Box::new(parsed)),
            rejections,
        }),
    }
}

/// A state patch written by someone other than the model (an API client, an operator) that
/// passed the same checks a model's `state_patch` must pass.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedPatch {
    pub patch: StatePatch,
    pub new_state: Value,
    pub state_hash: String,
}

/// Runs the state half of the pipeline — patch shape, application, read-only locations,
/// schema, state budget — on a patch given directly (an RFC 7396 merge patch object or an RFC
/// 6902 operation array). Pointers in rejections point into the patch itself (`/0/path`) or
/// into the new state, exactly as for a model's answer minus the `/state_patch` prefix.
/// Schema problems are rendered for `reader`, the one the rejections are for
/// ([`StateSchema::whole_view`], or [`StateSchema::view_of`] its reads).
pub fn validate_patch(
    schema: &StateSchema,
    state_token_budget: usize,
    state: &Value,
    patch: &Value,
    reader: &ReaderView<'_>,
) -> Result<AcceptedPatch, Vec<Rejection>> {
    let mut rejections = Vec::new();
    match check_patch_with(
        schema,
        state_token_budget,
        state,
        patch,
        "",
        reader,
        &mut rejections,
    ) {
        Some((patch, new_state, _)) if rejections.is_empty() => Ok(AcceptedPatch {
            patch,
            state_hash: state_hash(&new_state),
            new_state,
        }),
        _ => Err(rejections),
    }
}

fn check_patch(
    rules: &StepRules<'_>,
    state: &Value,
    raw_patch: &Value,
    rejections: &mut Vec<Rejection>,
) -> Option<(StatePatch, Value, Option<usize>)> {
    check_patch_with(
        rules.schema,
        rules.state_token_budget,
        state,
        raw_patch,
        "/state_patch",
        &rules.schema.whole_view(),
        rejections,
    )
}

pub(crate) fn check_patch_with(
    schema: &StateSchema,
    state_token_budget: usize,
    state: &Value,
    raw_patch: &Value,
    prefix: &str,
    reader: &ReaderView<'_>,
    rejections: &mut Vec<Rejection>,
) -> Option<(StatePatch, Value, Option<usize>)> {
    let patch = match StatePatch::from_value(raw_patch) {
        Ok(patch) => patch,
        Err(problem) => {
            rejections.push(Rejection {
                kind: RejectionKind::PatchShape,
                document: Document::Output,
                pointer: format!("{prefix}{}", problem.pointer),
                message: problem.message,
            });
            return None;
        }
    };

    let new_state = match patch.apply(state) {
        Ok(next) => next,
        Err(problem) => {
            rejections.push(Rejection {
                kind: RejectionKind::PatchApply,
                document: Document::State,
                pointer: problem.pointer,
                message: problem.message,
            });
            return None;
        }
    };

    match schema.check_write(state, &new_state) {
        WriteCheck::Fine => {}
        WriteCheck::ReadOnly(hits) => {
            for pointer in named_once(hits, reader) {
                rejections.push(Rejection {
                    kind: RejectionKind::ReadOnly,
                    document: Document::State,
                    message: format!(
                        "{} is read-only (owned by the runtime or the user); leave it, and everything inside it, out of state_patch",
                        crate::json::pointer_for_humans(&pointer, "state")
                    ),
                    pointer,
                });
            }
            return None;
        }
        WriteCheck::Invalid(problems) => {
            rejections.extend(schema_rejections(
                &problems,
                reader,
                "the state",
                "the schema",
            ));
            return None;
        }
    }

    // A token is at least one byte: a state whose compact JSON fits the budget in bytes is
    // not counted (counting the whole state at every step dominated validation).
    let compact = serde_json::to_string(&new_state).unwrap_or_default();
    let state_tokens = (compact.len() > state_token_budget).then(|| count_tokens(&compact));
    if let Some(state_tokens) = state_tokens.filter(|t| *t > state_token_budget) {
        rejections.push(Rejection {
            kind: RejectionKind::StateBudget,
            document: Document::State,
            pointer: String::new(),
            message: format!(
                "the new state would be {state_tokens} tokens, over the budget of {}; keep only what the procedure needs (null deletes a key)",
                state_token_budget
            ),
        });
        return None;
    }
    Some((patch, new_state, state_tokens))
}

/// Each location as far as `reader` may name it, each once, in order.
pub(crate) fn named_once(locations: Vec<String>, reader: &ReaderView<'_>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for location in locations {
        let named = reader.nameable(&location);
        if !out.contains(&named) {
            out.push(named);
        }
    }
    out
}

/// A `schema` rejection for each problem, rendered for `reader`: "after the patch {document}
/// breaks {schema}: …". Problems that read the same to this reader are reported once.
pub fn schema_rejections(
    problems: &[crate::SchemaProblem],
    reader: &ReaderView<'_>,
    document: &str,
    schema: &str,
) -> Vec<Rejection> {
    let mut out: Vec<Rejection> = Vec::new();
    for problem in problems {
        let shown = problem.render(reader);
        let rejection = Rejection {
            kind: RejectionKind::Schema,
            document: Document::State,
            message: format!(
                "after the patch {document} breaks {schema}: {}",
                shown.message
            ),
            pointer: shown.pointer,
        };
        if !out.contains(&rejection) {
            out.push(rejection);
        }
    }
    out
}

pub(crate) fn check_action(
    catalog: &ToolCatalog,
    raw: &RawAction,
    rejections: &mut Vec<Rejection>,
) -> Option<Action> {
    match catalog.check_args(&raw.tool, &raw.args) {
        None => {
            rejections.push(Rejection {
                kind: RejectionKind::UnknownTool,
                document: Document::Output,
                pointer: "/action/tool".into(),
                message: format!(
                    "no tool named \"{}\"; available: {}",
                    raw.tool,
                    catalog.names().join(", ")
                ),
            });
            None
        }
        Some(problems) if !problems.is_empty() => {
            for problem in problems {
                rejections.push(Rejection {
                    kind: RejectionKind::ToolArgs,
                    document: Document::Output,
                    pointer: format!("/action/args{}", problem.pointer),
                    message: format!("bad argument for {}: {}", raw.tool, problem.message),
                });
            }
            None
        }
        Some(_) => Some(Action::from_raw(&raw.tool, raw.args.clone())),
    }
}
