//! The step writes of the group-commit writer: accepted steps, rejections, tool results and
//! statuses, each with its events (`service.rs`) in the same savepoint.

use rusqlite::{Connection, OptionalExtension, params};
use skillstate_core::json::state_hash;

use super::ops::OpResult;
use crate::StoreError;
use crate::model::*;
use crate::recall_rows::{IndexEntry, recall_entries};
use crate::rows::{to_json, verdict_str};
use crate::service_rows::{OldStatus, action_data, rejected_data, status_data, step_data};
use crate::spec_texts::SpecTexts;

/// Appends one event of `task`, with the task's tenant and current version.
pub(super) fn insert_event(
    conn: &Connection,
    task: &str,
    kind: &str,
    data: &str,
    now: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
         SELECT id, tenant, ?1, version, ?2, ?3 FROM tasks WHERE id = ?4",
    )?
    .execute(params![kind, data, now, task])?;
    Ok(())
}

/// The task's status and outcome before a status write; `None` when there is no such task.
fn old_status(conn: &Connection, task: &str) -> rusqlite::Result<Option<OldStatus>> {
    conn.prepare_cached("SELECT status, outcome FROM tasks WHERE id = ?")?
        .query_row([task], |row| {
            Ok(OldStatus {
                status: row.get(0)?,
                outcome: row.get(1)?,
            })
        })
        .optional()
}

/// A step's recall entries (`recall_rows.rs`), in the statements of the step's savepoint.
fn insert_recall(
    conn: &Connection,
    task: &str,
    step: i64,
    entries: &[IndexEntry],
) -> rusqlite::Result<()> {
    let mut index = conn.prepare_cached(
        "INSERT INTO recall_entries (task_id, step, kind, pointer, text) VALUES (?, ?, ?, ?, ?)",
    )?;
    for entry in entries {
        index.execute(params![
            task,
            step,
            entry.kind.as_str(),
            entry.pointer,
            entry.text
        ])?;
    }
    Ok(())
}

/// A journal row, ready to bind.
pub(super) struct EntryRow {
    step: i64,
    attempt: i64,
    verdict: &'static str,
    output: String,
    patch: Option<String>,
    action: Option<String>,
    errors: Option<String>,
    state_hash: Option<String>,
    prompt_tokens: i64,
    output_tokens: Option<i64>,
    prompt_hash: String,
    usage: Option<String>,
    latency_ms: i64,
    created_at: i64,
    author: Option<String>,
    board_version: Option<i64>,
    /// An accepted step's recall entries, written with the row (`recall_rows.rs`).
    recall: Vec<IndexEntry>,
}

impl EntryRow {
    pub(super) fn new(entry: &JournalEntry) -> Self {
        Self {
            step: entry.step as i64,
            attempt: i64::from(entry.attempt),
            verdict: verdict_str(entry.verdict),
            output: entry.output.clone(),
            patch: entry.patch.as_ref().map(to_json),
            action: entry.action.as_ref().map(to_json),
            errors: entry.errors.as_ref().map(to_json),
            state_hash: entry.state_hash.clone(),
            prompt_tokens: entry.prompt_tokens as i64,
            output_tokens: entry.output_tokens.and_then(|n| i64::try_from(n).ok()),
            prompt_hash: entry.prompt_hash.clone(),
            usage: entry.usage.as_ref().map(to_json),
            latency_ms: entry.latency_ms as i64,
            created_at: entry.created_at,
            author: entry.author.clone(),
            board_version: entry.board_version.and_then(|v| i64::try_from(v).ok()),
            recall: recall_entries(entry),
        }
    }

    fn insert(&self, conn: &Connection, task: &str) -> rusqlite::Result<()> {
        conn.prepare_cached(
            "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, output_tokens, prompt_hash, usage, latency_ms, created_at, author, board_version) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![
            task,
            self.step,
            self.attempt,
            self.verdict,
            self.output,
            self.patch,
            self.action,
            self.errors,
            self.state_hash,
            self.prompt_tokens,
            self.output_tokens,
            self.prompt_hash,
            self.usage,
            self.latency_ms,
            self.created_at,
            self.author,
            self.board_version,
        ])?;
        insert_recall(conn, task, self.step, &self.recall)?;
        Ok(())
    }
}

/// [`NextObservation::Carried`]: the observation of step ?3 as the observation of step ?2, with
/// the note ?4 added once.
const CARRY_OBSERVATION: &str = "INSERT INTO observations (task_id, step, text) \
     SELECT ?1, ?2, CASE \
       WHEN o.text IS NULL OR o.text = '' THEN ?4 \
       WHEN ?4 = '' OR substr(o.text, -length(?4)) = ?4 THEN o.text \
       ELSE o.text || char(10, 10) || ?4 END \
     FROM (SELECT (SELECT text FROM observations WHERE task_id = ?1 AND step = ?3) AS text) o";

/// An accepted step: the state at the next version, its journal row, its action intent, and a
/// snapshot when the step is a multiple of the snapshot interval.
pub(super) struct Step {
    task: String,
    expected_version: u64,
    state: String,
    /// `Some(hash of the state)` when this step is snapshotted.
    snapshot: Option<String>,
    status: Option<TaskStatus>,
    outcome: Option<String>,
    entry: EntryRow,
    /// The `step` event's data.
    event: String,
    /// Tool, arguments, idempotency key, side effect.
    intent: Option<(String, String, String, String)>,
    /// The previous step's action result, written first.
    previous: Option<ActionDone>,
    next_observation: Option<NextObservation>,
    /// The environment's checkpoint as of `expected_version` (`StepCommit::world`).
    world: Option<String>,
    /// The skill version the task runs from this step on (`StepCommit::upgrade`).
    upgrade: Option<SpecTexts>,
    now: i64,
}

impl Step {
    /// The task this step commits to.
    /// Adds `entries` to the recall index at this step (a board member's board write,
    /// committed in the step's savepoint).
    pub(super) fn index(&self, conn: &Connection, entries: &[IndexEntry]) -> rusqlite::Result<()> {
        insert_recall(conn, &self.task, self.entry.step, entries)
    }

    pub(super) fn task(&self) -> &str {
        &self.task
    }

    pub(super) fn new(
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
        snapshot_every: u64,
        now: i64,
    ) -> Self {
        let (status, outcome) = match &commit.status {
            Some((status, outcome)) => (Some(*status), outcome.as_ref().map(to_json)),
            None => (None, None),
        };
        let entry = EntryRow::new(&commit.entry);
        let event = step_data(
            commit.entry.step,
            entry.patch.as_deref(),
            entry.action.as_deref(),
            entry.author.as_deref(),
        );
        Self {
            task: task.to_owned(),
            expected_version,
            state: to_json(&commit.new_state),
            snapshot: (expected_version + 1)
                .is_multiple_of(snapshot_every)
                .then(|| state_hash(&commit.new_state)),
            status,
            outcome,
            entry,
            event,
            intent: commit.intent.as_ref().map(|intent| {
                (
                    intent.tool.clone(),
                    to_json(&intent.args),
                    intent.idempotency_key.clone(),
                    intent.side_effect.clone(),
                )
            }),
            previous: commit
                .previous_result
                .as_ref()
                .map(|result| ActionDone::new(task, result, now)),
            next_observation: commit.next_observation.clone(),
            world: commit.world.as_ref().map(to_json),
            upgrade: commit
                .upgrade
                .as_ref()
                .map(|change| SpecTexts::new(&change.skill, &change.tools)),
            now,
        }
    }

    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        if let Some(previous) = &self.previous {
            previous.run(conn)?;
        }
        let next = (self.expected_version + 1) as i64;
        // Only steps that finish or pause the task read the status they change.
        let before = match self.status {
            Some(_) => old_status(conn, &self.task)?,
            None => None,
        };
        // The version check and the state write are one statement.
        let updated = conn
            .prepare_cached(
                "UPDATE tasks SET state = ?1, version = ?2, updated_at = ?3, status = COALESCE(?4, status), outcome = COALESCE(?5, outcome), env_checkpoint = COALESCE(?8, env_checkpoint), env_checkpoint_step = CASE WHEN ?8 IS NULL THEN env_checkpoint_step ELSE ?7 END WHERE id = ?6 AND version = ?7",
            )?
            .execute(params![
                self.state,
                next,
                self.now,
                self.status.map(TaskStatus::as_str),
                self.outcome,
                self.task,
                self.expected_version as i64,
                self.world,
            ])?;
        if updated != 1 {
            let actual: Option<i64> = conn
                .prepare_cached("SELECT version FROM tasks WHERE id = ?")?
                .query_row([&self.task], |row| row.get(0))
                .optional()?;
            return Err(match actual {
                None => StoreError::NotFound(self.task.clone()),
                Some(actual) => StoreError::Conflict {
                    task: self.task.clone(),
                    expected: self.expected_version,
                    actual: actual.max(0) as u64,
                },
            }
            .into());
        }
        self.entry.insert(conn, &self.task)?;
        if let Some(spec) = &self.upgrade {
            conn.prepare_cached(super::INSERT_VERSION)?
                .execute(params![
                    spec.hash,
                    spec.name,
                    spec.version,
                    spec.skill,
                    spec.tools,
                    self.now
                ])?;
            conn.prepare_cached(
                "INSERT INTO task_versions (task_id, from_step, spec_hash) VALUES (?, ?, ?)",
            )?
            .execute(params![self.task, next, spec.hash])?;
            conn.prepare_cached(
                "UPDATE tasks SET spec_hash = ?, upgrade_to = NULL, upgrade_author = NULL WHERE id = ?",
            )?
                .execute(params![spec.hash, self.task])?;
        }
        if let Some((tool, args, key, side_effect)) = &self.intent {
            conn.prepare_cached(
                "INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
            )?
            .execute(params![self.task, next, tool, args, key, side_effect, self.now])?;
        }
        if let Some(hash) = &self.snapshot {
            conn.prepare_cached(
                "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)",
            )?
            .execute(params![self.task, next, self.state, hash])?;
        }
        match &self.next_observation {
            Some(NextObservation::Text(text)) => {
                conn.prepare_cached(
                    "INSERT INTO observations (task_id, step, text) VALUES (?, ?, ?)",
                )?
                .execute(params![self.task, next + 1, text])?;
            }
            Some(NextObservation::Carried { note }) => {
                conn.prepare_cached(CARRY_OBSERVATION)?.execute(params![
                    self.task,
                    next + 1,
                    next,
                    note
                ])?;
            }
            None => {}
        }
        insert_event(conn, &self.task, "step", &self.event, self.now)?;
        if let (Some(status), Some(before)) = (self.status, &before)
            && let Some(data) = status_data(before, status, self.outcome.as_deref())
        {
            insert_event(conn, &self.task, "status", &data, self.now)?;
        }
        Ok(())
    }
}

/// A rejected answer: a journal row; the state is untouched.
pub(super) struct Rejection {
    task: String,
    entry: EntryRow,
    /// The `rejected` event's data.
    event: String,
    now: i64,
}

impl Rejection {
    pub(super) fn new(task: &str, entry: &JournalEntry, now: i64) -> Self {
        let row = EntryRow::new(entry);
        Self {
            task: task.to_owned(),
            event: rejected_data(entry.step, entry.attempt, row.errors.as_deref()),
            entry: row,
            now,
        }
    }

    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        self.entry.insert(conn, &self.task)?;
        conn.prepare_cached("UPDATE tasks SET updated_at = ? WHERE id = ?")?
            .execute(params![self.now, self.task])?;
        insert_event(conn, &self.task, "rejected", &self.event, self.now)?;
        Ok(())
    }
}

/// A tool's result and the observation the next step starts from.
pub(super) struct ActionDone {
    task: String,
    result: ActionResult,
    env_checkpoint: Option<String>,
    /// The `action` event's data.
    event: String,
    now: i64,
}

impl ActionDone {
    pub(super) fn new(task: &str, result: &ActionResult, now: i64) -> Self {
        Self {
            task: task.to_owned(),
            result: result.clone(),
            env_checkpoint: result.env_checkpoint.as_ref().map(to_json),
            event: action_data(result),
            now,
        }
    }

    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let result = &self.result;
        let completed = conn
            .prepare_cached(
                "UPDATE intents SET status = 'done', ok = ?, result = ?, finished_at = ? WHERE task_id = ? AND step = ? AND status = 'pending'",
            )?
            .execute(params![
                (!result.outcome_unknown).then_some(result.ok),
                result.result,
                self.now,
                self.task,
                result.step as i64
            ])?;
        if completed != 1 {
            return Err(StoreError::Corrupt {
                task: self.task.clone(),
                step: result.step,
                message: "no pending action intent to complete".into(),
            }
            .into());
        }
        conn.prepare_cached("INSERT INTO observations (task_id, step, text) VALUES (?, ?, ?)")?
            .execute(params![
                self.task,
                (result.step + 1) as i64,
                result.next_observation
            ])?;
        conn.prepare_cached(
            "UPDATE tasks SET env_checkpoint = COALESCE(?1, env_checkpoint), env_checkpoint_step = CASE WHEN ?1 IS NULL THEN env_checkpoint_step ELSE ?2 END, updated_at = ?3 WHERE id = ?4",
        )?
        .execute(params![
            self.env_checkpoint,
            result.step as i64,
            self.now,
            self.task
        ])?;
        for id in &result.delivered {
            let marked = conn
                .prepare_cached(
                    "UPDATE inbox SET delivered_step = ? WHERE id = ? AND task_id = ? AND delivered_step IS NULL",
                )?
                .execute(params![(result.step + 1) as i64, id, self.task])?;
            if marked != 1 {
                return Err(crate::inbox::not_waiting(&self.task, result.step + 1).into());
            }
        }
        insert_event(conn, &self.task, "action", &self.event, self.now)?;
        Ok(())
    }
}

/// A new status, and the outcome when one is given.
pub(super) struct Status {
    pub(super) task: String,
    pub(super) status: TaskStatus,
    pub(super) outcome: Option<String>,
    pub(super) now: i64,
}

impl Status {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let Some(before) = old_status(conn, &self.task)? else {
            return Err(StoreError::NotFound(self.task.clone()).into());
        };
        conn.prepare_cached(
            "UPDATE tasks SET status = ?, outcome = COALESCE(?, outcome), updated_at = ? WHERE id = ?",
        )?
        .execute(params![
            self.status.as_str(),
            self.outcome,
            self.now,
            self.task
        ])?;
        if let Some(data) = status_data(&before, self.status, self.outcome.as_deref()) {
            insert_event(conn, &self.task, "status", &data, self.now)?;
        }
        Ok(())
    }
}
