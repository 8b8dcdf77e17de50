//! A step's commit as one statement: `skillstate_commit_step` (schema 16,
//! `migrations/postgres/0016_step_function.sql`) does on the server what used to be a
//! transaction of 7 to 12 statements, so a worker's step costs one exchange with the server.
//! This module binds a [`StepCommit`] to the function's parameters and reads its answer back
//! into the store's errors.

use skillstate_core::json::state_hash;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use crate::model::*;
use crate::rows::{lease_from_row, to_json};
use crate::service_rows::{action_data, step_data_of};
use crate::{Result, StoreError};

/// Which lease check the commit makes, with the task's row locked.
#[derive(Debug, Clone, Copy)]
pub(super) enum LeaseCheck<'a> {
    /// None (`Journal::commit_step`, or a caller that checked it in the same transaction).
    Skip,
    /// Refused while anyone holds an unexpired lease (`Leases::commit_unleased_step`).
    Unleased,
    /// Refused unless this token holds the lease (`Leases::write_under_lease`).
    Token(&'a str),
}

/// The call, with the function's 42 parameters in its order. The next observation ($34) is
/// the text given, or ($43, a note) the observation step $4 + 1 started from carried over
/// with the note, read in the same statement (`NextObservation::Carried`, migration 19).
const CALL: &str = "SELECT * FROM skillstate_commit_step($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
     $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, \
     $31, $32, $33, \
     CASE WHEN $43::text IS NULL THEN $34 ELSE skillstate_carried_observation($1, $4 + 1, $43) END, \
     $35, $36, $37, $38, $39, $40, $41, $42)";

/// SQLSTATEs the function raises after it has written something (the statement rolls back).
const NO_PENDING_INTENT: &str = "SKI01";
const MESSAGE_NOT_WAITING: &str = "SKI02";

/// The statement that commits `commit` at `expected_version`, run alone (`Db::write_alone`:
/// its own transaction) or inside an open transaction; its row goes to [`answer`], its error
/// through [`raised`].
pub(super) fn call<'q>(
    task: &'q str,
    check: LeaseCheck<'q>,
    expected_version: u64,
    commit: &'q StepCommit,
    snapshot_every: u64,
    now: i64,
) -> Query<'q, Postgres, PgArguments> {
    let next_version = expected_version + 1;
    let (mode, token) = match check {
        LeaseCheck::Skip => ("skip", None),
        LeaseCheck::Unleased => ("unleased", None),
        LeaseCheck::Token(token) => ("token", Some(token)),
    };
    let (status, outcome) = match &commit.status {
        Some((status, outcome)) => (Some(status.as_str()), outcome.as_ref().map(to_json)),
        None => (None, None),
    };
    let entry = &commit.entry;
    let mut kinds = Vec::new();
    let mut pointers = Vec::new();
    let mut texts = Vec::new();
    for e in crate::recall_rows::recall_entries(entry) {
        kinds.push(e.kind.as_str());
        pointers.push(e.pointer);
        texts.push(e.text);
    }
    let intent = commit.intent.as_ref();
    let snapshot = next_version
        .is_multiple_of(snapshot_every)
        .then(|| state_hash(&commit.new_state));
    let previous = commit.previous_result.as_ref();
    let delivered: &[i64] = previous.map_or(&[], |p| p.delivered.as_slice());
    let head = sqlx::query(CALL)
        .bind(task)
        .bind(mode)
        .bind(token)
        .bind(expected_version as i64)
        .bind(now)
        .bind(to_json(&commit.new_state))
        .bind(commit.world.as_ref().map(to_json))
        .bind(status)
        .bind(outcome);
    super::journal::bind_entry(head, entry)
        .bind(kinds)
        .bind(pointers)
        .bind(texts)
        .bind(intent.map(|i| i.tool.as_str()))
        .bind(intent.map(|i| to_json(&i.args)))
        .bind(intent.map(|i| i.idempotency_key.as_str()))
        .bind(intent.map(|i| i.side_effect.as_str()))
        .bind(snapshot)
        .bind(match &commit.next_observation {
            Some(NextObservation::Text(text)) => Some(text.as_str()),
            _ => None,
        })
        .bind(previous.map(|p| p.step as i64))
        .bind(previous.and_then(|p| (!p.outcome_unknown).then_some(p.ok)))
        .bind(previous.map(|p| p.result.as_str()))
        .bind(previous.map(|p| p.next_observation.as_str()))
        .bind(previous.and_then(|p| p.env_checkpoint.as_ref().map(to_json)))
        .bind(delivered)
        .bind(previous.map(action_data))
        .bind(step_data_of(entry))
        .bind(match &commit.next_observation {
            Some(NextObservation::Carried { note }) => Some(note.as_str()),
            _ => None,
        })
}

/// The function's refusals as the store's errors; `Ok(messages_waiting)` for a commit.
pub(super) fn answer(row: &PgRow, task: &str, expected_version: u64) -> Result<bool> {
    let outcome: String = row.try_get("outcome")?;
    match outcome.as_str() {
        "ok" => Ok(row
            .try_get::<Option<bool>, _>("messages_waiting")?
            .unwrap_or(true)),
        "not_found" => Err(StoreError::NotFound(task.to_owned())),
        "conflict" => Err(StoreError::Conflict {
            task: task.to_owned(),
            expected: expected_version,
            actual: row.try_get::<Option<i64>, _>("version")?.unwrap_or(0) as u64,
        }),
        "lease_lost" => Err(crate::fenced::lease_lost(
            task,
            row.try_get("lease_holder")?,
            row.try_get("lease_acquired_at")?,
        )),
        "leased" => match lease_from_row(row)? {
            Some(lease) => Err(StoreError::Leased {
                task: task.to_owned(),
                lease: Box::new(lease),
            }),
            None => Err(crate::fenced::lease_lost(task, None, None)),
        },
        other => Err(StoreError::Corrupt {
            task: task.to_owned(),
            step: expected_version + 1,
            message: format!(
                "the database's skillstate_commit_step answered `{other}`, which this build does not know: the function was replaced by another version of skillstate; open the store with the version that migrated it"
            ),
        }),
    }
}

/// The failures the function raises after a write, as the store's errors.
pub(super) fn raised(error: StoreError, task: &str, previous: Option<&ActionResult>) -> StoreError {
    let code = match &error {
        StoreError::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    let step = previous.map_or(0, |p| p.step);
    match code.as_deref() {
        Some(NO_PENDING_INTENT) => StoreError::Corrupt {
            task: task.to_owned(),
            step,
            message: "no pending action intent to complete".into(),
        },
        Some(MESSAGE_NOT_WAITING) => crate::inbox::not_waiting(task, step + 1),
        _ => error,
    }
}
