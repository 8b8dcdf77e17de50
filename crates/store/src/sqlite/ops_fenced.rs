//! A runner's write under its execution lease: the lease is checked first, in the same
//! savepoint as the write, so a runner that lost it is told who holds the task now before any
//! other check of the write speaks, and nothing of the write is kept.

use rusqlite::{Connection, OptionalExtension};

use super::ops::{OpResult, Reply, Write};
use super::ops_queue::lost_lease;
use crate::StoreError;

pub(super) struct Fenced {
    pub(super) task: String,
    pub(super) token: String,
    pub(super) write: Box<Write>,
}

impl Fenced {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<Reply> {
        let holder: Option<Option<String>> = conn
            .prepare_cached("SELECT lease_token FROM tasks WHERE id = ?")?
            .query_row([&self.task], |row| row.get(0))
            .optional()?;
        match holder {
            None => return Err(StoreError::NotFound(self.task.clone()).into()),
            Some(Some(token)) if token == self.token => {}
            Some(_) => return Err(lost_lease(conn, &self.task)?.into()),
        }
        self.write.run(conn)
    }
}
