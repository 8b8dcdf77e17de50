//! The step writes of the group-commit writer: accepted steps, rejections, tool results and
//! statuses, each one multi-statement query.

use skillstate_core::json::state_hash;
use sqlx::SqliteConnection;

use crate::model::*;
use crate::rows::{to_json, verdict_str};
use crate::{Result, StoreError};

type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>;

macro_rules! journal_sql {
    () => {
        "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at) \
         SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    };
}

/// The version check and the state: the UPDATE returns a row only when the task was at the
/// expected version, and the journal row follows only then.
macro_rules! step_sql {
    () => {
        concat!(
            "SAVEPOINT one; \
             UPDATE tasks SET state = ?, version = ?, updated_at = ?, status = COALESCE(?, status), outcome = COALESCE(?, outcome) WHERE id = ? AND version = ? RETURNING version; ",
            journal_sql!(),
            " WHERE changes() = 1; "
        )
    };
}

macro_rules! intent_sql {
    () => {
        "INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at) \
         SELECT ?, ?, ?, ?, ?, ?, 'pending', ? WHERE changes() = 1; "
    };
}

macro_rules! snapshot_sql {
    () => {
        "INSERT INTO snapshots (task_id, step, state, state_hash) SELECT ?, ?, ?, ? WHERE changes() = 1; "
    };
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
    prompt_hash: String,
    usage: Option<String>,
    latency_ms: i64,
    created_at: i64,
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
            prompt_hash: entry.prompt_hash.clone(),
            usage: entry.usage.as_ref().map(to_json),
            latency_ms: entry.latency_ms as i64,
            created_at: entry.created_at,
        }
    }

    /// Binds the row's values in `journal_sql!()`'s order.
    fn bind<'q>(&'q self, query: Query<'q>, task: &'q str) -> Query<'q> {
        query
            .bind(task)
            .bind(self.step)
            .bind(self.attempt)
            .bind(self.verdict)
            .bind(&self.output)
            .bind(&self.patch)
            .bind(&self.action)
            .bind(&self.errors)
            .bind(&self.state_hash)
            .bind(self.prompt_tokens)
            .bind(&self.prompt_hash)
            .bind(&self.usage)
            .bind(self.latency_ms)
            .bind(self.created_at)
    }
}

/// An accepted step: the state at the next version, its journal row, its action intent, and a
/// snapshot when the step is a multiple of the snapshot interval.
pub(super) struct Step {
    task: String,
    expected_version: u64,
    state: String,
    /// `Some(hash of the state)` when this step is snapshotted.
    snapshot: Option<String>,
    status: Option<&'static str>,
    outcome: Option<String>,
    entry: EntryRow,
    /// Tool, arguments, idempotency key, side effect.
    intent: Option<(String, String, String, String)>,
    now: i64,
}

impl Step {
    pub(super) fn new(
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
        snapshot_every: u64,
        now: i64,
    ) -> Self {
        let (status, outcome) = match &commit.status {
            Some((status, outcome)) => (Some(status.as_str()), outcome.as_ref().map(to_json)),
            None => (None, None),
        };
        Self {
            task: task.to_owned(),
            expected_version,
            state: to_json(&commit.new_state),
            snapshot: (expected_version + 1)
                .is_multiple_of(snapshot_every)
                .then(|| state_hash(&commit.new_state)),
            status,
            outcome,
            entry: EntryRow::new(&commit.entry),
            intent: commit.intent.as_ref().map(|intent| {
                (
                    intent.tool.clone(),
                    to_json(&intent.args),
                    intent.idempotency_key.clone(),
                    intent.side_effect.clone(),
                )
            }),
            now,
        }
    }

    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let next = (self.expected_version + 1) as i64;
        let sql = match (self.intent.is_some(), self.snapshot.is_some()) {
            (false, false) => concat!(step_sql!(), "RELEASE one"),
            (true, false) => concat!(step_sql!(), intent_sql!(), "RELEASE one"),
            (false, true) => concat!(step_sql!(), snapshot_sql!(), "RELEASE one"),
            (true, true) => concat!(step_sql!(), intent_sql!(), snapshot_sql!(), "RELEASE one"),
        };
        let mut query = sqlx::query(sql)
            .bind(&self.state)
            .bind(next)
            .bind(self.now)
            .bind(self.status)
            .bind(&self.outcome)
            .bind(&self.task)
            .bind(self.expected_version as i64);
        query = self.entry.bind(query, &self.task);
        if let Some((tool, args, key, side_effect)) = &self.intent {
            query = query
                .bind(&self.task)
                .bind(next)
                .bind(tool)
                .bind(args)
                .bind(key)
                .bind(side_effect)
                .bind(self.now);
        }
        if let Some(hash) = &self.snapshot {
            query = query
                .bind(&self.task)
                .bind(next)
                .bind(&self.state)
                .bind(hash);
        }
        if !query.fetch_all(&mut *conn).await?.is_empty() {
            return Ok(());
        }
        let actual: Option<i64> = sqlx::query_scalar("SELECT version FROM tasks WHERE id = ?")
            .bind(&self.task)
            .fetch_optional(&mut *conn)
            .await?;
        Err(match actual {
            None => StoreError::NotFound(self.task.clone()),
            Some(actual) => StoreError::Conflict {
                task: self.task.clone(),
                expected: self.expected_version,
                actual: actual.max(0) as u64,
            },
        })
    }
}

/// A rejected answer: a journal row; the state is untouched.
pub(super) struct Rejection {
    pub(super) task: String,
    pub(super) entry: EntryRow,
    pub(super) now: i64,
}

impl Rejection {
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let query = sqlx::query(concat!(
            "SAVEPOINT one; ",
            journal_sql!(),
            "; UPDATE tasks SET updated_at = ? WHERE id = ?; RELEASE one"
        ));
        self.entry
            .bind(query, &self.task)
            .bind(self.now)
            .bind(&self.task)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// A tool's result and the observation the next step starts from.
pub(super) struct ActionDone {
    pub(super) task: String,
    pub(super) result: ActionResult,
    pub(super) env_checkpoint: Option<String>,
    pub(super) now: i64,
}

impl ActionDone {
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let result = &self.result;
        // The intent must still be pending; the observation and checkpoint follow only then.
        let completed = sqlx::query(
            "SAVEPOINT one; \
             UPDATE intents SET status = 'done', ok = ?, result = ?, finished_at = ? WHERE task_id = ? AND step = ? AND status = 'pending' RETURNING step; \
             INSERT INTO observations (task_id, step, text) SELECT ?, ?, ? WHERE changes() = 1; \
             UPDATE tasks SET env_checkpoint = COALESCE(?, env_checkpoint), updated_at = ? WHERE id = ? AND changes() = 1; \
             RELEASE one",
        )
        .bind(result.ok)
        .bind(&result.result)
        .bind(self.now)
        .bind(&self.task)
        .bind(result.step as i64)
        .bind(&self.task)
        .bind((result.step + 1) as i64)
        .bind(&result.next_observation)
        .bind(&self.env_checkpoint)
        .bind(self.now)
        .bind(&self.task)
        .fetch_all(&mut *conn)
        .await?;
        if completed.is_empty() {
            return Err(StoreError::Corrupt {
                task: self.task.clone(),
                step: result.step,
                message: "no pending action intent to complete".into(),
            });
        }
        Ok(())
    }
}

/// A new status, and the outcome when one is given.
pub(super) struct Status {
    pub(super) task: String,
    pub(super) status: &'static str,
    pub(super) outcome: Option<String>,
    pub(super) now: i64,
}

impl Status {
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let updated = sqlx::query(
            "SAVEPOINT one; UPDATE tasks SET status = ?, outcome = COALESCE(?, outcome), updated_at = ? WHERE id = ? RETURNING id; RELEASE one",
        )
        .bind(self.status)
        .bind(&self.outcome)
        .bind(self.now)
        .bind(&self.task)
        .fetch_all(&mut *conn)
        .await?;
        if updated.is_empty() {
            return Err(StoreError::NotFound(self.task.clone()));
        }
        Ok(())
    }
}
