//! Execution leases on SQLite: an acquisition is one immediate transaction (the attempt and the
//! read of the holder); heartbeats and releases are one UPDATE each, and a step written without
//! the lease checks it in the same savepoint (`ops_state.rs`), in the group-commit writer's
//! groups.

use async_trait::async_trait;
use sqlx::Connection;

use super::SqliteStore;
use super::ops::Write;
use super::ops_boards::StepWithBoard;
use super::ops_fenced::Fenced;
use super::ops_queue::{Release, Renew};
use super::ops_state::UnleasedStep;
use super::ops_steps::{ActionDone, Rejection, Status, Step};
use crate::model::*;
use crate::rows::{lease_from_row, to_json};
use crate::{LeasedWrite, Leases, Result, StoreError, now_millis};

const LEASE_OF_TASK: &str = "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = ?";

#[async_trait]
impl Leases for SqliteStore {
    async fn acquire_lease(
        &self,
        task: &str,
        claim: &LeaseClaim,
        ttl_ms: u64,
        replacing: Option<&str>,
    ) -> Result<LeaseInfo> {
        let now = now_millis();
        let mut conn = self.write_conn().await?;
        // The attempt and the read of who holds the lease are one transaction: a holder that
        // lets go in between cannot make a refused attempt look like a missing task.
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let updated = sqlx::query(
            "UPDATE tasks SET lease_acquired_at = CASE WHEN lease_token IS ?1 THEN lease_acquired_at ELSE ?2 END, \
             lease_token = ?1, lease_holder = ?3, lease_process = ?4, lease_expires_at = ?5 \
             WHERE id = ?6 AND (lease_token IS NULL OR lease_expires_at <= ?2 OR lease_token = ?1 OR lease_token IS ?7)",
        )
        .bind(&claim.token)
        .bind(now)
        .bind(&claim.holder)
        .bind(&claim.process)
        .bind(now.saturating_add(ttl_ms.min(i64::MAX as u64) as i64))
        .bind(task)
        .bind(replacing)
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(LEASE_OF_TASK)
            .bind(task)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        drop(conn);
        let lease = match row {
            Some(row) => lease_from_row(&row)?,
            None => return Err(StoreError::NotFound(task.to_owned())),
        };
        match lease {
            Some(lease) if updated.rows_affected() == 1 && lease.token == claim.token => Ok(lease),
            Some(lease) => Err(StoreError::Leased {
                task: task.to_owned(),
                lease: Box::new(lease),
            }),
            // Unreachable inside the transaction: a free lease is taken.
            None => Err(crate::fenced::lease_lost(task, None, None)),
        }
    }

    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()> {
        self.write_done(Write::Renew(Renew {
            task: task.to_owned(),
            token: token.to_owned(),
            expires_at: now_millis().saturating_add(ttl_ms.min(i64::MAX as u64) as i64),
        }))
        .await
    }

    async fn release_lease(&self, task: &str, token: &str) -> Result<()> {
        self.write_done(Write::Release(Release {
            task: task.to_owned(),
            token: token.to_owned(),
        }))
        .await
    }

    async fn commit_unleased_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()> {
        let now = now_millis();
        self.write_done(Write::UnleasedStep(UnleasedStep {
            task: task.to_owned(),
            step: Step::new(task, expected_version, commit, self.snapshot_every, now),
            now,
        }))
        .await
    }

    async fn write_under_lease(
        &self,
        task: &str,
        token: &str,
        write: LeasedWrite<'_>,
    ) -> Result<Written> {
        let now = now_millis();
        let (inner, board_version) = match write {
            LeasedWrite::Step {
                expected_version,
                commit,
            } => (
                Write::Step(Step::new(
                    task,
                    expected_version,
                    commit,
                    self.snapshot_every,
                    now,
                )),
                None,
            ),
            LeasedWrite::Rejection(entry) => {
                (Write::Rejection(Rejection::new(task, entry, now)), None)
            }
            LeasedWrite::ActionResult(result) => {
                (Write::ActionDone(ActionDone::new(task, result, now)), None)
            }
            LeasedWrite::Status { status, outcome } => (
                Write::Status(Status {
                    task: task.to_owned(),
                    status,
                    outcome: outcome.map(to_json),
                    now,
                }),
                None,
            ),
            LeasedWrite::StepWithBoard {
                expected_task_version,
                commit,
                board,
                expected_board_version,
                write,
            } => (
                Write::StepWithBoard(StepWithBoard {
                    board: self.board_write_op(board, expected_board_version, write),
                    step: Step::new(
                        task,
                        expected_task_version,
                        commit,
                        self.snapshot_every,
                        now,
                    ),
                }),
                Some(expected_board_version + 1),
            ),
        };
        self.write_done(Write::Fenced(Fenced {
            task: task.to_owned(),
            token: token.to_owned(),
            write: Box::new(inner),
        }))
        .await?;
        Ok(Written {
            board_version,
            messages_waiting: None,
        })
    }

    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>> {
        let row = sqlx::query(
            "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = ?",
        )
        .bind(task)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::NotFound(task.to_owned()))?;
        lease_from_row(&row)
    }
}
