//! The writes that go through the group-commit writer (`writer.rs`) as owned values, with every
//! JSON column already serialised by the caller, so the writer only runs SQL: new tasks
//! (`ops_tasks.rs`), steps, rejections, tool results and statuses with their events
//! (`ops_steps.rs`), steps written from outside a runner (`ops_state.rs`), lease heartbeats
//! and releases, claims, settles and rate windows (`ops_queue.rs`), API keys (`ops_keys.rs`),
//! boards and a step with its board write (`ops_boards.rs`).
//! Each runs inside the transaction the writer opened, on the writer's own connection.

use rusqlite::Connection;

use super::ops_boards::{Attach, BoardWriteOp, DeleteBoard, NewBoardWrite, StepWithBoard};
use super::ops_fenced::Fenced;
use super::ops_keys::{NewKey, RevokeKey};
use super::ops_queue::{Claim, Rate, RateTokens, Release, Renew, Settle};
use super::ops_state::UnleasedStep;
use super::ops_steps::{ActionDone, Rejection, Status, Step};
use super::ops_submit::SubmitBatch;
use super::ops_tasks::{NewTasks, OwnedTask};
use crate::StoreError;
use crate::queue::{Claimed, RateDecision};

/// One write.
// Travels boxed (`writer::Handed`), so the sizes of its variants cost nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Write {
    NewTasks(NewTasks),
    OwnedTask(OwnedTask),
    Step(Step),
    UnleasedStep(UnleasedStep),
    Rejection(Rejection),
    ActionDone(ActionDone),
    Status(Status),
    Renew(Renew),
    Release(Release),
    Settle(Settle),
    Claim(Claim),
    Rate(Rate),
    RateTokens(RateTokens),
    NewKey(NewKey),
    RevokeKey(RevokeKey),
    NewBoard(NewBoardWrite),
    OnBoard(BoardWriteOp),
    StepWithBoard(StepWithBoard),
    Attach(Attach),
    DeleteBoard(DeleteBoard),
    /// A runner's write under its lease, checked first in the same savepoint.
    Fenced(Fenced),
    SubmitBatch(SubmitBatch),
}

/// What a write answers besides success.
#[derive(Debug)]
pub(super) enum Reply {
    Done,
    Claimed(Option<Claimed>),
    Rate(RateDecision),
    /// A task's id, and whether the write created it.
    Task(String, bool),
}

/// Why a write did not happen.
pub(super) enum Failure {
    /// A condition refused it (a stale version, a lost lease, no pending intent): the caller's
    /// error.
    Refused(StoreError),
    /// SQLite failed a statement.
    Sql(rusqlite::Error),
    /// The transaction ended under the writer's feet.
    TransactionLost,
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Refused(error)
    }
}

pub(super) type OpResult<T> = std::result::Result<T, Failure>;

/// What applying a write came to.
pub(super) enum Applied {
    /// The write happened, or failed and left nothing behind; the transaction goes on.
    Done(std::result::Result<Reply, Failure>),
    /// The write failed and the transaction is gone (SQLite rolls it back on some I/O errors):
    /// nothing of the group is kept.
    Broken(Failure),
}

impl Write {
    /// Runs the write inside the caller's transaction, under `SAVEPOINT one`: a write that
    /// fails, for whatever reason, is rolled back to it and leaves nothing behind.
    pub(super) fn apply(&self, conn: &Connection) -> Applied {
        if let Err(error) = run_cached(conn, "SAVEPOINT one") {
            return Applied::Broken(Failure::Sql(error));
        }
        let result = self.run(conn);
        let end = match result {
            Ok(_) => run_cached(conn, "RELEASE one"),
            Err(_) => {
                run_cached(conn, "ROLLBACK TO one").and_then(|()| run_cached(conn, "RELEASE one"))
            }
        };
        match (end, result) {
            (Ok(()), result) if !conn.is_autocommit() => Applied::Done(result),
            (_, Err(failure)) => Applied::Broken(failure),
            (Err(error), Ok(_)) => Applied::Broken(Failure::Sql(error)),
            (Ok(()), Ok(_)) => Applied::Broken(Failure::TransactionLost),
        }
    }

    /// The write's statements, in the caller's savepoint.
    pub(super) fn run(&self, conn: &Connection) -> std::result::Result<Reply, Failure> {
        match self {
            Write::NewTasks(write) => write.run(conn).map(|()| Reply::Done),
            Write::OwnedTask(write) => write
                .run(conn)
                .map(|(id, created)| Reply::Task(id, created)),
            Write::Step(write) => write.run(conn).map(|()| Reply::Done),
            Write::UnleasedStep(write) => write.run(conn).map(|()| Reply::Done),
            Write::Rejection(write) => write.run(conn).map(|()| Reply::Done),
            Write::ActionDone(write) => write.run(conn).map(|()| Reply::Done),
            Write::Status(write) => write.run(conn).map(|()| Reply::Done),
            Write::Renew(write) => write.run(conn).map(|()| Reply::Done),
            Write::Release(write) => write.run(conn).map(|()| Reply::Done),
            Write::Settle(write) => write.run(conn).map(|()| Reply::Done),
            Write::Claim(write) => write.run(conn).map(Reply::Claimed),
            Write::Rate(write) => write.run(conn).map(Reply::Rate),
            Write::RateTokens(write) => write.run(conn).map(|()| Reply::Done),
            Write::NewKey(write) => write.run(conn).map(|()| Reply::Done),
            Write::RevokeKey(write) => write.run(conn).map(|()| Reply::Done),
            Write::NewBoard(write) => write.run(conn).map(|()| Reply::Done),
            Write::OnBoard(write) => write.run(conn).map(|()| Reply::Done),
            Write::StepWithBoard(write) => write.run(conn).map(|()| Reply::Done),
            Write::Attach(write) => write.run(conn).map(|()| Reply::Done),
            Write::DeleteBoard(write) => write.run(conn).map(|()| Reply::Done),
            Write::Fenced(write) => write.run(conn),
            Write::SubmitBatch(write) => write.run(conn).map(|()| Reply::Done),
        }
    }
}

fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}
