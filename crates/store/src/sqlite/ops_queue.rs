//! The lease and queue writes of the group-commit writer: heartbeats, releases, settles,
//! claims and shared rate windows. Two claims in one group see each other (same transaction),
//! so they never take the same task.

use rusqlite::{Connection, OptionalExtension, params};

use super::ops::OpResult;
use crate::StoreError;
use crate::model::{LeaseClaim, LeaseInfo};
use crate::queue::{Claimed, RateDecision, RateLimit};
use crate::queue_rows::{RATE_WINDOW_MS, RateEntry, rate_decision};

/// Whether the task has inbox entries waiting: a settled claim then stays queued.
const WAITING: &str =
    "EXISTS (SELECT 1 FROM inbox WHERE inbox.task_id = tasks.id AND inbox.delivered_step IS NULL)";
const NO_LEASE: &str = "lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL";

/// Extends the lease `token` holds.
pub(super) struct Renew {
    pub(super) task: String,
    pub(super) token: String,
    pub(super) expires_at: i64,
}

impl Renew {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let renewed = conn
            .prepare_cached(
                "UPDATE tasks SET lease_expires_at = ? WHERE id = ? AND lease_token = ?",
            )?
            .execute(params![self.expires_at, self.task, self.token])?;
        if renewed != 1 {
            return Err(lost_lease(conn, &self.task)?.into());
        }
        Ok(())
    }
}

/// Gives the lease up, if `token` still holds it.
pub(super) struct Release {
    pub(super) task: String,
    pub(super) token: String,
}

impl Release {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        conn.prepare_cached(&format!(
            "UPDATE tasks SET {NO_LEASE} WHERE id = ? AND lease_token = ?"
        ))?
        .execute(params![self.task, self.token])?;
        Ok(())
    }
}

/// Ends a claim: done, or queued again after a backoff; the lease is released.
pub(super) struct Settle {
    pub(super) task: String,
    pub(super) token: String,
    pub(super) queue: &'static str,
    pub(super) tries: i64,
    pub(super) not_before: Option<i64>,
    pub(super) failure: Option<String>,
    pub(super) now: i64,
}

impl Settle {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let settled = conn
            .prepare_cached(&format!(
                "UPDATE tasks SET queue = CASE WHEN {WAITING} THEN 'queued' ELSE ?1 END, tries = tries + ?2, \
                 not_before = CASE WHEN {WAITING} THEN NULL ELSE ?3 END, failure = COALESCE(?4, failure), updated_at = ?5, {NO_LEASE} \
                 WHERE id = ?6 AND lease_token = ?7"
            ))?
            .execute(params![
                self.queue,
                self.tries,
                self.not_before,
                self.failure,
                self.now,
                self.task,
                self.token
            ])?;
        if settled == 1 {
            return Ok(());
        }
        let found: Option<i64> = conn
            .prepare_cached("SELECT 1 FROM tasks WHERE id = ?")?
            .query_row([&self.task], |row| row.get(0))
            .optional()?;
        Err(match found {
            None => StoreError::NotFound(self.task.clone()),
            Some(_) => lost_lease(conn, &self.task)?,
        }
        .into())
    }
}

/// `LeaseLost` naming who holds `task`'s lease now and since when (`NotFound` without a task).
pub(super) fn lost_lease(conn: &Connection, task: &str) -> rusqlite::Result<StoreError> {
    let row: Option<(Option<String>, Option<i64>)> = conn
        .prepare_cached("SELECT lease_holder, lease_acquired_at FROM tasks WHERE id = ?")?
        .query_row([task], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    Ok(match row {
        None => StoreError::NotFound(task.to_owned()),
        Some((holder, since)) => crate::fenced::lease_lost(task, holder, since),
    })
}

/// Takes the lease of the oldest claimable task.
pub(super) struct Claim {
    pub(super) claim: LeaseClaim,
    pub(super) batch: Option<String>,
    pub(super) now: i64,
    pub(super) expires_at: i64,
}

impl Claim {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<Option<Claimed>> {
        // Claimable: queued, past its backoff, nobody's lease, its batch open; oldest first. A
        // lease still recorded there expired without being released: the claim takes it over.
        // The writer is the only one writing, so the pick and the claim are one decision.
        let picked = conn
            .prepare_cached(
                "SELECT t.id, t.lease_token IS NOT NULL FROM tasks t WHERE t.queue = 'queued' AND (t.not_before IS NULL OR t.not_before <= ?1) \
                     AND (t.lease_token IS NULL OR t.lease_expires_at <= ?1) \
                     AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open') \
                     AND (?2 IS NULL OR t.batch_id = ?2) ORDER BY t.created_at, t.id LIMIT 1",
            )?
            .query_row(params![self.now, self.batch], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, bool>(1)?))
            })
            .optional()?;
        let Some((picked, took_over)) = picked else {
            return Ok(None);
        };
        let claimed = conn
            .prepare_cached(
                "UPDATE tasks SET lease_token = ?2, lease_holder = ?3, lease_process = ?4, lease_acquired_at = ?1, lease_expires_at = ?5 \
                 WHERE id = ?6 RETURNING id, batch_id, tries",
            )?
            .query_row(
                params![
                    self.now,
                    self.claim.token,
                    self.claim.holder,
                    self.claim.process,
                    self.expires_at,
                    picked
                ],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, Option<String>>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                },
            )
            .optional()?;
        Ok(claimed.map(|(task_id, batch_id, tries)| Claimed {
            task_id,
            batch_id,
            tries: u32::try_from(tries.max(0)).unwrap_or(u32::MAX),
            lease: LeaseInfo {
                token: self.claim.token.clone(),
                holder: self.claim.holder.clone(),
                process: self.claim.process.clone(),
                acquired_at: self.now,
                expires_at: self.expires_at,
            },
            took_over,
        }))
    }
}

/// One request's place in a rolling rate window, if it fits.
pub(super) struct Rate {
    pub(super) scope: String,
    pub(super) limit: RateLimit,
    pub(super) tokens: u64,
    pub(super) now: i64,
}

impl Rate {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<RateDecision> {
        // The writer holds the database's write lock: every caller of every process reads and
        // writes the window in turn.
        conn.prepare_cached("DELETE FROM rate_events WHERE scope = ? AND at <= ?")?
            .execute(params![self.scope, self.now - RATE_WINDOW_MS])?;
        let mut select = conn.prepare_cached(
            "SELECT at, requests, tokens FROM rate_events WHERE scope = ? ORDER BY at",
        )?;
        let window = select
            .query_map([&self.scope], |row| {
                Ok(RateEntry {
                    at: row.get(0)?,
                    requests: row.get::<_, i64>(1)?.max(0) as u64,
                    tokens: row.get::<_, i64>(2)?.max(0) as u64,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let decision = rate_decision(&self.limit, self.now, &window, self.tokens);
        if decision == RateDecision::Granted {
            conn.prepare_cached(
                "INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 1, ?)",
            )?
            .execute(params![
                self.scope,
                self.now,
                self.tokens.min(i64::MAX as u64) as i64
            ])?;
        }
        Ok(decision)
    }
}

/// Tokens learnt after a request, added to its window.
pub(super) struct RateTokens {
    pub(super) scope: String,
    pub(super) tokens: u64,
    pub(super) now: i64,
}

impl RateTokens {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        conn.prepare_cached(
            "INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 0, ?)",
        )?
        .execute(params![
            self.scope,
            self.now,
            self.tokens.min(i64::MAX as u64) as i64
        ])?;
        Ok(())
    }
}
