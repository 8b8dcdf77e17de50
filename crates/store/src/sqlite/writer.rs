//! Group commit: one writer task owns one connection and commits the hot-path writes of every
//! task of the process together, so many concurrent tasks share one WAL sync instead of paying
//! one each.
//!
//! The writer takes the first waiting request, drains whatever else is waiting at that moment
//! (at most `MAX_GROUP`), and runs them in ONE `BEGIN IMMEDIATE` … `COMMIT`, each request under
//! its own SAVEPOINT (`ops.rs`): a request that fails (a version `Conflict`, a failing
//! statement) changes nothing, or is rolled back to its savepoint, and gets its own error while
//! the others still commit. Every request is answered only after `COMMIT` returned, so
//! "committed" means on disk under the configured `synchronous` setting, exactly as with one
//! transaction per write. While one group syncs, the next one gathers.
//!
//! The other writes of the process (creating and forking tasks, enqueueing, taking a lease, ...)
//! borrow the writer's connection between groups (`lend`) and run their own transaction on it:
//! within the process nobody waits on SQLite's busy handler, which would lose every race
//! against a writer that commits back to back.
//!
//! Requests travel through a bounded channel (callers wait when it is full); a writer that is
//! gone answers with an error, never a hang.

use std::ops::{Deref, DerefMut};

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::ops::{Applied, Reply, Write};
use crate::{Result, StoreError};

/// Requests waiting for the writer before callers wait to hand theirs over.
const QUEUE: usize = 1024;
/// Writes committed together at most.
const MAX_GROUP: usize = 256;

enum Request {
    Write {
        write: Box<Write>,
        reply: oneshot::Sender<Result<Reply>>,
    },
    /// Hand the connection over until the `Lent` guard is dropped.
    Lend(oneshot::Sender<Lent>),
}

pub(super) struct Writer {
    sender: mpsc::Sender<Request>,
    location: String,
}

/// The writer's connection, borrowed; goes back to the writer when dropped (also when the
/// borrower's future is cancelled; sqlx rolls back a transaction left open on it).
pub(super) struct Lent {
    conn: Option<SqliteConnection>,
    back: Option<oneshot::Sender<SqliteConnection>>,
}

impl Deref for Lent {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.conn.as_ref().expect("a lent connection until dropped")
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn.as_mut().expect("a lent connection until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let (Some(conn), Some(back)) = (self.conn.take(), self.back.take()) {
            let _ = back.send(conn);
        }
    }
}

impl Writer {
    /// Opens the writer's own connection and starts the writer task on the current runtime.
    pub(super) async fn start(options: &SqliteConnectOptions, location: &str) -> Result<Self> {
        let conn = SqliteConnection::connect_with(options)
            .await
            .map_err(|e| StoreError::Open {
                location: location.to_owned(),
                message: e.to_string(),
            })?;
        let (sender, receiver) = mpsc::channel(QUEUE);
        tokio::spawn(run(conn, receiver, location.to_owned()));
        Ok(Self {
            sender,
            location: location.to_owned(),
        })
    }

    fn gone(&self) -> StoreError {
        StoreError::Write {
            location: self.location.clone(),
            message: "the store's writer task has stopped (its runtime shut down?); nothing more can be written through this store — open it again".into(),
        }
    }

    /// Hands `write` to the writer and waits until it is committed (or failed).
    pub(super) async fn submit(&self, write: Write) -> Result<Reply> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request::Write {
                write: Box::new(write),
                reply,
            })
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?
    }

    /// Borrows the writer's connection between two groups.
    pub(super) async fn lend(&self) -> Result<Lent> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request::Lend(reply))
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }
}

async fn run(conn: SqliteConnection, mut receiver: mpsc::Receiver<Request>, location: String) {
    let mut conn = Some(conn);
    let mut group = Vec::with_capacity(MAX_GROUP);
    let mut pending: Option<Request> = None;
    loop {
        let first = match pending.take() {
            Some(request) => request,
            None => match receiver.recv().await {
                Some(request) => request,
                None => break,
            },
        };
        let Some(mut current) = conn.take() else {
            break;
        };
        match first {
            Request::Lend(reply) => {
                let (back, returned) = oneshot::channel();
                let lent = Lent {
                    conn: Some(current),
                    back: Some(back),
                };
                // A borrower that stopped waiting drops the guard, which sends it back.
                let _ = reply.send(lent);
                match returned.await {
                    Ok(returned) => conn = Some(returned),
                    // The guard was leaked with its connection: nothing more can be written.
                    Err(_) => break,
                }
                continue;
            }
            Request::Write { write, reply } => group.push((write, reply)),
        }
        while group.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(Request::Write { write, reply }) => group.push((write, reply)),
                Ok(lend) => {
                    // Served after this group.
                    pending = Some(lend);
                    break;
                }
                Err(_) => break,
            }
        }
        let writes: Vec<&Write> = group.iter().map(|(write, _)| &**write).collect();
        let results = commit_group(&mut current, &writes, &location).await;
        for ((_, reply), result) in group.drain(..).zip(results) {
            // A caller that stopped waiting no longer needs its answer.
            let _ = reply.send(result);
        }
        conn = Some(current);
    }
    if let Some(conn) = conn {
        let _ = conn.close().await;
    }
}

/// Runs `writes` in one transaction, each under its own savepoint, and returns one result per
/// write, in order. A write reported `Ok` is committed.
pub(super) async fn commit_group(
    conn: &mut SqliteConnection,
    writes: &[&Write],
    location: &str,
) -> Vec<Result<Reply>> {
    let failed = |message: String| StoreError::Write {
        location: location.to_owned(),
        message,
    };
    if let Err(error) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        let message = error.to_string();
        return writes
            .iter()
            .map(|_| Err(failed(message.clone())))
            .collect();
    }
    let mut results = Vec::with_capacity(writes.len());
    // Set when the transaction itself broke (SQLite rolls it back on some I/O errors).
    let mut broken: Option<String> = None;
    for write in writes {
        match write.apply(conn).await {
            Applied::Done(result) => results.push(result),
            Applied::Broken(error) => {
                broken = Some(error.to_string());
                results.push(Err(error));
                break;
            }
        }
    }
    let commit = match broken {
        Some(message) => Err(message),
        None => sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
    };
    if let Err(message) = commit {
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        // Nothing of the group is on disk: every write that had succeeded fails now, and the
        // writes never tried fail too.
        let mut all: Vec<Result<Reply>> = results
            .into_iter()
            .map(|result| result.and(Err(failed(message.clone()))))
            .collect();
        all.resize_with(writes.len(), || Err(failed(message.clone())));
        return all;
    }
    results
}
