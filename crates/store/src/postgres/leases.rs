//! Execution leases on PostgreSQL: one atomic UPDATE each, timed by the server's clock; a step
//! written without the lease checks it with the task's row locked until the step commits.

use async_trait::async_trait;
use sqlx::Row;

use super::PostgresStore;
use super::journal::{record_action_result_in, record_rejection_in, set_status_in};
use super::step_fn::LeaseCheck;
use crate::model::*;
use crate::rows::lease_from_row;
use crate::{LeasedWrite, Leases, Result, StoreError};

impl PostgresStore {
    /// `LeaseLost` naming who holds `task`'s lease now and since when (`NotFound` without a
    /// task).
    pub(super) async fn lost_lease(&self, task: &str) -> Result<StoreError> {
        let row = sqlx::query("SELECT lease_holder, lease_acquired_at FROM tasks WHERE id = $1")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            None => StoreError::NotFound(task.to_owned()),
            Some(row) => crate::fenced::lease_lost(
                task,
                row.try_get("lease_holder")?,
                row.try_get("lease_acquired_at")?,
            ),
        })
    }
}

#[async_trait]
impl Leases for PostgresStore {
    async fn acquire_lease(
        &self,
        task: &str,
        claim: &LeaseClaim,
        ttl_ms: u64,
        replacing: Option<&str>,
    ) -> Result<LeaseInfo> {
        self.pool
            .unit(|| async move {
                // The task's row is locked first, so the attempt and the read of who holds the lease
                // see the same lease: a holder that lets go in between cannot make a refused attempt
                // look like a missing task.
                let mut tx = self.pool.begin().await?;
                let exists = sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE")
                    .bind(task)
                    .fetch_optional(&mut *tx)
                    .await?;
                if exists.is_none() {
                    return Err(StoreError::NotFound(task.to_owned()));
                }
                // The server's clock decides expiry, so runners on several machines agree.
                let updated = sqlx::query(
                    "WITH now AS (SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS ms) \
                     UPDATE tasks SET lease_acquired_at = CASE WHEN lease_token IS NOT DISTINCT FROM $1 THEN lease_acquired_at ELSE now.ms END, \
                     lease_token = $1, lease_holder = $2, lease_process = $3, lease_expires_at = now.ms + $4 \
                     FROM now WHERE id = $5 AND (lease_token IS NULL OR lease_expires_at <= now.ms OR lease_token = $1 OR lease_token = $6)",
                )
                .bind(&claim.token)
                .bind(&claim.holder)
                .bind(&claim.process)
                .bind(ttl_ms.min(i64::MAX as u64 / 2) as i64)
                .bind(task)
                .bind(replacing)
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query(
                    "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = $1",
                )
                .bind(task)
                .fetch_one(&mut *tx)
                .await?;
                super::db::commit(tx).await?;
                match lease_from_row(&row)? {
                    Some(lease) if updated.rows_affected() == 1 && lease.token == claim.token => Ok(lease),
                    Some(lease) => Err(StoreError::Leased {
                        task: task.to_owned(),
                        lease: Box::new(lease),
                    }),
                    // Unreachable with the row locked: a free lease is taken.
                    None => Err(crate::fenced::lease_lost(task, None, None)),
                }
            })
            .await
    }

    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()> {
        // Renewing and releasing may run twice (`Db::unit`): both set the same values again.
        self.pool
            .unit(|| async move {
                let updated = sqlx::query(
                    "UPDATE tasks SET lease_expires_at = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + $1 WHERE id = $2 AND lease_token = $3",
                )
                .bind(ttl_ms.min(i64::MAX as u64 / 2) as i64)
                .bind(task)
                .bind(token)
                .execute(&self.pool)
                .await?;
                if updated.rows_affected() != 1 {
                    return Err(self.lost_lease(task).await?);
                }
                Ok(())
            })
            .await
    }

    async fn release_lease(&self, task: &str, token: &str) -> Result<()> {
        self.pool
            .unit(|| async move {
                sqlx::query(
                    "UPDATE tasks SET lease_token = NULL, lease_holder = NULL, lease_process = NULL, lease_acquired_at = NULL, lease_expires_at = NULL WHERE id = $1 AND lease_token = $2",
                )
                .bind(task)
                .bind(token)
                .execute(&self.pool)
                .await?;
                Ok(())
            })
            .await
    }

    async fn commit_unleased_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()> {
        // The lease check and the step are one statement with the task's row locked: no runner
        // takes the lease between the check and the step. The server's clock decides expiry,
        // as when leases are taken.
        self.step_unit(task, commit, || async move {
            self.commit_step_once(task, LeaseCheck::Unleased, expected_version, commit)
                .await
                .map(|_| ())
        })
        .await
    }

    async fn write_under_lease(
        &self,
        task: &str,
        token: &str,
        write: LeasedWrite<'_>,
    ) -> Result<Written> {
        match write {
            // Each unit reads whether it was recorded when its COMMIT's answer was lost
            // (`Db::checked_unit`); the lease check comes first each time it runs, in the
            // step's one statement (`step_fn.rs`).
            LeasedWrite::Step {
                expected_version,
                commit,
            } => {
                let waiting = self
                    .step_unit(task, commit, || async move {
                        self.commit_step_once(
                            task,
                            LeaseCheck::Token(token),
                            expected_version,
                            commit,
                        )
                        .await
                        .map(Some)
                    })
                    .await?;
                Ok(Written {
                    board_version: None,
                    messages_waiting: waiting,
                })
            }
            // A step with a board write commits in boards.rs, outside `Db::unit`.
            LeasedWrite::StepWithBoard { .. } => Ok(Written {
                board_version: self.write_under_lease_once(task, token, write).await?,
                messages_waiting: None,
            }),
            LeasedWrite::Rejection(entry) => self
                .pool
                .checked_unit(
                    || self.write_under_lease_once(task, token, write),
                    || self.holds_entry(task, entry),
                )
                .await
                .map(Written::board),
            LeasedWrite::ActionResult(result) => self
                .pool
                .checked_unit(
                    || self.write_under_lease_once(task, token, write),
                    || self.holds_result(task, result),
                )
                .await
                .map(Written::board),
            LeasedWrite::Status { status, .. } => self
                .pool
                .checked_unit(
                    || self.write_under_lease_once(task, token, write),
                    || self.has_status(task, status),
                )
                .await
                .map(Written::board),
        }
    }

    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>> {
        let row = sqlx::query(
            "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = $1",
        )
        .bind(task)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(task.to_owned()))?;
        lease_from_row(&row)
    }
}

impl PostgresStore {
    /// `Leases::write_under_lease`, once: the lease check and the write in one transaction.
    pub(super) async fn write_under_lease_once(
        &self,
        task: &str,
        token: &str,
        write: LeasedWrite<'_>,
    ) -> Result<Option<u64>> {
        let mut tx = self.pool.begin().await?;
        // A step with a board write locks the board's row before the task's, as every
        // transaction that locks both does.
        if let LeasedWrite::StepWithBoard { board, .. } = write {
            sqlx::query("SELECT 1 FROM boards WHERE id = $1 FOR NO KEY UPDATE")
                .bind(board)
                .execute(&mut *tx)
                .await?;
        }
        // The task's row stays locked until the write commits: nobody takes the lease over
        // between this check and the write.
        let row = sqlx::query(
            "SELECT lease_token, lease_holder, lease_acquired_at FROM tasks WHERE id = $1 FOR NO KEY UPDATE",
        )
        .bind(task)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::NotFound(task.to_owned()))?;
        let holder: Option<String> = row.try_get("lease_token")?;
        if holder.as_deref() != Some(token) {
            let error = crate::fenced::lease_lost(
                task,
                row.try_get("lease_holder")?,
                row.try_get("lease_acquired_at")?,
            );
            tx.rollback().await?;
            return Err(error);
        }
        match write {
            LeasedWrite::Step {
                expected_version,
                commit,
            } => self
                .commit_step_in(tx, task, LeaseCheck::Skip, expected_version, commit)
                .await
                .map(|_| None),
            LeasedWrite::Rejection(entry) => {
                record_rejection_in(tx, task, entry).await.map(|()| None)
            }
            LeasedWrite::ActionResult(result) => record_action_result_in(tx, task, result)
                .await
                .map(|()| None),
            LeasedWrite::Status { status, outcome } => set_status_in(tx, task, status, outcome)
                .await
                .map(|()| None),
            LeasedWrite::StepWithBoard {
                expected_task_version,
                commit,
                board,
                expected_board_version,
                write,
            } => self
                .commit_step_with_board_in(
                    tx,
                    task,
                    expected_task_version,
                    commit,
                    board,
                    expected_board_version,
                    write,
                )
                .await
                .map(Some),
        }
    }
}
