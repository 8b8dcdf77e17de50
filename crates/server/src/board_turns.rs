//! Board writes sent to one server process take turns per board.
//!
//! A board write is optimistic at the store: it commits only on top of the version it was
//! computed on, and a write that lost the race is rebased and tried again. Left to race, the
//! writes of one process to a busy board could lose round after round to each other until
//! the tries ran out, though none of them conflicted. So the HTTP write of a board waits for
//! its turn here (FIFO, a `tokio` mutex) after its body is read and before it reads, checks
//! and commits: writes of the same process never race, and the retry is left for writers
//! this process cannot see (member tasks' steps, other server processes).
//!
//! Turns are striped: a fixed number of locks, a board's chosen by a hash of its id, so the
//! memory is bounded whatever the number of boards; two boards on the same stripe take turns
//! too, which costs only while both are written at once.

use std::hash::BuildHasher;

use tokio::sync::{Mutex, MutexGuard};

/// How many stripes: enough that busy boards rarely share one.
const STRIPES: usize = 256;

pub(crate) struct BoardTurns {
    stripes: Box<[Mutex<()>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl BoardTurns {
    pub(crate) fn new() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: Default::default(),
        }
    }

    /// Waits for `board`'s turn; the turn ends when the guard drops.
    pub(crate) async fn turn(&self, board: &str) -> MutexGuard<'_, ()> {
        let stripe = self.hasher.hash_one(board) as usize % self.stripes.len();
        self.stripes[stripe].lock().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn a_board_takes_turns_and_other_boards_mostly_do_not_wait() {
        let turns = BoardTurns::new();
        let held = turns.turn("board-a").await;
        // The same board waits while the turn is held...
        assert!(turns.turn("board-a").now_or_never().is_none());
        // ...and most other boards do not (one in 256 shares the stripe, on average).
        let free = (0..64)
            .filter(|n| turns.turn(&format!("board-{n}")).now_or_never().is_some())
            .count();
        assert!(free >= 60, "only {free} of 64 other boards were free");
        // The turn ends with its guard: the next writer of the board goes at once.
        drop(held);
        assert!(turns.turn("board-a").now_or_never().is_some());
    }
}
