//! The step journal on PostgreSQL: accepted steps, rejections, tool results and statuses,
//! each with its events (`events.rs`) in the same transaction, and reading them back. Concurrent commits of many tasks share WAL flushes: PostgreSQL's WAL writer already
//! groups the commits that wait at the same moment (group commit), so no batching is needed
//! here.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::PostgresStore;
use super::events::insert_events;
use super::step_fn::{self, LeaseCheck};
use crate::model::*;
use crate::rows::{decode, entry_from_row, extent_from_row, intent_from_row, to_json, verdict_str};
use crate::service_rows::{OldStatus, action_data, rejected_data, status_data};
use crate::spec_texts::SpecTexts;
use crate::{Journal, Result, StoreError, now_millis};

/// The task's status and outcome, its row locked until the transaction ends; `None` when
/// there is no such task.
async fn lock_status(conn: &mut sqlx::PgConnection, task: &str) -> Result<Option<OldStatus>> {
    let row = sqlx::query("SELECT status, outcome FROM tasks WHERE id = $1 FOR NO KEY UPDATE")
        .bind(task)
        .fetch_optional(conn)
        .await?;
    row.map(|row| {
        Ok(OldStatus {
            status: row.try_get("status")?,
            outcome: row.try_get("outcome")?,
        })
    })
    .transpose()
}

/// A step's recall entries, in one statement (arrays unnested), in the step's transaction.
pub(super) async fn insert_recall(
    conn: &mut sqlx::PgConnection,
    task: &str,
    step: u64,
    recall: &[crate::recall_rows::IndexEntry],
) -> Result<()> {
    if recall.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = recall.iter().map(|e| e.kind.as_str()).collect();
    let pointers: Vec<Option<&str>> = recall.iter().map(|e| e.pointer.as_deref()).collect();
    let texts: Vec<&str> = recall.iter().map(|e| e.text.as_str()).collect();
    sqlx::query(
        "INSERT INTO recall_entries (task_id, step, kind, pointer, text) \
         SELECT $1, $2, kind, pointer, text FROM unnest($3::text[], $4::text[], $5::text[]) AS e(kind, pointer, text)",
    )
    .bind(task)
    .bind(step as i64)
    .bind(kinds)
    .bind(pointers)
    .bind(texts)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Binds a journal row's columns after `query`'s, in the journal's column order from `step` to
/// `board_version` (the INSERT below and `skillstate_commit_step`'s parameters).
pub(super) fn bind_entry<'q>(
    query: Query<'q, Postgres, PgArguments>,
    entry: &'q JournalEntry,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(entry.step as i64)
        .bind(i64::from(entry.attempt))
        .bind(verdict_str(entry.verdict))
        .bind(&entry.output)
        .bind(entry.patch.as_ref().map(to_json))
        .bind(entry.action.as_ref().map(to_json))
        .bind(entry.errors.as_ref().map(to_json))
        .bind(&entry.state_hash)
        .bind(entry.prompt_tokens as i64)
        .bind(entry.output_tokens.and_then(|n| i64::try_from(n).ok()))
        .bind(&entry.prompt_hash)
        .bind(entry.usage.as_ref().map(to_json))
        .bind(entry.latency_ms as i64)
        .bind(entry.created_at)
        .bind(&entry.author)
        .bind(entry.board_version.and_then(|v| i64::try_from(v).ok()))
}

async fn insert_entry(
    conn: &mut sqlx::PgConnection,
    task: &str,
    entry: &JournalEntry,
) -> Result<()> {
    let query = sqlx::query(
        "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, output_tokens, prompt_hash, usage, latency_ms, created_at, author, board_version) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(task);
    bind_entry(query, entry).execute(&mut *conn).await?;
    insert_recall(
        conn,
        task,
        entry.step,
        &crate::recall_rows::recall_entries(entry),
    )
    .await?;
    Ok(())
}

/// Marks the step's pending intent done with its result and records the observation the next
/// step starts from. Errors (the transaction is dropped, so rolled back) when no intent is
/// pending.
async fn complete_intent(
    conn: &mut sqlx::PgConnection,
    task: &str,
    result: &ActionResult,
    now: i64,
) -> Result<()> {
    let updated = sqlx::query(
        "UPDATE intents SET status = 'done', ok = $1, result = $2, finished_at = $3 WHERE task_id = $4 AND step = $5 AND status = 'pending'",
    )
    .bind((!result.outcome_unknown).then_some(result.ok))
    .bind(&result.result)
    .bind(now)
    .bind(task)
    .bind(result.step as i64)
    .execute(&mut *conn)
    .await?;
    if updated.rows_affected() != 1 {
        return Err(StoreError::Corrupt {
            task: task.to_owned(),
            step: result.step,
            message: "no pending action intent to complete".into(),
        });
    }
    sqlx::query("INSERT INTO observations (task_id, step, text) VALUES ($1, $2, $3)")
        .bind(task)
        .bind((result.step + 1) as i64)
        .bind(&result.next_observation)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE tasks SET env_checkpoint = COALESCE($1, env_checkpoint), env_checkpoint_step = CASE WHEN $1 IS NULL THEN env_checkpoint_step ELSE $4 END, updated_at = $2 WHERE id = $3",
    )
    .bind(result.env_checkpoint.as_ref().map(to_json))
    .bind(now)
    .bind(task)
    .bind(result.step as i64)
    .execute(&mut *conn)
    .await?;
    if !result.delivered.is_empty() {
        let marked = sqlx::query(
            "UPDATE inbox SET delivered_step = $1 WHERE id = ANY($2) AND task_id = $3 AND delivered_step IS NULL",
        )
        .bind((result.step + 1) as i64)
        .bind(&result.delivered)
        .bind(task)
        .execute(&mut *conn)
        .await?;
        if marked.rows_affected() != result.delivered.len() as u64 {
            return Err(crate::inbox::not_waiting(task, result.step + 1));
        }
    }
    Ok(())
}

impl PostgresStore {
    /// Runs a step's commit (`attempt`: its one statement, or a transaction it begins and
    /// commits) as one unit (`Db::checked_unit`): when the answer was lost, the journal says
    /// whether it was recorded (then `T::default()`), and only a step that was not runs again
    /// (its version check would refuse a second one anyway).
    pub(super) async fn step_unit<T, F, Fut>(
        &self,
        task: &str,
        commit: &StepCommit,
        attempt: F,
    ) -> Result<T>
    where
        T: Default,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.pool
            .checked_unit(attempt, || self.holds_entry(task, &commit.entry))
            .await
    }

    /// Whether an action's result is recorded: its intent is done with this result.
    pub(super) async fn holds_result(&self, task: &str, result: &ActionResult) -> Result<bool> {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM intents WHERE task_id = $1 AND step = $2 AND status = 'done' AND result = $3",
        )
        .bind(task)
        .bind(result.step as i64)
        .bind(&result.result)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }

    /// Whether `task` has `status`.
    pub(super) async fn has_status(&self, task: &str, status: TaskStatus) -> Result<bool> {
        let found: Option<String> = sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.as_deref() == Some(status.as_str()))
    }

    /// Whether the journal holds `entry` (its step and attempt, written at the same
    /// millisecond with the same answer).
    pub(super) async fn holds_entry(&self, task: &str, entry: &JournalEntry) -> Result<bool> {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM journal WHERE task_id = $1 AND step = $2 AND attempt = $3 AND created_at = $4 AND output = $5",
        )
        .bind(task)
        .bind(entry.step as i64)
        .bind(i64::from(entry.attempt))
        .bind(entry.created_at)
        .bind(&entry.output)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }

    /// A step's commit, making `check` first with the task's row locked: one statement
    /// (`step_fn.rs`) in a transaction of its own, so one round trip; a step that upgrades the
    /// task's skill, or any step through a transaction pooler, runs it inside a transaction
    /// (`commit_step_in`). Returns whether messages wait in the task's inbox afterwards.
    pub(super) async fn commit_step_once(
        &self,
        task: &str,
        check: LeaseCheck<'_>,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<bool> {
        if commit.upgrade.is_some() {
            let tx = self.pool.begin().await?;
            return self
                .commit_step_in(tx, task, check, expected_version, commit)
                .await;
        }
        let call = step_fn::call(
            task,
            check,
            expected_version,
            commit,
            self.snapshot_every,
            now_millis(),
        );
        let row = self
            .pool
            .write_alone(call)
            .await
            .map_err(|e| step_fn::raised(e, task, commit.previous_result.as_ref()))?;
        step_fn::answer(&row, task, expected_version)
    }

    /// A step's commit in `tx`, which may have checked something first (a board's version),
    /// and the skill change it makes, if any; commits `tx`.
    pub(super) async fn commit_step_in(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        task: &str,
        check: LeaseCheck<'_>,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<bool> {
        let now = now_millis();
        let row = step_fn::call(
            task,
            check,
            expected_version,
            commit,
            self.snapshot_every,
            now,
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| step_fn::raised(e.into(), task, commit.previous_result.as_ref()))?;
        let waiting = step_fn::answer(&row, task, expected_version)?;
        if let Some(change) = &commit.upgrade {
            let spec = SpecTexts::new(&change.skill, &change.tools);
            super::tasks::store_versions(&mut tx, std::slice::from_ref(&spec), now).await?;
            sqlx::query(
                "INSERT INTO task_versions (task_id, from_step, spec_hash) VALUES ($1, $2, $3)",
            )
            .bind(task)
            .bind((expected_version + 1) as i64)
            .bind(&spec.hash)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE tasks SET spec_hash = $1, upgrade_to = NULL, upgrade_author = NULL WHERE id = $2",
            )
            .bind(&spec.hash)
            .bind(task)
            .execute(&mut *tx)
            .await?;
        }
        super::db::commit(tx).await?;
        Ok(waiting)
    }
}

/// `Journal::record_rejection` in `tx`.
pub(super) async fn record_rejection_in(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    task: &str,
    entry: &JournalEntry,
) -> Result<()> {
    let now = now_millis();
    let errors = entry.errors.as_ref().map(to_json);
    let event = rejected_data(entry.step, entry.attempt, errors.as_deref());
    insert_entry(&mut tx, task, entry).await?;
    sqlx::query("UPDATE tasks SET updated_at = $1 WHERE id = $2")
        .bind(now)
        .bind(task)
        .execute(&mut *tx)
        .await?;
    insert_events(&mut tx, task, vec![("rejected", None, event)], now).await?;
    super::db::commit(tx).await?;
    Ok(())
}

/// `Journal::record_action_result` in `tx`.
pub(super) async fn record_action_result_in(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    task: &str,
    result: &ActionResult,
) -> Result<()> {
    let now = now_millis();
    complete_intent(&mut tx, task, result, now).await?;
    insert_events(
        &mut tx,
        task,
        vec![("action", None, action_data(result))],
        now,
    )
    .await?;
    super::db::commit(tx).await?;
    Ok(())
}

/// `Journal::set_status` in `tx`.
pub(super) async fn set_status_in(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    task: &str,
    status: TaskStatus,
    outcome: Option<&Value>,
) -> Result<()> {
    let now = now_millis();
    let outcome = outcome.map(to_json);
    let Some(before) = lock_status(&mut tx, task).await? else {
        tx.rollback().await?;
        return Err(StoreError::NotFound(task.to_owned()));
    };
    sqlx::query(
        "UPDATE tasks SET status = $1, outcome = COALESCE($2, outcome), updated_at = $3 WHERE id = $4",
    )
    .bind(status.as_str())
    .bind(&outcome)
    .bind(now)
    .bind(task)
    .execute(&mut *tx)
    .await?;
    if let Some(data) = status_data(&before, status, outcome.as_deref()) {
        insert_events(&mut tx, task, vec![("status", None, data)], now).await?;
    }
    super::db::commit(tx).await?;
    Ok(())
}

#[async_trait]
impl Journal for PostgresStore {
    async fn record_rejection(&self, task: &str, entry: &JournalEntry) -> Result<()> {
        self.pool
            .checked_unit(
                || async move {
                    let tx = self.pool.begin().await?;
                    record_rejection_in(tx, task, entry).await
                },
                || self.holds_entry(task, entry),
            )
            .await
    }

    async fn commit_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()> {
        self.step_unit(task, commit, || async move {
            self.commit_step_once(task, LeaseCheck::Skip, expected_version, commit)
                .await
                .map(|_| ())
        })
        .await
    }

    async fn record_action_result(&self, task: &str, result: &ActionResult) -> Result<()> {
        self.pool
            .checked_unit(
                || async move {
                    let tx = self.pool.begin().await?;
                    record_action_result_in(tx, task, result).await
                },
                || self.holds_result(task, result),
            )
            .await
    }

    async fn set_status(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
    ) -> Result<()> {
        self.pool
            .checked_unit(
                || async move {
                    let tx = self.pool.begin().await?;
                    set_status_in(tx, task, status, outcome).await
                },
                || self.has_status(task, status),
            )
            .await
    }

    async fn journal(&self, task: &str) -> Result<Vec<JournalEntry>> {
        let rows = sqlx::query("SELECT * FROM journal WHERE task_id = $1 ORDER BY step, attempt")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(entry_from_row).collect()
    }

    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT text FROM observations WHERE task_id = $1 AND step = $2")
                .bind(task)
                .bind(step as i64)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn observations(&self, task: &str) -> Result<Vec<(u64, String)>> {
        let rows =
            sqlx::query("SELECT step, text FROM observations WHERE task_id = $1 ORDER BY step")
                .bind(task)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|row| Ok((row.try_get::<i64, _>("step")? as u64, row.try_get("text")?)))
            .collect()
    }

    async fn intents(&self, task: &str) -> Result<Vec<IntentRecord>> {
        let rows = sqlx::query("SELECT * FROM intents WHERE task_id = $1 ORDER BY step")
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(intent_from_row).collect()
    }

    async fn intent(&self, task: &str, step: u64) -> Result<Option<IntentRecord>> {
        let row = sqlx::query("SELECT * FROM intents WHERE task_id = $1 AND step = $2")
            .bind(task)
            .bind(step as i64)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(intent_from_row).transpose()
    }

    async fn snapshot_before(&self, task: &str, step: u64) -> Result<Option<(u64, Value)>> {
        let row = sqlx::query(
            "SELECT step, state FROM snapshots WHERE task_id = $1 AND step <= $2 ORDER BY step DESC LIMIT 1",
        )
        .bind(task)
        .bind(step as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok((
                row.try_get::<i64, _>("step")? as u64,
                decode("snapshot", &row.try_get::<String, _>("state")?)?,
            ))
        })
        .transpose()
    }

    async fn accepted_patches(
        &self,
        task: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Value, String)>> {
        let rows = sqlx::query(
            "SELECT step, patch, state_hash FROM journal WHERE task_id = $1 AND verdict = 'accepted' AND step BETWEEN $2 AND $3 ORDER BY step",
        )
        .bind(task)
        .bind(from as i64)
        .bind(to as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let step = row.try_get::<i64, _>("step")? as u64;
                let patch: Option<String> = row.try_get("patch")?;
                let hash: Option<String> = row.try_get("state_hash")?;
                let corrupt = |message: &str| StoreError::Corrupt {
                    task: task.to_owned(),
                    step,
                    message: message.to_owned(),
                };
                let patch = patch.ok_or_else(|| corrupt("accepted step without a patch"))?;
                let patch = serde_json::from_str(&patch)
                    .map_err(|e| corrupt(&format!("the patch is not JSON: {e}")))?;
                Ok((
                    step,
                    patch,
                    hash.ok_or_else(|| corrupt("accepted step without a state hash"))?,
                ))
            })
            .collect()
    }

    async fn journal_extent(&self, task: &str) -> Result<JournalExtent> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS accepted, MIN(step) AS first, MAX(step) AS last, \
             (SELECT state_hash FROM journal WHERE task_id = $1 AND verdict = 'accepted' ORDER BY step DESC LIMIT 1) AS last_hash, \
             (SELECT MIN(step) FROM snapshots WHERE task_id = $1) AS base \
             FROM journal WHERE task_id = $1 AND verdict = 'accepted'",
        )
        .bind(task)
        .fetch_one(&self.pool)
        .await?;
        extent_from_row(&row)
    }
    async fn search_journal(
        &self,
        task: &str,
        query: &skillstate_core::recall::RecallQuery,
        after: Option<skillstate_core::recall::HitCursor>,
        limit: usize,
    ) -> Result<Vec<skillstate_core::recall::RawHit>> {
        crate::recall_rows::checked_search(query, after, limit, |after, n| {
            self.search_candidates(task, query, after, n)
        })
        .await
    }
}
