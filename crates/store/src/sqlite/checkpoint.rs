//! WAL checkpoints off the writer's path.
//!
//! SQLite copies the write-ahead log back into the database file in a checkpoint, which by
//! default runs inside the COMMIT that pushed the log past 1,000 pages: on the committing
//! thread, syncing the database file while every write handed to it waits. With group commit
//! that thread is the writer of the whole process, so each checkpoint stalled every task and
//! every HTTP write for its sync (4–7 ms here, the tail of README "Performance").
//!
//! The writer's connection therefore checkpoints never (`wal_autocheckpoint = 0`); after each
//! group it nudges this module's thread, which runs `PRAGMA wal_checkpoint(PASSIVE)` on a
//! connection of its own. A passive checkpoint takes no lock that writers wait on: it copies
//! what no reader still needs and syncs the database file while the writer goes on appending
//! to the log, and the writer starts the log over from its beginning once everything in it was
//! copied. Nudges that arrive during a checkpoint fold into one more run after it, and runs are
//! at least `GAP` apart, so checkpoints batch many groups.
//!
//! The log stays bounded: when a passive checkpoint leaves more than `RESTART_PAGES` pages in
//! the log (readers kept it from finishing), the next run is a RESTART checkpoint, which waits
//! (at most `BUSY`) for those readers and makes the writer start the log over. And SQLite
//! checkpoints once more when the last connection to the file closes. Other connections of the
//! process (the pool's rare writes) keep SQLite's default, which the log rarely reaches now.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// The shortest time between two checkpoints.
const GAP: Duration = Duration::from_millis(50);
/// How long a checkpoint waits for readers or another process's checkpoint.
const BUSY: Duration = Duration::from_secs(2);
/// Pages left in the log after which the next checkpoint makes the log start over (4 KiB
/// pages: 64 MiB).
const RESTART_PAGES: i64 = 16_384;
/// Upper bound on the log file's size once it was started over.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// The writer's handle on the checkpointing thread; dropping it ends the thread.
pub(super) struct Checkpointer {
    nudge: SyncSender<()>,
}

impl Checkpointer {
    /// Opens a connection of its own to `path` and starts the thread on it.
    pub(super) fn start(path: &Path) -> Result<Self, String> {
        let conn = open(path).map_err(|e| e.to_string())?;
        let (nudge, nudged) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("skillstate-sqlite-checkpoint".into())
            .spawn(move || run(&conn, &nudged))
            .map_err(|e| e.to_string())?;
        Ok(Self { nudge })
    }

    /// Tells the thread that a group was committed (never waits).
    pub(super) fn nudge(&self) {
        match self.nudge.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// Sets the writer's connection to leave checkpoints to the [`Checkpointer`].
pub(super) fn hand_over(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(())
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    // Checkpointing syncs the database file; the synchronous setting says when.
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(conn)
}

fn run(conn: &Connection, nudged: &Receiver<()>) {
    let mut restart = false;
    loop {
        match nudged.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {}
            // Idle: a checkpoint now costs nothing when the log is empty.
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let mode = if restart { "RESTART" } else { "PASSIVE" };
        match checkpoint(conn, mode) {
            Ok(left) => restart = left > RESTART_PAGES,
            Err(error) => {
                // Busy (another process checkpoints, a reader outlasted BUSY) or failing: the
                // next nudge tries again; the log's contents are safe either way.
                tracing::debug!(%error, mode, "SQLite checkpoint did not complete");
            }
        }
        std::thread::sleep(GAP);
    }
}

/// Runs one checkpoint; answers the pages still in the log that it could not copy.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    let (_busy, log, copied): (i64, i64, i64) =
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    Ok(log.saturating_sub(copied).max(0))
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

        let checkpointer = Checkpointer::start(&path).map_err(anyhow::Error::msg)?;
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
}
