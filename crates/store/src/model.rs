//! The records the store keeps.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use skillstate_core::{ContextStrategy, SkillDefinition, ToolSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Running,
    Completed,
    Failed,
    AwaitingInput,
    /// An action waits for a human's approval before it runs.
    AwaitingApproval,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::AwaitingInput => "awaiting_input",
            TaskStatus::AwaitingApproval => "awaiting_approval",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => TaskStatus::Running,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "awaiting_input" => TaskStatus::AwaitingInput,
            "awaiting_approval" => TaskStatus::AwaitingApproval,

            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed)
    }
}

/// What a new task starts from.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub skill: SkillDefinition,
    pub tools: Vec<ToolSpec>,
    pub context: ContextStrategy,
    pub context_budget: Option<usize>,
    pub model: String,
    pub environment: Option<Value>,
    pub env_checkpoint: Option<Value>,
    /// The observation step 1 starts from.
    pub opening_observation: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub id: String,
    pub skill: SkillDefinition,
    pub tools: Vec<ToolSpec>,
    pub context: ContextStrategy,
    pub context_budget: Option<usize>,
    pub model: String,
    pub environment: Option<Value>,
    pub env_checkpoint: Option<Value>,
    /// The step whose action result `env_checkpoint` includes; `None` when it includes the
    /// last one (written before checkpoints could be sparse, or not written since creation).
    /// The runtime replays the recorded actions of the steps after it.
    pub env_checkpoint_step: Option<u64>,
    pub status: TaskStatus,
    pub state: Value,
    /// Number of accepted steps; the next step is `version + 1`.
    pub version: u64,
    pub outcome: Option<Value>,
    pub parent: Option<(String, u64)>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The tenant that owns the task (`Tenancy`); `None` for tasks created outside the
    /// service.
    pub tenant: Option<String>,
    /// The task's labels as given at creation (`TaskOwner::labels`, `QueuedTask::labels`; a
    /// fork carries its parent's); empty when it has none.
    pub labels: Map<String, Value>,
    /// An upgrade asked for while the task waited on an action (`Tasks::schedule_upgrade`):
    /// the runner applies it right after the action is settled.
    pub upgrade_to: Option<ScheduledUpgrade>,
}

/// A skill version a task moves to once its waiting action is settled, and who asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledUpgrade {
    pub hash: String,
    pub author: String,
}

/// What reading and writing a task's state needs of the task (`Tasks::task_state`): its state,
/// version, status and tenant, and its skill's state schema and state budget — not the
/// procedure, the tools or the rest of the record.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskState {
    pub id: String,
    pub tenant: Option<String>,
    pub status: TaskStatus,
    /// Number of accepted steps.
    pub version: u64,
    pub state: Value,
    /// The skill's state schema, frozen with the task (shared by reads of the same task).
    pub schema: std::sync::Arc<Value>,
    /// The skill's state budget (`budgets.state_tokens`).
    pub state_tokens: usize,
}

impl TaskState {
    pub fn of(task: &TaskRecord) -> Self {
        Self {
            id: task.id.clone(),
            tenant: task.tenant.clone(),
            status: task.status,
            version: task.version,
            state: task.state.clone(),
            schema: std::sync::Arc::new(task.skill.schema.clone()),
            state_tokens: task.skill.settings.budgets.state_tokens,
        }
    }
}

/// One line of `skillstate tasks`. A row that cannot be read whole still lists: `status` is
/// `None` and `problem` says what is unreadable, so one bad row never hides the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSummary {
    pub id: String,
    pub skill_name: String,
    pub status: Option<TaskStatus>,
    pub problem: Option<String>,
    pub version: u64,
    pub model: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// The task's labels (empty when it has none); `None` from a listing that does not read
    /// them (`Tasks::list_tasks`, which also reads databases from before labels existed).
    pub labels: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Accepted,
    Rejected,
}

/// One model answer in the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    pub step: u64,
    pub attempt: u32,
    pub verdict: Verdict,
    pub output: String,
    pub patch: Option<Value>,
    pub action: Option<Value>,
    pub errors: Option<Value>,
    pub state_hash: Option<String>,
    pub prompt_tokens: u64,
    /// The answer's length in o200k_base tokens, counted when it was written; `None` on rows
    /// from before the count was stored.
    pub output_tokens: Option<u64>,
    pub prompt_hash: String,
    pub usage: Option<Value>,
    pub latency_ms: u64,
    pub created_at: i64,
    /// Who wrote this step: `None` = the model; an API key id for state written through the
    /// service.
    pub author: Option<String>,
    /// For a task attached to a board: the board version its prompt showed (`Boards`), so the
    /// attempt's exact prompt can be rebuilt; `None` for tasks without a board.
    pub board_version: Option<u64>,
}

/// The observation a step without an action leaves for the step after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextObservation {
    /// This text.
    Text(String),
    /// The observation this step would have started from (the one stored for step
    /// `expected_version + 1`), carried over to the next step by the store inside the commit,
    /// with `note` added once: the text unchanged when it already ends with `note`, `note`
    /// alone when there is none. Read where it is written, so a message delivered into it just
    /// before is carried too, and the caller reads nothing.
    Carried { note: String },
}

/// An action about to run; written in the same transaction as its step.
#[derive(Debug, Clone, PartialEq)]
pub struct NewIntent {
    pub tool: String,
    pub args: Value,
    pub idempotency_key: String,
    pub side_effect: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IntentRecord {
    pub step: u64,
    pub tool: String,
    pub args: Value,
    pub idempotency_key: String,
    pub side_effect: String,
    pub done: bool,
    pub ok: Option<bool>,
    pub result: Option<String>,
}

/// How a recorded action ended, as reports count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionOutcome {
    /// Committed, no result recorded yet.
    Pending,
    Succeeded,
    /// The tool returned an error: a tool error.
    Failed,
    /// A crash left it unknown whether it ran (`ActionResult::outcome_unknown`): its own
    /// figure, never a tool error.
    Unknown,
}

impl IntentRecord {
    pub fn outcome(&self) -> ActionOutcome {
        match (self.done, self.ok) {
            (false, _) => ActionOutcome::Pending,
            (true, Some(true)) => ActionOutcome::Succeeded,
            (true, Some(false)) => ActionOutcome::Failed,
            (true, None) => ActionOutcome::Unknown,
        }
    }
}

/// Everything an accepted step writes, in one transaction.
#[derive(Debug, Clone)]
pub struct StepCommit {
    pub entry: JournalEntry,
    pub new_state: Value,
    pub intent: Option<NewIntent>,
    /// Set when the step ends the task (finish) or pauses it (ask_user).
    pub status: Option<(TaskStatus, Option<Value>)>,
    /// The previous step's action result, written first in the same transaction. A runner
    /// may hold back the result of a read-only or idempotent tool until its next commit (a
    /// crash in between leaves that intent pending, and resuming runs such a tool again), so
    /// a step costs one durable write instead of two.
    pub previous_result: Option<ActionResult>,
    /// The observation the next step starts from, for a step with no action to produce one
    /// (state written through the service carries the task's pending observation over).
    pub next_observation: Option<NextObservation>,
    /// The environment's checkpoint as of the previous step's result (`expected_version`),
    /// for a step that stops or pauses the task, so that a stopped task's stored world is its
    /// last one; `None` leaves the stored checkpoint as it is.
    pub world: Option<Value>,
    /// For a step that moves the task to another version of its skill (an upgrade): that
    /// version, stored once (`skill_versions`), run from this step on.
    pub upgrade: Option<SkillChange>,
}

/// What a write under a lease (`Leases::write_under_lease`) reports back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// The board's new version, for a step with a board write.
    pub board_version: Option<u64>,
    /// For a step: whether messages waited in the task's inbox when it was committed, where
    /// the store learned it in the commit itself (PostgreSQL's one-statement step); `None`:
    /// not known, read the inbox. A runner that was told `Some(false)` need not read the inbox
    /// before its next step: a message that arrives after the commit is shown one step later,
    /// exactly as one arriving during the next model call would be.
    pub messages_waiting: Option<bool>,
}

impl Written {
    /// A write that reports only a board's version (`None` for a write without a board).
    pub fn board(board_version: Option<u64>) -> Self {
        Self {
            board_version,
            messages_waiting: None,
        }
    }
}

/// A skill version a task ran (`Tasks::task_versions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskVersion {
    /// The first step that ran on it (0: the version the task was created with).
    pub from_step: u64,
    pub hash: String,
    /// skill.toml's `version`, when it has one.
    pub version: Option<String>,
}

/// A stored skill version (`Tasks::skill_versions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillVersionSummary {
    pub hash: String,
    pub name: String,
    pub version: Option<String>,
    pub created_at: i64,
    /// Tasks that run it now.
    pub tasks: u64,
    /// Tasks that ran it and moved to another version since.
    pub former_tasks: u64,
    /// Bytes of its skill and tools texts.
    pub bytes: u64,
}

/// The skill version a task moves to with a step (`StepCommit::upgrade`): its skill and the
/// tools as presented to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillChange {
    pub skill: SkillDefinition,
    pub tools: Vec<ToolSpec>,
}

/// What a finished tool call writes, in one transaction.
#[derive(Debug, Clone)]
pub struct ActionResult {
    pub step: u64,
    pub ok: bool,
    /// The action's outcome is unknown (the runtime stopped between committing it and
    /// recording its result, and the action is not one to repeat): stored with `ok` NULL,
    /// so reports count it as its own figure ("outcome unknown"), not as a tool error.
    pub outcome_unknown: bool,
    pub result: String,
    /// The observation the next step starts from.
    pub next_observation: String,
    /// The environment's checkpoint after this result, or `None` to keep the stored one
    /// (a replayable world between its checkpoints: the journal's actions are its changes).
    pub env_checkpoint: Option<Value>,
    /// Inbox entries (`Inbox`) this result delivers — the decision it carries out, messages
    /// its observation shows —, marked delivered at `step + 1` in the same transaction.
    pub delivered: Vec<i64>,
}

/// A runner asking for a task's execution lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    /// Unique per runner; whoever holds this token holds the lease.
    pub token: String,
    /// Who is asking, for people: the command, its pid and host.
    pub holder: String,
    /// A machine-checkable identity of the process, so that a process of the same machine can
    /// tell that the holder no longer exists.
    pub process: String,
}

/// Who holds a task's execution lease, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    pub token: String,
    pub holder: String,
    pub process: String,
    /// Unix milliseconds.
    pub acquired_at: i64,
    /// Unix milliseconds; after this instant any runner may take the task over.
    pub expires_at: i64,
}

/// Where a task's accepted steps start and end in the journal, and how many there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalExtent {
    /// Accepted journal rows.
    pub accepted: u64,
    /// Lowest and highest accepted step, when there is any.
    pub first: Option<u64>,
    pub last: Option<u64>,
    /// The state hash recorded by the highest accepted step.
    pub last_hash: Option<String>,
    /// The oldest snapshot's step (0 unless gc compacted the journal).
    pub base: Option<u64>,
}
