//! A small seeded generator (SplitMix64). Environments must produce the identical event
//! sequence for a seed on every machine and every version of our dependencies, so we own it.

use std::cell::Cell;

thread_local! {
    static WORK: Cell<u64> = const { Cell::new(0) };
    static WORK_LIMIT: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// Makes work on this thread beyond `limit` (in [`work_done`]'s units) panic, so a test turns a
/// generator that would not end into a failure; `u64::MAX` lifts it. No limit is set outside
/// tests.
pub fn limit_work(limit: u64) {
    WORK_LIMIT.with(|l| l.set(limit));
}

/// Units of work done on this thread by environment generators: one per random draw, plus what
/// a generator [`charge`]s for a scan. Generation loops are rejection loops on draws, so this
/// bounds their cost in a way tests can assert without measuring time.
pub fn work_done() -> u64 {
    WORK.with(Cell::get)
}

/// Counts `units` of work that are not random draws (a scan over `units` entries).
pub fn charge(units: u64) {
    let done = WORK.with(|work| {
        let done = work.get().saturating_add(units);
        work.set(done);
        done
    });
    if done > WORK_LIMIT.with(Cell::get) {
        panic!("an environment generator went over its work limit ({done} units)");
    }
}

#[derive(Debug, Clone)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5EED_5EED_5EED_5EED,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        charge(1);
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        // Rejection sampling keeps the distribution exactly uniform.
        let zone = u64::MAX - (u64::MAX % bound);
        loop {
            let value = self.next_u64();
            if value < zone {
                return value % bound;
            }
        }
    }

    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = SeededRng::new(7);
                move |_| r.below(100)
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = SeededRng::new(7);
                move |_| r.below(100)
            })
            .collect();
        let c: Vec<u64> = (0..5)
            .map({
                let mut r = SeededRng::new(8);
                move |_| r.below(100)
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| *v < 100));
    }
}
