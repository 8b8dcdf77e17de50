//! A whole batch submitted at once (`Queue::submit_batch`): the batch row and every task, in
//! the writer's transaction under one savepoint, the tasks arriving in chunks through a
//! bounded channel while the savepoint is open. A feed that fails, or stops before its end,
//! rolls the savepoint back: neither the batch nor any task is kept.

use std::sync::Mutex;

use rusqlite::{Connection, params};
use tokio::sync::mpsc;

use super::ops::OpResult;
use super::ops_tasks::{TaskRow, insert_tasks};
use crate::StoreError;

/// What the feed sends the writer.
pub(super) enum Chunk {
    Rows(Vec<TaskRow>),
    /// Every task was sent.
    End,
    /// The feed failed: its message.
    Failed(String),
}

pub(super) struct SubmitBatch {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) spec: String,
    pub(super) on_error: &'static str,
    pub(super) max_retry: i64,
    pub(super) requests_per_minute: Option<i64>,
    pub(super) tokens_per_minute: Option<i64>,
    pub(super) now: i64,
    /// Read on the writer's own thread (a plain thread: it may block on the channel).
    pub(super) chunks: Mutex<mpsc::Receiver<Chunk>>,
}

impl SubmitBatch {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        conn.prepare_cached(
            "INSERT INTO batches (id, name, spec, on_error, max_retry, requests_per_minute, tokens_per_minute, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'open', ?)",
        )?
        .execute(params![
            self.id,
            self.name,
            self.spec,
            self.on_error,
            self.max_retry,
            self.requests_per_minute,
            self.tokens_per_minute,
            self.now
        ])?;
        let mut chunks = self
            .chunks
            .lock()
            .map_err(|_| StoreError::Feed("the batch's task feed was poisoned".into()))?;
        loop {
            match chunks.blocking_recv() {
                Some(Chunk::Rows(rows)) => insert_tasks(conn, &rows, Some(&self.id), self.now)?,
                Some(Chunk::End) => return Ok(()),
                Some(Chunk::Failed(message)) => return Err(StoreError::Feed(message).into()),
                None => {
                    return Err(StoreError::Feed(
                        "the batch's tasks stopped coming before their end; nothing of the batch was stored".into(),
                    )
                    .into());
                }
            }
        }
    }
}
