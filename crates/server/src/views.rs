//! What the API answers with: the JSON representations of tasks, steps and pages, each
//! described in the OpenAPI document. Times are RFC 3339 UTC with whole seconds. Whatever
//! carries a state, a patch or text derived from them is built through the task's
//! [`Redaction`] (write-only values never leave).

mod boards;
mod recall;
mod redaction;

pub use boards::*;
pub use recall::*;
pub(crate) use redaction::{BoardHistory, Redaction, shown_state};

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use skillstate_providers::{Price, Usage};
use skillstate_store::{
    IntentRecord, JournalEntry, TaskRecord, TaskStatus, TaskSummary, TaskTotals, Verdict, time,
};
use utoipa::ToSchema;

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusName {
    Running,
    Completed,
    Failed,
    AwaitingInput,
    AwaitingApproval,
}

impl StatusName {
    pub fn of(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Running => StatusName::Running,
            TaskStatus::Completed => StatusName::Completed,
            TaskStatus::Failed => StatusName::Failed,
            TaskStatus::AwaitingInput => StatusName::AwaitingInput,
            TaskStatus::AwaitingApproval => StatusName::AwaitingApproval,
        }
    }

    pub fn status(self) -> TaskStatus {
        match self {
            StatusName::Running => TaskStatus::Running,
            StatusName::Completed => TaskStatus::Completed,
            StatusName::Failed => TaskStatus::Failed,
            StatusName::AwaitingInput => TaskStatus::AwaitingInput,
            StatusName::AwaitingApproval => TaskStatus::AwaitingApproval,
        }
    }
}

/// `2026-11-30T17:02:11Z`.
pub fn rfc3339(millis: i64) -> String {
    time::utc(millis).replacen(' ', "T", 1)
}

/// A task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    pub id: String,
    /// The skill's name.
    pub skill: String,
    pub model: String,
    /// The context strategy.
    pub context: String,
    pub status: StatusName,
    /// Accepted steps so far; the state's version (its ETag).
    pub version: u64,
    /// Why the task ended or paused (`{"reason": ...}`), when it did (write-only values of
    /// the state replaced by `[redacted]`).
    pub outcome: Option<Value>,
    /// The task this one was forked from, and at which step.
    pub parent: Option<ForkOrigin>,
    /// The labels given at creation (`{}` when none).
    pub labels: BTreeMap<String, String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Tokens and cost so far, summed over every answer in the journal.
    pub totals: Totals,
    /// The version of its skill the task runs now.
    pub skill_version: SkillVersionView,
    /// Every version the task ran, with the step each began at (0: created on it; an upgrade
    /// is the step that moved it), oldest first.
    pub skill_versions: Vec<TaskVersionView>,
    /// The version an upgrade will move the task to once its waiting action is settled
    /// (approve, reject, reply), by content hash; `null` when none is scheduled.
    pub upgrade_scheduled: Option<String>,
}

/// A version of a skill: its content hash (SHA-256 of everything that shapes a prompt or a
/// check) and skill.toml's `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SkillVersionView {
    #[schema(example = "a3068fa4228f0c…")]
    pub hash: String,
    /// skill.toml's `version`, when it has one.
    #[schema(example = "2.0.0")]
    pub version: Option<String>,
}

impl SkillVersionView {
    pub fn of(name: skillstate_runtime::upgrade::VersionName) -> Self {
        Self {
            hash: name.hash,
            version: name.version,
        }
    }
}

/// A version a task ran, from a step on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TaskVersionView {
    /// The first step rendered with it (0: the version the task was created with).
    pub from_step: u64,
    pub hash: String,
    pub version: Option<String>,
}

/// A task's tokens and cost so far, summed over every answer of its journal (rejected answers
/// too: they were paid for).
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct Totals {
    /// Answers the model gave, accepted or rejected.
    pub answers: u64,
    /// Prompt tokens, counted locally (o200k_base).
    pub prompt_tokens: u64,
    /// Answer tokens, counted locally (answers from before they were counted add nothing).
    pub output_tokens: u64,
    /// What the provider reported; `null` when it reported no usage for any answer.
    pub reported: Option<ReportedTokens>,
    /// Estimated cost in US dollars of the reported tokens, at the price configured for the
    /// task's model (`[prices."<model>"]` in skillstate.toml, as `skillstate batch report`
    /// computes it); `null` when no price is configured for the model.
    pub cost_usd: Option<f64>,
}

/// Token counts a provider reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReportedTokens {
    /// Answers whose usage the provider reported.
    pub answers: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Totals {
    /// The totals of a task of `model` from its journal figures (`None`: no answer yet).
    pub fn of(totals: Option<&TaskTotals>, price: Option<&Price>) -> Self {
        let figures = totals.copied().unwrap_or_default();
        let reported = (figures.reported_answers > 0).then_some(ReportedTokens {
            answers: figures.reported_answers,
            input_tokens: figures.input_tokens_reported,
            output_tokens: figures.output_tokens_reported,
        });
        Self {
            answers: figures.answers,
            prompt_tokens: figures.prompt_tokens,
            output_tokens: figures.output_tokens,
            reported,
            cost_usd: price.map(|price| {
                price.cost(&Usage {
                    input_tokens: figures.input_tokens_reported,
                    output_tokens: figures.output_tokens_reported,
                    ..Usage::default()
                })
            }),
        }
    }
}

/// Labels as shown: the stored JSON object's string values as they are. Tasks created through
/// the service have only those; a value of another kind (a task made elsewhere, `line` of a
/// batch input) is shown as its JSON text.
fn shown_labels(labels: &Map<String, Value>) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(name, value)| {
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            (name.clone(), text)
        })
        .collect()
}

/// Where a forked task came from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkOrigin {
    pub task: String,
    pub step: u64,
}

impl TaskView {
    /// The task as shown; its outcome (a finish result, the arguments of an action waiting
    /// for approval, rejection messages) cleaned of the state's write-only values.
    pub fn of(task: &TaskRecord) -> Self {
        let outcome = task
            .outcome
            .clone()
            .map(|outcome| Redaction::of_task(task).json(outcome));
        let version = skillstate_runtime::upgrade::version_name(&task.skill, &task.tools);
        Self {
            id: task.id.clone(),
            skill: task.skill.name.clone(),
            model: task.model.clone(),
            context: task.context.as_str().to_owned(),
            status: StatusName::of(task.status),
            version: task.version,
            outcome,
            parent: task.parent.as_ref().map(|(task, step)| ForkOrigin {
                task: task.clone(),
                step: *step,
            }),
            labels: shown_labels(&task.labels),
            created_at: rfc3339(task.created_at),
            updated_at: rfc3339(task.updated_at),
            totals: Totals::default(),
            skill_version: SkillVersionView::of(version.clone()),
            skill_versions: vec![TaskVersionView {
                from_step: 0,
                hash: version.hash,
                version: version.version,
            }],
            upgrade_scheduled: task.upgrade_to.as_ref().map(|u| u.hash.clone()),
        }
    }

    /// With its totals.
    pub fn with_totals(mut self, totals: Totals) -> Self {
        self.totals = totals;
        self
    }

    /// With the versions it ran (`Tasks::task_versions`; a task that never changed version
    /// has the one it runs, from step 0).
    pub fn with_versions(mut self, versions: Vec<skillstate_store::TaskVersion>) -> Self {
        if !versions.is_empty() {
            self.skill_versions = versions
                .into_iter()
                .map(|v| TaskVersionView {
                    from_step: v.from_step,
                    hash: v.hash,
                    version: v.version,
                })
                .collect();
        }
        self
    }
}

/// One task of a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskListItem {
    pub id: String,
    pub skill: String,
    pub model: String,
    /// `null` when the stored row cannot be read (`problem` says why).
    pub status: Option<StatusName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub version: u64,
    /// The labels given at creation (`{}` when none).
    pub labels: BTreeMap<String, String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Tokens and cost so far, summed over every answer in the journal.
    pub totals: Totals,
}

impl TaskListItem {
    pub fn of(task: &TaskSummary, totals: Totals) -> Self {
        Self {
            id: task.id.clone(),
            skill: task.skill_name.clone(),
            model: task.model.clone(),
            status: task.status.map(StatusName::of),
            // The store's reason names a column; say only that the row is unreadable.
            problem: task
                .problem
                .as_ref()
                .map(|_| "the stored task row is unreadable".to_owned()),
            version: task.version,
            labels: task.labels.as_ref().map(shown_labels).unwrap_or_default(),
            created_at: rfc3339(task.created_at),
            updated_at: rfc3339(task.updated_at),
            totals,
        }
    }
}

/// A page of tasks, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskPage {
    pub tasks: Vec<TaskListItem>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A created (or, for a repeated Idempotency-Key, the earlier) task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedTask {
    /// `false` when the Idempotency-Key was used before and this is the task it created.
    pub created: bool,
    pub task: TaskView,
}

/// The tasks of a batch create, in request order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchCreated {
    /// The batch the tasks are in (`GET /v1/batches/{id}`).
    pub batch: Option<String>,
    pub tasks: Vec<CreatedTask>,
}

/// Who wrote an accepted step or answer.
pub fn author_of(entry: &JournalEntry) -> Option<String> {
    entry.author.clone()
}

fn verdict_name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Accepted => "accepted",
        Verdict::Rejected => "rejected",
    }
}

/// One step of a task, in a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StepSummary {
    pub step: u64,
    /// `accepted` once an answer was accepted (the step is committed), else `rejected`.
    pub verdict: String,
    /// Answers in this step, rejected ones included.
    pub answers: u32,
    /// The accepted (else the last) answer's action, as `{"tool", "args"}` (write-only values
    /// replaced by `[redacted]`).
    pub action: Option<Value>,
    /// `null` for the model; the API key id for state written through the API.
    pub author: Option<String>,
    pub prompt_tokens: u64,
    pub output_tokens: Option<u64>,
    pub latency_ms: u64,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl StepSummary {
    /// The summary of one step's answers (non-empty, in attempt order).
    pub(crate) fn of(answers: &[&JournalEntry], redaction: &Redaction) -> Option<Self> {
        let last = answers.last()?;
        let accepted = answers.iter().find(|e| e.verdict == Verdict::Accepted);
        let shown = accepted.unwrap_or(last);
        Some(Self {
            step: shown.step,
            verdict: verdict_name(if accepted.is_some() {
                Verdict::Accepted
            } else {
                Verdict::Rejected
            })
            .to_owned(),
            answers: answers.len() as u32,
            action: shown.action.clone().map(|a| redaction.json(a)),
            author: author_of(shown),
            prompt_tokens: shown.prompt_tokens,
            output_tokens: shown.output_tokens,
            latency_ms: shown.latency_ms,
            created_at: rfc3339(shown.created_at),
        })
    }
}

/// A page of steps, in step order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StepPage {
    pub steps: Vec<StepSummary>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// One answer of a step, as journaled.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AnswerView {
    pub attempt: u32,
    /// `accepted` or `rejected`.
    pub verdict: String,
    /// The answer as the model wrote it (reasoning included; secrets already redacted, and
    /// write-only values of the state replaced by `[redacted]`).
    pub output: String,
    /// The state patch (RFC 7396 merge patch or RFC 6902 operations); the values it writes
    /// at write-only locations read `[redacted]`.
    pub patch: Option<Value>,
    /// The action, as `{"tool", "args"}`.
    pub action: Option<Value>,
    /// Why a rejected answer was rejected: `[{kind, document, pointer, message}]`.
    pub errors: Option<Value>,
    /// SHA-256 of the state after an accepted answer; `null` while the task holds write-only
    /// values (a hash would let short ones be guessed).
    pub state_hash: Option<String>,
    /// SHA-256 of the prompt the model received; `null` while the task holds write-only
    /// values.
    pub prompt_hash: Option<String>,
    /// The prompt, in o200k_base tokens counted locally.
    pub prompt_tokens: u64,
    /// The answer, in o200k_base tokens (`null` on rows from before it was counted).
    pub output_tokens: Option<u64>,
    /// What the provider reported (input, output, cached tokens), if anything.
    pub usage: Option<Value>,
    pub latency_ms: u64,
    /// `null` for the model; the API key id for state written through the API.
    pub author: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl AnswerView {
    pub(crate) fn of(entry: &JournalEntry, redaction: &Redaction) -> Self {
        let hashes = !redaction.hides_values();
        Self {
            attempt: entry.attempt,
            verdict: verdict_name(entry.verdict).to_owned(),
            output: redaction.text(entry.output.clone()),
            patch: entry.patch.clone().map(|p| redaction.patch(p)),
            action: entry.action.clone().map(|a| redaction.json(a)),
            errors: entry.errors.clone().map(|e| redaction.json(e)),
            state_hash: entry.state_hash.clone().filter(|_| hashes),
            prompt_hash: Some(entry.prompt_hash.clone()).filter(|_| hashes),
            prompt_tokens: entry.prompt_tokens,
            output_tokens: entry.output_tokens,
            usage: entry.usage.clone(),
            latency_ms: entry.latency_ms,
            author: author_of(entry),
            created_at: rfc3339(entry.created_at),
        }
    }
}

/// The action an accepted step committed, and its result once recorded.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntentView {
    pub tool: String,
    pub args: Value,
    /// `read_only`, `idempotent` or `effectful` (the tool's side-effect class).
    pub side_effect: String,
    /// `<task>:<step>`, passed to the tool.
    pub idempotency_key: String,
    /// Whether the result is recorded; `false` while the action runs or waits (approval, a
    /// reply).
    pub done: bool,
    pub ok: Option<bool>,
    /// The tool's result: the next step's observation.
    pub result: Option<String>,
}

impl IntentView {
    pub(crate) fn of(intent: &IntentRecord, redaction: &Redaction) -> Self {
        Self {
            tool: intent.tool.clone(),
            args: redaction.json(intent.args.clone()),
            side_effect: intent.side_effect.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            done: intent.done,
            ok: intent.ok,
            result: intent.result.clone().map(|r| redaction.text(r)),
        }
    }
}

/// One step in full.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StepDetail {
    pub step: u64,
    /// The observation the step started from, in full (prompts show it cut to the budget);
    /// write-only values of the state read `[redacted]`.
    pub observation: Option<String>,
    /// The accepted answer; `null` while the step is not committed.
    pub accepted: Option<AnswerView>,
    /// The rejected answers, in attempt order.
    pub rejected: Vec<AnswerView>,
    /// The committed action and its result.
    pub intent: Option<IntentView>,
}

/// A prompt rebuilt from the journal.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptView {
    pub step: u64,
    pub attempt: u32,
    /// The prompt's exact text — but for the state's write-only values, which the model saw
    /// and which read `[redacted]` here.
    pub text: String,
    /// SHA-256 of the prompt; `null` when write-only values were replaced in `text` (a hash
    /// would let short ones be guessed).
    pub sha256: Option<String>,
    /// SHA-256 recorded when the model received the prompt; `null` as `sha256` is.
    pub recorded_sha256: Option<String>,
    /// Whether the rebuilt prompt is byte-identical to what the model received (checked on
    /// the prompt itself, before any replacement).
    pub identical: bool,
    /// The prompt's o200k_base tokens, as counted when the model received it.
    pub tokens: u64,
}

/// Health and readiness.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}
