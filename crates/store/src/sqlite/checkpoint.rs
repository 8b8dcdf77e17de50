//! WAL checkpoints off the writer's path.
//!
//! SQLite copies the write-ahead log back into the database file in a checkpoint, which by
//! default runs inside the COMMIT that pushed the log past 1,000 pages: on the committing
//! thread, syncing the database file while every write handed to it waits. With group commit
//! that thread is the writer of the whole process, so each checkpoint stalled every task and
//! every HTTP write for its sync (4–7 ms here, the tail of README "Performance").
//!
//! The writer's connection therefore checkpoints never by itself (`wal_autocheckpoint = 0`);
//! after each group it nudges this module's thread, which runs `PRAGMA
//! wal_checkpoint(PASSIVE)` on a connection of its own. A passive checkpoint takes no lock that
//! writers wait on: it copies what no reader still needs and syncs the database file while the
//! writer goes on appending to the log. Nudges that arrive during a checkpoint fold into one
//! more run after it, and runs are at least `GAP` apart, so one checkpoint covers many groups.
//!
//! The log must also start over from its beginning now and then, or it grows without end: a
//! writer restarts it only when everything in it was copied AND no reader still reads from it,
//! which under steady load (point reads on other threads, commits back to back) is almost never
//! true. So once a passive checkpoint finds more than `RESTART_PAGES` pages in the log, the
//! writer itself, between two groups, runs a RESTART checkpoint: it waits for the readers of
//! the moment (point reads, microseconds; at most `RESTART_WAIT`), copies what is left (the
//! passive runs copied most of it), and the next group writes the log from its beginning.
//! That costs the writer one database-file sync per `RESTART_PAGES` pages instead of one per
//! 1,000. SQLite also checkpoints when the last connection to the file closes. The pool's
//! connections (rare writes) keep SQLite's default.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// The shortest time between two checkpoints.
const GAP: Duration = Duration::from_millis(50);
/// How long a checkpoint waits for readers or another process's checkpoint.
const BUSY: Duration = Duration::from_secs(2);
/// How long the writer waits for readers to leave the log before it starts it over (it tries
/// again after a later group when they outlast this).
const RESTART_WAIT: Duration = Duration::from_millis(100);
/// Pages in the log (copied or not) after which the writer makes it start over (4 KiB pages:
/// 16 MiB).
const RESTART_PAGES: i64 = 4_096;
/// Upper bound on the log file's size once it was started over.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// The writer's handle on the checkpointing thread; dropping it ends the thread.
pub(super) struct Checkpointer {
    nudge: SyncSender<()>,
    /// Set by the thread when the log is long: time to start it over.
    restart_due: Arc<AtomicBool>,
}

impl Checkpointer {
    /// Opens a connection of its own to `path` and starts the thread on it.
    pub(super) fn start(path: &Path, synchronous: &str) -> Result<Self, String> {
        let conn = open(path, synchronous).map_err(|e| e.to_string())?;
        let (nudge, nudged) = mpsc::sync_channel(1);
        let restart_due = Arc::new(AtomicBool::new(false));
        let due = restart_due.clone();
        std::thread::Builder::new()
            .name("skillstate-sqlite-checkpoint".into())
            .spawn(move || run(&conn, &nudged, &due))
            .map_err(|e| e.to_string())?;
        Ok(Self { nudge, restart_due })
    }

    /// Tells the thread that a group was committed (never waits).
    pub(super) fn nudge(&self) {
        match self.nudge.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    /// Called by the writer between two groups, on its own connection: starts the log over
    /// when it is due. A failure (a reader outlasting `BUSY`) leaves it due for the next time.
    /// `busy` is the writer's usual busy timeout, set back afterwards: the restart itself
    /// waits for readers at most `RESTART_WAIT`.
    pub(super) fn restart_if_due(&self, writer: &Connection, busy: Duration) {
        if !self.restart_due.swap(false, Ordering::Relaxed) {
            return;
        }
        let restarted = writer
            .busy_timeout(RESTART_WAIT)
            .and_then(|()| checkpoint(writer, "RESTART"));
        let _ = writer.busy_timeout(busy);
        match restarted {
            Ok(Pages { busy: false, .. }) => {}
            Ok(Pages { busy: true, .. }) => self.restart_due.store(true, Ordering::Relaxed),
            Err(error) => {
                tracing::debug!(%error, "SQLite could not start the write-ahead log over");
                self.restart_due.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Sets the writer's connection to leave checkpoints to the [`Checkpointer`].
pub(super) fn hand_over(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(())
}

fn open(path: &Path, synchronous: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    // How a checkpoint syncs the database file.
    conn.pragma_update(None, "synchronous", synchronous)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(conn)
}

fn run(conn: &Connection, nudged: &Receiver<()>, restart_due: &AtomicBool) {
    loop {
        match nudged.recv_timeout(Duration::from_secs(60)) {
            // Idle or nudged: a checkpoint costs nothing when the log was all copied.
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        match checkpoint(conn, "PASSIVE") {
            Ok(pages) => {
                // Under load a reader nearly always pins the newest pages, so "all copied"
                // is rare: the restart copies what is left.
                if pages.log > RESTART_PAGES {
                    restart_due.store(true, Ordering::Relaxed);
                }
            }
            Err(error) => {
                // Busy (another process checkpoints) or failing: the next nudge tries again;
                // the log's contents are safe either way.
                tracing::debug!(%error, "SQLite checkpoint did not complete");
            }
        }
        std::thread::sleep(GAP);
    }
}

/// What `PRAGMA wal_checkpoint` reports.
struct Pages {
    /// It could not finish (a RESTART whose readers outlasted the busy timeout).
    busy: bool,
    /// Pages in the log.
    log: i64,
}

fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<Pages> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok(Pages {
            busy: row.get::<_, i64>(0)? != 0,
            log: row.get(1)?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_copied_back_by_the_thread_not_by_the_committer() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.db");
        let writer = Connection::open(&path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        hand_over(&writer)?;
        writer.execute_batch("CREATE TABLE t (x BLOB)")?;
        // Far beyond SQLite's default threshold of 1,000 pages: had the committing connection
        // checkpointed, the database file would hold the rows.
        for _ in 0..300 {
            writer.execute("INSERT INTO t VALUES (zeroblob(16000))", [])?;
        }
        let db_size = || std::fs::metadata(&path).map(|m| m.len());
        assert!(db_size()? < 100_000, "the committer checkpointed");

        let checkpointer = Checkpointer::start(&path, "FULL").map_err(anyhow::Error::msg)?;
        checkpointer.nudge();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while db_size()? < 300 * 16_000 {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the checkpoint thread copied nothing in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Everything was copied, so the next write starts the log over from its beginning.
        std::thread::sleep(GAP * 2);
        writer.execute("INSERT INTO t VALUES (1)", [])?;
        let log: i64 = writer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))?;
        assert!(log < 10, "the log did not start over: {log} pages");
        Ok(())
    }
    #[test]
    fn the_log_starts_over_under_steady_reads_instead_of_growing() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("r.db");
        let writer = Connection::open(&path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        writer.pragma_update(None, "synchronous", "OFF")?;
        hand_over(&writer)?;
        writer.execute_batch("CREATE TABLE t (x BLOB)")?;
        let checkpointer = Checkpointer::start(&path, "OFF").map_err(anyhow::Error::msg)?;
        // A reader that never lets up, as the HTTP point reads do under load.
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || -> rusqlite::Result<u64> {
                let conn = Connection::open(&path)?;
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    conn.query_row(
                        "SELECT count(*) FROM t WHERE rowid > (SELECT max(rowid) FROM t) - 8",
                        [],
                        |row| row.get::<_, i64>(0),
                    )?;
                    reads += 1;
                }
                Ok(reads)
            })
        };
        // About 48,000 pages (192 MB) written, twelve times the restart threshold. Without
        // restarts the log holds all of it.
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for _ in 0..12_000 {
            writer.execute("INSERT INTO t VALUES (zeroblob(16000))", [])?;
            checkpointer.nudge();
            checkpointer.restart_if_due(&writer, Duration::from_secs(10));
            largest = largest.max(std::fs::metadata(&wal)?.len());
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))??;
        assert!(reads > 0);
        // The log is bounded by how much is written between two checkpoints, not by the total;
        // a third of the total leaves room for a slow checkpoint thread on a busy machine.
        let bound = 192_000_000 / 3;
        assert!(
            largest < bound,
            "the log grew to {largest} bytes (bound {bound}) while 192 MB were written"
        );
        Ok(())
    }
}
