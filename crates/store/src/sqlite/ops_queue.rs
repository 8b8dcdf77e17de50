//! The lease and queue writes of the group-commit writer: heartbeats, releases, settles,
//! claims and shared rate windows. Two claims in one group see each other (same transaction),
//! so they never take the same task.

use sqlx::{Row, SqliteConnection};

use crate::model::LeaseClaim;
use crate::queue::{Claimed, RateDecision, RateLimit};
use crate::queue_rows::{RATE_WINDOW_MS, RateEntry, rate_decision};
use crate::rows::lease_from_row;
use crate::{Result, StoreError};

/// Extends the lease `token` holds.
pub(super) struct Renew {
    pub(super) task: String,
    pub(super) token: String,
    pub(super) expires_at: i64,
}

impl Renew {
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let renewed = sqlx::query(
            "SAVEPOINT one; UPDATE tasks SET lease_expires_at = ? WHERE id = ? AND lease_token = ? RETURNING id; RELEASE one",
        )
        .bind(self.expires_at)
        .bind(&self.task)
        .bind(&self.token)
        .fetch_all(&mut *conn)
        .await?;
        if renewed.is_empty() {
            return Err(StoreError::LeaseLost {
                task: self.task.clone(),
            });
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
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        sqlx::query(
            "SAVEPOINT one; UPDATE tasks SET lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL WHERE id = ? AND lease_token = ?; RELEASE one",
        )
        .bind(&self.task)
        .bind(&self.token)
        .execute(&mut *conn)
        .await?;
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
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        let settled = sqlx::query(
            "SAVEPOINT one; \
             UPDATE tasks SET queue = ?, tries = tries + ?, not_before = ?, failure = COALESCE(?, failure), updated_at = ?, \
             lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL \
             WHERE id = ? AND lease_token = ? RETURNING id; \
             RELEASE one",
        )
        .bind(self.queue)
        .bind(self.tries)
        .bind(self.not_before)
        .bind(&self.failure)
        .bind(self.now)
        .bind(&self.task)
        .bind(&self.token)
        .fetch_all(&mut *conn)
        .await?;
        if !settled.is_empty() {
            return Ok(());
        }
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM tasks WHERE id = ?")
            .bind(&self.task)
            .fetch_optional(&mut *conn)
            .await?;
        Err(match found {
            None => StoreError::NotFound(self.task.clone()),
            Some(_) => StoreError::LeaseLost {
                task: self.task.clone(),
            },
        })
    }
}

/// Takes the lease of the oldest claimable task.
pub(super) struct Claim {
    pub(super) claim: LeaseClaim,
    pub(super) batch: Option<String>,
    pub(super) now: i64,
    pub(super) expires_at: i64,
}

impl Claim {
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<Option<Claimed>> {
        // Claimable: queued, past its backoff, nobody's lease, its batch open; oldest first.
        let row = sqlx::query(
            "SAVEPOINT one; \
             UPDATE tasks SET lease_token = ?2, lease_holder = ?3, lease_process = ?4, lease_acquired_at = ?1, lease_expires_at = ?5 \
             WHERE id = (SELECT t.id FROM tasks t WHERE t.queue = 'queued' AND (t.not_before IS NULL OR t.not_before <= ?1) \
                 AND (t.lease_token IS NULL OR t.lease_expires_at <= ?1) \
                 AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.id = t.batch_id AND b.state <> 'open') \
                 AND (?6 IS NULL OR t.batch_id = ?6) ORDER BY t.created_at, t.id LIMIT 1) \
             RETURNING id, batch_id, tries, lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at; \
             RELEASE one",
        )
        .bind(self.now)
        .bind(&self.claim.token)
        .bind(&self.claim.holder)
        .bind(&self.claim.process)
        .bind(self.expires_at)
        .bind(&self.batch)
        // All rows, so that the query runs to its RELEASE.
        .fetch_all(&mut *conn)
        .await?;
        let Some(row) = row.first() else {
            return Ok(None);
        };
        let lease = lease_from_row(row)?.ok_or_else(|| StoreError::Decode {
            what: "claimed task".into(),
            message: "the claim wrote no lease".into(),
        })?;
        Ok(Some(Claimed {
            task_id: row.try_get("id")?,
            batch_id: row.try_get("batch_id")?,
            tries: u32::try_from(row.try_get::<i64, _>("tries")?.max(0)).unwrap_or(u32::MAX),
            lease,
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
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<RateDecision> {
        // The writer holds the database's write lock: every caller of every process reads and
        // writes the window in turn.
        sqlx::query("SAVEPOINT one; DELETE FROM rate_events WHERE scope = ? AND at <= ?")
            .bind(&self.scope)
            .bind(self.now - RATE_WINDOW_MS)
            .execute(&mut *conn)
            .await?;
        let window: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT at, requests, tokens FROM rate_events WHERE scope = ? ORDER BY at",
        )
        .bind(&self.scope)
        .fetch_all(&mut *conn)
        .await?;
        let window: Vec<RateEntry> = window
            .into_iter()
            .map(|(at, requests, tokens)| RateEntry {
                at,
                requests: requests.max(0) as u64,
                tokens: tokens.max(0) as u64,
            })
            .collect();
        let decision = rate_decision(&self.limit, self.now, &window, self.tokens);
        if decision == RateDecision::Granted {
            sqlx::query(
                "INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 1, ?); RELEASE one",
            )
            .bind(&self.scope)
            .bind(self.now)
            .bind(self.tokens.min(i64::MAX as u64) as i64)
            .execute(&mut *conn)
            .await?;
        } else {
            sqlx::query("RELEASE one").execute(&mut *conn).await?;
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
    pub(super) async fn run(&self, conn: &mut SqliteConnection) -> Result<()> {
        sqlx::query(
            "SAVEPOINT one; INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 0, ?); RELEASE one",
        )
        .bind(&self.scope)
        .bind(self.now)
        .bind(self.tokens.min(i64::MAX as u64) as i64)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}
