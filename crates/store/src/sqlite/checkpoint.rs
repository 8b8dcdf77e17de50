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
//! writers wait on: it copies what no reader still needs while the writer goes on appending to
//! the log, and the thread then syncs the database file (SQLite itself syncs it only in a
//! checkpoint that copied the whole log, which under load only the writer's restart does). Nudges that arrive during a checkpoint fold into one
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
//! commit left more than `ASK_PAGES` pages in the log and a passive run it asked for then has
//! finished (or the log passed `RESTART_PAGES`): it waits for the readers of the moment (point
//! reads, microseconds; at most `RESTART_WAIT`), copies what is left (what was committed
//! during that run), and the next group writes the log from its beginning. The writer
//! learns the log's length from SQLite's WAL hook at each of its commits, so the bound holds
//! however late the checkpoint thread runs on a busy machine. That costs the writer one
//! database-file sync per `RESTART_PAGES` pages instead of one per 1,000. SQLite also
//! checkpoints when the last connection to the file closes. The pool's connections (rare
//! writes) keep SQLite's default.

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, TryLockError};
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
/// Pages in the log (copied or not) after which the writer asks the checkpoint thread for a
/// passive run at once, and starts the log over as soon as that run has copied it (4 KiB
/// pages: 48 MiB).
const ASK_PAGES: c_int = 12_288;
/// Pages in the log after which the writer starts it over whether or not that run is done
/// (64 MiB): the bound on the log's length.
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
    runs: Arc<Runs>,
    /// The writer's side: the number of passive runs that must have finished before it starts
    /// the log over (set when it asked for one; only the writer's thread touches it).
    awaited: Cell<Option<u64>>,
}

/// What the writer and the checkpoint thread share about passive runs.
#[derive(Default)]
struct Runs {
    /// Runs begun and runs finished (successful or not), counted by the thread.
    begun: AtomicU64,
    finished: AtomicU64,
    /// Set by the writer when the log is due to start over: the thread's next run starts at
    /// once instead of after the rest of its gap.
    urgent: AtomicBool,
}

impl Checkpointer {
    /// Opens a connection of its own to `path` and starts the thread on it.
    pub(super) fn start(path: &Path, synchronous: &str) -> Result<Self, String> {
        let conn = open(path, synchronous).map_err(|e| e.to_string())?;
        // What the passive runs copied is synced by this thread (`passive_run`), unless the
        // store does not sync at all.
        let database = if synchronous.eq_ignore_ascii_case("OFF") {
            None
        } else {
            Some(std::fs::File::open(path).map_err(|e| e.to_string())?)
        };
        let (nudge, nudged) = mpsc::sync_channel(1);
        let turn = Arc::new(Mutex::new(()));
        let runs = Arc::new(Runs::default());
        let (their_turn, their_runs) = (turn.clone(), runs.clone());
        let thread = std::thread::Builder::new()
            .name("skillstate-sqlite-checkpoint".into())
            .spawn(move || run(&conn, database.as_ref(), &nudged, &their_turn, &their_runs))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            nudge,
            thread,
            turn,
            runs,
            awaited: Cell::new(None),
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
    /// own connection: starts the log over once it is long enough.
    ///
    /// Writes wait while the log starts over, for as long as it takes to copy what the passive
    /// runs have not copied yet and to sync what it copied (the passive runs sync their own:
    /// `passive_run`). So once the log passes `ASK_PAGES` the writer asks the thread for a
    /// passive run at once and goes on committing; after that run it starts the log over,
    /// copying only what was committed during the run. Past `RESTART_PAGES` it starts the log
    /// over whatever the thread does. A restart that fails (a reader outlasting
    /// `RESTART_WAIT`) is tried again after the next group, whose commit reports the log still
    /// long. `busy` is the writer's usual busy timeout, set back afterwards.
    pub(super) fn restart_if_due(&self, writer: &Connection, busy: Duration) {
        let pages = LOG_PAGES.get();
        if pages <= ASK_PAGES {
            return;
        }
        let forced = pages > RESTART_PAGES;
        let finished = self.runs.finished.load(Ordering::Acquire);
        match self.awaited.get() {
            None => {
                // The run after the one in progress, if any: it starts after this request.
                let next = self.runs.begun.load(Ordering::Acquire) + 1;
                self.awaited.set(Some(next));
                self.runs.urgent.store(true, Ordering::Release);
                self.nudge();
                if !forced {
                    return;
                }
            }
            Some(awaited) if finished < awaited && !forced => return,
            Some(_) => {}
        }
        // A passive run in progress copies what the restart would copy: unless the log is at
        // its bound, the restart waits for the next group rather than for the run.
        let _turn = match self.turn.try_lock() {
            Ok(turn) => turn,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) if !forced => return,
            Err(TryLockError::WouldBlock) => self.turn.lock().unwrap_or_else(|e| e.into_inner()),
        };
        let started = std::time::Instant::now();
        let restarted = writer
            .busy_timeout(RESTART_WAIT)
            .and_then(|()| checkpoint(writer, "RESTART"));
        crate::metrics::checkpointed("restart", started.elapsed());
        let _ = writer.busy_timeout(busy);
        match restarted {
            // The next commit writes the log from its beginning and reports its length anew.
            Ok(true) => {
                LOG_PAGES.set(0);
                self.awaited.set(None);
            }
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

fn run(
    conn: &Connection,
    database: Option<&std::fs::File>,
    nudged: &Receiver<()>,
    turn: &Mutex<()>,
    runs: &Runs,
) {
    let mut pending = false;
    loop {
        if !pending {
            match nudged.recv_timeout(Duration::from_secs(60)) {
                // Idle or nudged: a checkpoint costs nothing when the log was all copied.
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        runs.urgent.store(false, Ordering::Release);
        runs.begun.fetch_add(1, Ordering::AcqRel);
        let passive = {
            let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
            passive_run(conn, database)
        };
        runs.finished.fetch_add(1, Ordering::AcqRel);
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
                // The writer waits for this run to start the log over.
                Ok(()) if runs.urgent.load(Ordering::Acquire) => {
                    pending = true;
                    break;
                }
                Ok(()) => pending = true,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// A passive checkpoint and the sync of what it copied.
///
/// SQLite syncs the database file in a checkpoint only when it copied the whole log, which
/// under load only the writer's restart does: the pages every passive run wrote would wait,
/// dirty, for that restart's sync, and the handed-over writes with them (the restart took
/// 8–13 ms here under 3,000 state writes a second, nearly all of it that sync). Synced here,
/// the restart's sync has only its own pages to write. The log keeps every copied page until
/// the restart, so a crash before this sync loses nothing.
fn passive_run(conn: &Connection, database: Option<&std::fs::File>) -> rusqlite::Result<bool> {
    let started = std::time::Instant::now();
    let passive = checkpoint(conn, "PASSIVE").and_then(|done| {
        if let Some(database) = database {
            database.sync_data().map_err(|error| {
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
                    Some(format!("syncing the database file: {error}")),
                )
            })?;
        }
        Ok(done)
    });
    crate::metrics::checkpointed("passive", started.elapsed());
    passive
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

    /// A database `name` in `dir`, in WAL mode, with a table `t (x BLOB)`, and its writer's
    /// connection handed over as the store's writer hands its own.
    fn handed_over(
        dir: &tempfile::TempDir,
        name: &str,
    ) -> anyhow::Result<(std::path::PathBuf, Connection)> {
        let path = dir.path().join(name);
        let writer = Connection::open(&path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        hand_over(&writer)?;
        writer.execute_batch("CREATE TABLE t (x BLOB)")?;
        Ok((path, writer))
    }

    #[test]
    fn the_log_is_copied_back_by_the_thread_not_by_the_committer() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (path, writer) = handed_over(&dir, "c.db")?;
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
    fn a_passive_run_syncs_what_it_copied_and_says_when_it_could_not() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (path, writer) = handed_over(&dir, "s.db")?;
        for _ in 0..50 {
            writer.execute("INSERT INTO t VALUES (zeroblob(16000))", [])?;
        }
        let conn = open(&path, "FULL")?;
        let database = std::fs::File::open(&path)?;
        assert!(
            passive_run(&conn, Some(&database))?,
            "a lone passive run is busy"
        );
        assert!(
            std::fs::metadata(&path)?.len() > 50 * 16_000,
            "nothing was copied"
        );
        // A file that cannot be synced (procfs refuses fsync): the run reports it, with what
        // it was doing, instead of passing over it.
        let unsyncable = std::fs::File::open("/proc/self/stat")?;
        writer.execute("INSERT INTO t VALUES (zeroblob(16000))", [])?;
        let error = passive_run(&conn, Some(&unsyncable))
            .err()
            .ok_or_else(|| anyhow::anyhow!("a failed sync went unreported"))?;
        assert!(
            error.to_string().contains("syncing the database file"),
            "{error}"
        );
        Ok(())
    }

    #[test]
    fn a_restart_waits_for_a_passive_run_asked_for_unless_the_log_is_at_its_bound()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (path, writer) = handed_over(&dir, "a.db")?;
        writer.execute("INSERT INTO t VALUES (zeroblob(16000))", [])?;
        let checkpointer = Checkpointer::start(&path, "FULL").map_err(anyhow::Error::msg)?;
        let busy = Duration::from_secs(10);
        // Let the thread's first run (started by nothing but its idle wake-up) be over, so the
        // counts below are the writer's request's.
        checkpointer.nudge();
        let settled = std::time::Instant::now() + Duration::from_secs(30);
        while checkpointer.runs.finished.load(Ordering::Acquire) == 0 {
            anyhow::ensure!(
                std::time::Instant::now() < settled,
                "no passive run in 30 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(GAP * 2);

        // Past the asking length: no restart yet, a run asked for at once.
        let before = checkpointer.runs.finished.load(Ordering::Acquire);
        LOG_PAGES.set(ASK_PAGES + 1);
        checkpointer.restart_if_due(&writer, busy);
        assert_eq!(
            LOG_PAGES.get(),
            ASK_PAGES + 1,
            "restarted before the run it asked for"
        );
        let awaited = checkpointer.awaited.get().map_or(0, |n| n);
        assert!(awaited > before, "no run awaited");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while checkpointer.runs.finished.load(Ordering::Acquire) < awaited {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the run asked for never came"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // That run done, the next call starts the log over.
        checkpointer.restart_if_due(&writer, busy);
        assert_eq!(LOG_PAGES.get(), 0, "no restart after the run asked for");
        assert_eq!(checkpointer.awaited.get(), None);

        // At the bound the writer does not wait for any run.
        LOG_PAGES.set(RESTART_PAGES + 1);
        checkpointer.restart_if_due(&writer, busy);
        assert_eq!(LOG_PAGES.get(), 0, "no restart at the log's bound");
        checkpointer.stop();
        Ok(())
    }

    #[test]
    fn the_log_starts_over_under_steady_reads_instead_of_growing() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        // Rows appended and the oldest deleted: the database stays small while the log takes
        // everything.
        let (path, writer) = handed_over(&dir, "r.db")?;
        writer.pragma_update(None, "synchronous", "OFF")?;
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
