//! WAL checkpoints off the writer's path.
//!
//! SQLite copies the write-ahead log back into the database file in a checkpoint, which by
//! default runs inside the COMMIT that pushed the log past 1,000 pages: on the committing
//! thread, syncing the database file while every write handed to it waits. With group commit
//! that thread is the writer of the whole process, so each checkpoint stalled every task and
//! every HTTP write for its sync (4–7 ms here, the tail of docs/performance.md, "Performance").
//!
//! The writer's connection therefore checkpoints never by itself (`wal_autocheckpoint = 0`);
//! after each group it nudges this module's thread, which runs `PRAGMA
//! wal_checkpoint(PASSIVE)` on a connection of its own. A passive checkpoint takes no lock that
//! writers wait on: it copies what no reader still needs and syncs the database file while the
//! writer goes on appending to the log. Nudges that arrive during a checkpoint fold into one
//! more run after it, and runs are at least `GAP` apart, so one checkpoint covers many groups.
//!
//! How often they run is a latency question more than a throughput one. A checkpoint copies
//! each page once, in its newest version, however often the log rewrote it; and it ends with a
//! sync of the database file, which on a disk that serialises flushes holds up the writer's
//! next log sync: under 3,000 state writes a second a log sync that met a database-file sync
//! took 14–22 ms instead of 1–3 ms (strace of the service). Runs at most every `GAP` (250 ms)
//! and restarts every `RESTART_PAGES` (64 MiB of log) keep those meetings, and the copying,
//! rare.
//!
//! The log must also start over from its beginning now and then, or it grows without end: a
//! writer restarts it only when everything in it was copied AND no reader still reads from it,
//! which under steady load (point reads on other threads, commits back to back) is almost never
//! true. So the writer itself, between two groups, runs a RESTART checkpoint once its last
//! commit left more than `RESTART_PAGES` pages in the log: it waits for the readers of the
//! moment (point reads, microseconds; at most `RESTART_WAIT`), copies what is left (the passive
//! runs copied most of it), and the next group writes the log from its beginning. The writer
//! learns the log's length from SQLite's WAL hook at each of its commits, so the bound holds
//! however late the checkpoint thread runs on a busy machine. That costs the writer one
//! database-file sync per `RESTART_PAGES` pages instead of one per 1,000. SQLite also
//! checkpoints when the last connection to the file closes. The pool's connections (rare
//! writes) keep SQLite's default.

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::hooks::Wal;
use rusqlite::{Connection, OpenFlags};

/// The shortest time between two checkpoints.
const GAP: Duration = Duration::from_millis(250);
/// How long a checkpoint waits for readers or another process's checkpoint.
const BUSY: Duration = Duration::from_secs(2);
/// How long the writer waits for readers to leave the log before it starts it over (it tries
/// again after a later group when they outlast this).
const RESTART_WAIT: Duration = Duration::from_millis(100);
/// Pages in the log (copied or not) after which the writer makes it start over (4 KiB pages:
/// 64 MiB).
const RESTART_PAGES: c_int = 16_384;
/// Upper bound on the log file's size once it was started over: the restart length (frames
/// of a page and a 24-byte header) and room for one more group, so a log of normal length is
/// not cut back and grown again after each restart.
const JOURNAL_SIZE_LIMIT: i64 = 80 * 1024 * 1024;

thread_local! {
    /// Pages in the log after the last commit on this thread of a connection handed over with
    /// [`hand_over`] (set by SQLite's WAL hook, which runs on the committing thread).
    static LOG_PAGES: Cell<c_int> = const { Cell::new(0) };
}

/// The writer's handle on the checkpointing thread; dropping it ends the thread, [`stop`]
/// also waits for it (and so for its connection) to be gone.
///
/// [`stop`]: Checkpointer::stop
pub(super) struct Checkpointer {
    nudge: SyncSender<()>,
    thread: std::thread::JoinHandle<()>,
    /// Held through each checkpoint, the thread's and the writer's: SQLite runs one checkpoint
    /// of a file at a time and refuses a second at once (no busy wait), so a restart that
    /// met a passive run would fail and leave the log to grow until a later one got through.
    turn: Arc<Mutex<()>>,
}

impl Checkpointer {
    /// Opens a connection of its own to `path` and starts the thread on it.
    pub(super) fn start(path: &Path, synchronous: &str) -> Result<Self, String> {
        let conn = open(path, synchronous).map_err(|e| e.to_string())?;
        let (nudge, nudged) = mpsc::sync_channel(1);
        let turn = Arc::new(Mutex::new(()));
        let theirs = turn.clone();
        let thread = std::thread::Builder::new()
            .name("skillstate-sqlite-checkpoint".into())
            .spawn(move || run(&conn, &nudged, &theirs))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            nudge,
            thread,
            turn,
        })
    }

    /// Ends the thread and waits until it and its connection are gone (at most one checkpoint
    /// in progress, which waits for locks no longer than `BUSY`).
    pub(super) fn stop(self) {
        drop(self.nudge);
        let _ = self.thread.join();
    }

    /// Tells the thread that a group was committed (never waits).
    pub(super) fn nudge(&self) {
        match self.nudge.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    /// Called by the writer between two groups, on the thread that committed them and on its
    /// own connection: starts the log over when the last commit left it longer than
    /// `RESTART_PAGES`. A restart that fails (a reader outlasting `RESTART_WAIT`) is tried
    /// again after the next group, whose commit reports the log still long. `busy` is the
    /// writer's usual busy timeout, set back afterwards.
    pub(super) fn restart_if_due(&self, writer: &Connection, busy: Duration) {
        if LOG_PAGES.get() <= RESTART_PAGES {
            return;
        }
        // Waits for a passive run in progress (it copies what the restart would copy).
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        let restarted = writer
            .busy_timeout(RESTART_WAIT)
            .and_then(|()| checkpoint(writer, "RESTART"));
        crate::metrics::checkpointed("restart", started.elapsed());
        let _ = writer.busy_timeout(busy);
        match restarted {
            // The next commit writes the log from its beginning and reports its length anew.
            Ok(true) => LOG_PAGES.set(0),
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(%error, "SQLite could not start the write-ahead log over");
            }
        }
    }
}

/// Sets the writer's connection to leave checkpoints to the [`Checkpointer`].
pub(super) fn hand_over(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    // After the pragma, which replaces any WAL hook with its own (none, at 0).
    conn.wal_hook(Some(note_log_pages));
    Ok(())
}

/// SQLite's WAL hook: called after each commit with the number of pages in the log.
fn note_log_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    LOG_PAGES.set(pages);
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

fn run(conn: &Connection, nudged: &Receiver<()>, turn: &Mutex<()>) {
    let mut pending = false;
    loop {
        if !pending {
            match nudged.recv_timeout(Duration::from_secs(60)) {
                // Idle or nudged: a checkpoint costs nothing when the log was all copied.
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let passive = {
            let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
            let started = std::time::Instant::now();
            let passive = checkpoint(conn, "PASSIVE");
            crate::metrics::checkpointed("passive", started.elapsed());
            passive
        };
        match passive {
            // Under load a reader nearly always pins the newest pages, so "all copied" is
            // rare: the writer's restart copies what is left.
            Ok(_) => {}
            Err(error) => {
                // Busy (another process checkpoints) or failing: the next nudge tries again;
                // the log's contents are safe either way.
                tracing::debug!(%error, "SQLite checkpoint did not complete");
            }
        }
        // The gap before the next run; nudges in it fold into that run, and a store that
        // closes meanwhile ends the thread at once (its connection closes with it).
        pending = false;
        let until = std::time::Instant::now() + GAP;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match nudged.recv_timeout(left) {
                Ok(()) => pending = true,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// Runs `PRAGMA wal_checkpoint(mode)`; false when it could not finish (a RESTART whose readers
/// outlasted the busy timeout).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<bool> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok(row.get::<_, i64>(0)? == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

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
        // Rows appended and the oldest deleted: the database stays small while the log takes
        // everything.
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
        // About 216,000 frames (890 MB) through the log (nine a round), thirteen times the
        // restart threshold. Without restarts the log holds all of it.
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for _ in 0..24_000 {
            writer.execute_batch(
                "BEGIN;
                 INSERT INTO t VALUES (zeroblob(16000));
                 DELETE FROM t WHERE rowid < (SELECT max(rowid) FROM t) - 64;
                 COMMIT;",
            )?;
            checkpointer.nudge();
            checkpointer.restart_if_due(&writer, Duration::from_secs(10));
            largest = largest.max(std::fs::metadata(&wal)?.len());
        }
        stop.store(true, Ordering::Relaxed);
        let reads = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))??;
        assert!(reads > 0);
        // The log is bounded by the restart threshold (16,384 frames of 4 KiB and their 24-byte
        // headers: 67.5 MB) and one group, plus the groups committed while a reader held a
        // restart off (rare: the reads take microseconds), however late or long the checkpoint
        // thread ran.
        let bound = 80_000_000;
        assert!(
            largest < bound,
            "the log grew to {largest} bytes (bound {bound}) while 890 MB went through it"
        );
        Ok(())
    }
}
