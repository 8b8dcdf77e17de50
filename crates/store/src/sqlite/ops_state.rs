//! The group-commit writer's state write from outside any runner (`Leases::commit_unleased_step`):
//! an accepted step, refused while a live lease is held on the task. The lease is read inside
//! the writer's transaction, which holds SQLite's write lock, so no runner takes it between the
//! check and the step.

use rusqlite::{Connection, OptionalExtension};

use super::ops::OpResult;
use super::ops_steps::Step;
use crate::StoreError;
use crate::model::LeaseInfo;

pub(super) struct UnleasedStep {
    pub(super) task: String,
    pub(super) step: Step,
    /// Unix milliseconds: a lease expiring at or before this is free.
    pub(super) now: i64,
}

impl UnleasedStep {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let lease = conn
            .prepare_cached(
                "SELECT lease_token, lease_holder, lease_process, lease_acquired_at, lease_expires_at FROM tasks WHERE id = ?",
            )?
            .query_row([&self.task], |row| {
                Ok(row.get::<_, Option<String>>(0)?.map(|token| {
                    (
                        token,
                        row.get::<_, Option<String>>(1),
                        row.get::<_, Option<String>>(2),
                        row.get::<_, Option<i64>>(3),
                        row.get::<_, Option<i64>>(4),
                    )
                }))
            })
            .optional()?;
        let Some(lease) = lease else {
            return Err(StoreError::NotFound(self.task.clone()).into());
        };
        if let Some((token, holder, process, acquired_at, expires_at)) = lease {
            let expires_at = expires_at?.unwrap_or(0);
            if expires_at > self.now {
                return Err(StoreError::Leased {
                    task: self.task.clone(),
                    lease: Box::new(LeaseInfo {
                        token,
                        holder: holder?.unwrap_or_default(),
                        process: process?.unwrap_or_default(),
                        acquired_at: acquired_at?.unwrap_or(0),
                        expires_at,
                    }),
                }
                .into());
            }
        }
        self.step.run(conn)
    }
}
