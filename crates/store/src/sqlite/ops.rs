//! The writes that go through the group-commit writer (`writer.rs`) as owned values, with every
//! JSON column already serialised by the caller, so the writer only runs SQL: steps, rejections,
//! tool results and statuses (`ops_steps.rs`), lease heartbeats and releases, claims, settles
//! and rate windows (`ops_queue.rs`). Each runs inside the transaction the writer opened.

use sqlx::SqliteConnection;

use super::ops_queue::{Claim, Rate, RateTokens, Release, Renew, Settle};
use super::ops_steps::{ActionDone, Rejection, Status, Step};
use crate::queue::{Claimed, RateDecision};
use crate::{Result, StoreError};

/// One write.
pub(super) enum Write {
    Step(Step),
    Rejection(Rejection),
    ActionDone(ActionDone),
    Status(Status),
    Renew(Renew),
    Release(Release),
    Settle(Settle),
    Claim(Claim),
    Rate(Rate),
    RateTokens(RateTokens),
}

/// What a write answers besides success.
#[derive(Debug)]
pub(super) enum Reply {
    Done,
    Claimed(Option<Claimed>),
    Rate(RateDecision),
}

/// What applying a write came to.
pub(super) enum Applied {
    /// The write's own result; the transaction goes on.
    Done(Result<Reply>),
    /// The write failed and the transaction could not be brought back to before it: nothing of
    /// the group is kept.
    Broken(StoreError),
}

impl Write {
    /// Runs the write inside the caller's transaction, between `SAVEPOINT one` and `RELEASE
    /// one`, as few trips to SQLite's connection thread as it can (most writes are one
    /// multi-statement query). A write refused by a condition (a stale version, a lost lease,
    /// no pending intent) changes nothing: its later statements are guarded by `changes() = 1`.
    /// A statement that fails is undone by `ROLLBACK TO one`; when even that fails, the
    /// transaction is gone and `Broken` says so.
    pub(super) async fn apply(&self, conn: &mut SqliteConnection) -> Applied {
        let result = match self {
            Write::Step(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Rejection(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::ActionDone(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Status(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Renew(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Release(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Settle(write) => write.run(conn).await.map(|()| Reply::Done),
            Write::Claim(write) => write.run(conn).await.map(Reply::Claimed),
            Write::Rate(write) => write.run(conn).await.map(Reply::Rate),
            Write::RateTokens(write) => write.run(conn).await.map(|()| Reply::Done),
        };
        match result {
            Err(StoreError::Database(error)) => {
                match sqlx::raw_sql("ROLLBACK TO one; RELEASE one")
                    .execute(&mut *conn)
                    .await
                {
                    Ok(_) => Applied::Done(Err(StoreError::Database(error))),
                    Err(_) => Applied::Broken(StoreError::Database(error)),
                }
            }
            other => Applied::Done(other),
        }
    }
}
