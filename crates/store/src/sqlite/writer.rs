//! Group commit: one writer thread owns one connection and commits the hot-path writes of every
//! task of the process together, so many concurrent tasks share one WAL sync instead of paying
//! one each.
//!
//! The writer takes the first waiting request, drains whatever else is waiting at that moment
//! (at most `MAX_GROUP`), and runs them in ONE `BEGIN IMMEDIATE` … `COMMIT`, each request under
//! its own SAVEPOINT (`ops.rs`): a request that fails (a version `Conflict`, a failing
//! statement) is rolled back to its savepoint and gets its own error while the others still
//! commit. Every request is answered only after `COMMIT` returned, so "committed" means on disk
//! under the configured `synchronous` setting, exactly as with one transaction per write. While
//! one group syncs, the next one gathers. The recall entries a group's writes insert are indexed
//! in full text once, after the last savepoint and before `COMMIT` (`defer_index`, migration 16):
//! one segment per group instead of one per write.
//!
//! The writer is a plain thread with its own connection, so a whole group runs without one
//! thread hop per statement (which is what a pooled async connection costs, and what limited
//! group commit to ~2,500 steps/s here).
//!
//! The other writes of the process (creating and forking tasks, enqueueing, taking a lease, ...)
//! run on a pooled connection while the writer waits between two groups (`turn`): within the
//! process nobody waits on SQLite's busy handler, which would lose every race against a writer
//! that commits back to back.
//!
//! Requests travel through a bounded channel (callers wait when it is full); a writer that is
//! gone answers with an error, never a hang.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use super::checkpoint::{Checkpointer, hand_over};
use super::ops::{Applied, Failure, Reply, Write};
use crate::{Result, StoreError, metrics};

/// Requests waiting for the writer before callers wait to hand theirs over.
const QUEUE: usize = 1024;
/// Writes committed together at most.
const MAX_GROUP: usize = 256;
/// How long the writer waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A write handed to the writer, where its answer goes, and when it was handed over
/// (`skillstate_sqlite_write_wait_seconds`).
struct Handed {
    write: Box<Write>,
    reply: oneshot::Sender<Result<Reply>>,
    since: Instant,
}

enum Request {
    Write(Handed),
    /// Wait, holding no lock, until the `Turn` guard sent back is dropped.
    Turn(oneshot::Sender<Turn>),
    /// Finish what was handed over, then stop; answered once the writer's connections are
    /// closed and its threads gone.
    Close(oneshot::Sender<()>),
}

pub(super) struct Writer {
    sender: mpsc::Sender<Request>,
    location: String,
}

/// The writer's turn, given to a writer of the pool: the writer waits until this is dropped.
pub(super) struct Turn {
    done: Option<oneshot::Sender<()>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

impl Writer {
    /// Opens the writer's connection to `path` and starts the writer thread.
    /// `synchronous` is the value of SQLite's `synchronous` pragma (`FULL`, `NORMAL`, `OFF`).
    pub(super) async fn start(
        path: &Path,
        synchronous: &'static str,
        location: &str,
    ) -> Result<Self> {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let (ready, opened) = oneshot::channel();
        let path = path.to_owned();
        let name = location.to_owned();
        std::thread::Builder::new()
            .name("skillstate-sqlite-writer".into())
            .spawn(move || match open(&path, synchronous) {
                Ok(conn) => {
                    let checkpointer = start_checkpoints(&conn, &path, synchronous, &name);
                    let _ = ready.send(Ok(()));
                    let closed = run(&conn, receiver, &name, checkpointer.as_ref());
                    if let Some(checkpointer) = checkpointer {
                        checkpointer.stop();
                    }
                    drop(conn);
                    if let Some(closed) = closed {
                        let _ = closed.send(());
                    }
                }
                Err(error) => {
                    let _ = ready.send(Err(error.to_string()));
                }
            })
            .map_err(|e| StoreError::Open {
                location: location.to_owned(),
                message: format!("cannot start the writer thread: {e}"),
            })?;
        let open_error = |message: String| StoreError::Open {
            location: location.to_owned(),
            message,
        };
        opened
            .await
            .map_err(|_| open_error("the writer thread stopped while opening".into()))?
            .map_err(open_error)?;
        Ok(Self {
            sender,
            location: location.to_owned(),
        })
    }

    fn gone(&self) -> StoreError {
        StoreError::Write {
            location: self.location.clone(),
            message: "the store's writer has stopped (the store was closed, or its thread failed); nothing more can be written through this store — open it again".into(),
        }
    }

    /// Hands `write` to the writer and waits until it is committed (or failed).
    pub(super) async fn submit(&self, write: Write) -> Result<Reply> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request::Write(Handed {
                write: Box::new(write),
                reply,
                since: Instant::now(),
            }))
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())?
    }

    /// Waits for the writer to finish its current group and stand still until the turn is
    /// dropped.
    pub(super) async fn turn(&self) -> Result<Turn> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Request::Turn(reply))
            .await
            .map_err(|_| self.gone())?;
        answer.await.map_err(|_| self.gone())
    }

    /// Commits what was handed over, then stops the writer; later writes fail with an error.
    /// Returns once the writer's connections are closed (at once when it had stopped).
    pub(super) async fn close(&self) {
        let (closed, gone) = oneshot::channel();
        if self.sender.send(Request::Close(closed)).await.is_ok() {
            // An error here: the thread ended without answering, which also means gone.
            let _ = gone.await;
        }
    }
}

fn open(path: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // Each write of a group runs under a savepoint, whose rollback journal SQLite keeps in a
    // temporary file by default: created, grown and unlinked once per group, and the unlink
    // (dropping its pages from the page cache) cost more than the group's own writes. A
    // group's savepoint journal is small; memory holds it.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Moves the WAL checkpoints of `conn` to a [`Checkpointer`] of their own. When that cannot
/// start, `conn` keeps checkpointing as SQLite does by default (slower, never wrong).
fn start_checkpoints(
    conn: &Connection,
    path: &Path,
    synchronous: &str,
    location: &str,
) -> Option<Checkpointer> {
    let started = Checkpointer::start(path, synchronous).and_then(|checkpointer| {
        hand_over(conn)
            .map(|()| checkpointer)
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(checkpointer) => Some(checkpointer),
        Err(error) => {
            tracing::warn!(%location, %error, "SQLite checkpoints stay on the writer's thread");
            None
        }
    }
}

/// Serves requests until the store is dropped or closed; returns how to answer the close.
fn run(
    conn: &Connection,
    mut receiver: mpsc::Receiver<Request>,
    location: &str,
    checkpointer: Option<&Checkpointer>,
) -> Option<oneshot::Sender<()>> {
    let mut group: Vec<Handed> = Vec::with_capacity(MAX_GROUP);
    let mut pending: Option<Request> = None;
    loop {
        let first = match pending.take() {
            Some(request) => request,
            // Every sender gone: the store was dropped without closing.
            None => receiver.blocking_recv()?,
        };
        match first {
            Request::Write(handed) => group.push(handed),
            Request::Turn(reply) => {
                let (done, finished) = oneshot::channel();
                // A caller that stopped waiting drops the turn at once.
                let _ = reply.send(Turn { done: Some(done) });
                let _ = finished.blocking_recv();
                continue;
            }
            Request::Close(closed) => return Some(closed),
        }
        while group.len() < MAX_GROUP {
            match receiver.try_recv() {
                Ok(Request::Write(handed)) => group.push(handed),
                Ok(other) => {
                    // Served after this group.
                    pending = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let began = Instant::now();
        for handed in &group {
            metrics::write_waited(began.saturating_duration_since(handed.since));
        }
        let writes: Vec<&Write> = group.iter().map(|handed| &*handed.write).collect();
        let (results, commit) = commit_group(conn, &writes, location);
        metrics::group_committed(writes.len(), began.elapsed(), commit);
        if let Some(checkpointer) = checkpointer {
            checkpointer.nudge();
        }
        for (handed, result) in group.drain(..).zip(results) {
            // A caller that stopped waiting no longer needs its answer.
            let _ = handed.reply.send(result);
        }
        // After the answers: the group is committed, and its callers need not wait for the
        // log to start over.
        if let Some(checkpointer) = checkpointer {
            checkpointer.restart_if_due(conn, BUSY_TIMEOUT);
        }
    }
}

/// Runs `writes` in one transaction, each under its own savepoint, and returns one result per
/// write, in order, and how long the COMMIT took. A write reported `Ok` is committed.
fn commit_group(
    conn: &Connection,
    writes: &[&Write],
    location: &str,
) -> (Vec<Result<Reply>>, Duration) {
    let error = |failure: Failure| match failure {
        Failure::Refused(error) => error,
        Failure::Sql(error) => StoreError::Write {
            location: location.to_owned(),
            message: error.to_string(),
        },
        Failure::TransactionLost => StoreError::Write {
            location: location.to_owned(),
            message: "the transaction ended unexpectedly".into(),
        },
    };
    if let Err(failure) = conn.execute_batch("BEGIN IMMEDIATE") {
        let message = failure.to_string();
        let failed = writes
            .iter()
            .map(|_| {
                Err(StoreError::Write {
                    location: location.to_owned(),
                    message: message.clone(),
                })
            })
            .collect();
        return (failed, Duration::ZERO);
    }
    let mut results = Vec::with_capacity(writes.len());
    // Set when the transaction itself broke.
    let mut broken = false;
    if let Err(failure) = defer_index(conn) {
        let message = failure.to_string();
        results.extend(writes.iter().map(|_| {
            Err(StoreError::Write {
                location: location.to_owned(),
                message: message.clone(),
            })
        }));
        broken = true;
    }
    for write in writes {
        if broken {
            break;
        }
        match write.apply(conn) {
            Applied::Done(result) => results.push(result.map_err(error)),
            Applied::Broken(failure) => {
                results.push(Err(error(failure)));
                broken = true;
            }
        }
    }
    let mut committing = Duration::ZERO;
    let commit = if broken {
        Err("an earlier write of the same group broke the transaction".to_owned())
    } else {
        index_deferred(conn)
            .and_then(|()| {
                let started = Instant::now();
                let committed = conn.execute_batch("COMMIT");
                committing = started.elapsed();
                committed
            })
            .map_err(|e| e.to_string())
    };
    if let Err(message) = commit {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        // Nothing of the group is on disk: every write that had succeeded fails now, and the
        // writes never tried fail too.
        let failed = || StoreError::Write {
            location: location.to_owned(),
            message: message.clone(),
        };
        let mut all: Vec<Result<Reply>> = results
            .into_iter()
            .map(|result| result.and_then(|_| Err(failed())))
            .collect();
        all.resize_with(writes.len(), || Err(failed()));
        return (all, committing);
    }
    (results, committing)
}

/// Marks the group's transaction so that the recall entries its writes insert are indexed
/// once, by [`index_deferred`], instead of one full-text segment per write's savepoint
/// (migration 16 says why).
fn defer_index(conn: &Connection) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO recall_deferred (mark) SELECT COALESCE(MAX(id), 0) FROM recall_entries",
    )?
    .execute([])?;
    Ok(())
}

/// Indexes the recall entries the group's writes inserted (every id above the mark) and
/// removes the mark, in the group's transaction, after its last savepoint.
fn index_deferred(conn: &Connection) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO recall_fts (rowid, task_key, text) \
         SELECT id, 't' || replace(task_id, '-', ''), text FROM recall_entries \
         WHERE id > (SELECT mark FROM recall_deferred)",
    )?
    .execute([])?;
    conn.prepare_cached("DELETE FROM recall_deferred")?
        .execute([])?;
    Ok(())
}
