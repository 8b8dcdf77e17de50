//! Connections for single statements outside a transaction, kept by the store between uses.
//!
//! sqlx pings every connection given back to its pool (a `Sync` and its answer: one round trip
//! on the wire per checkout, which no pool option switches off). On a worker's step that ping
//! cost as much as the step's commit itself (`step_fn.rs`: one statement). A lone statement —
//! a step's commit, a claim, a read — therefore borrows one of these connections, which the
//! store takes out of its pool once (`PoolConnection::detach`) and keeps in its own free list,
//! given back without a ping. A dead one is found by the statement that uses it, as everywhere
//! in this store (`db.rs`), and is then dropped, never given back; so is one whose statement
//! failed in any way, or whose future was dropped mid-statement (a connection in an unknown
//! state is never reused).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use tokio::sync::{Semaphore, SemaphorePermit};

/// The free list and the number of connections it may hold and lend at once.
#[derive(Debug)]
pub(super) struct Lent {
    idle: Mutex<Vec<Kept>>,
    slots: Semaphore,
}

#[derive(Debug)]
struct Kept {
    connection: PgConnection,
    opened: Instant,
}

/// A borrowed connection: [`give_back`](Self::give_back) after a statement that succeeded;
/// dropped otherwise, which closes it.
pub(super) struct LentConnection<'a> {
    kept: Kept,
    lent: &'a Lent,
    _slot: SemaphorePermit<'a>,
}

impl Lent {
    pub(super) fn new(max: u32) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(max.max(1) as usize),
        }
    }

    /// A connection to use alone: a kept one that `usable` accepts (by its age), else a new
    /// one taken out of `pool`. Waits at most `timeout` for a free slot.
    pub(super) async fn lend(
        &self,
        pool: &PgPool,
        timeout: Duration,
        usable: impl Fn(Duration) -> bool,
    ) -> Result<LentConnection<'_>, sqlx::Error> {
        let slot = tokio::time::timeout(timeout, self.slots.acquire())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let kept = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            match kept {
                Some(kept) if usable(kept.opened.elapsed()) => {
                    return Ok(LentConnection {
                        kept,
                        lent: self,
                        _slot: slot,
                    });
                }
                // Opened before a connection was last found dead: dropped (closed).
                Some(_) => continue,
                None => break,
            }
        }
        let connection = pool.acquire().await?.detach();
        Ok(LentConnection {
            kept: Kept {
                connection,
                opened: Instant::now(),
            },
            lent: self,
            _slot: slot,
        })
    }
}

impl LentConnection<'_> {
    pub(super) fn connection(&mut self) -> &mut PgConnection {
        &mut self.kept.connection
    }

    /// Puts the connection back for the next statement, without a ping.
    pub(super) fn give_back(self) {
        let Self { kept, lent, _slot } = self;
        if let Ok(mut idle) = lent.idle.lock() {
            idle.push(kept);
        }
    }
}
