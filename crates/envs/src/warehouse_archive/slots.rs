//! The shelves split into occupied and free ones, each side drawable uniformly in O(1): a
//! permutation of `0..total` whose first `occupied` positions hold the occupied shelves. It is
//! stored sparsely (only positions that moved), so a 100,000-shelf warehouse costs nothing to
//! set up.

use std::collections::HashMap;

use crate::rng::SeededRng;

#[derive(Debug, Clone, Default)]
pub(super) struct Slots {
    total: u32,
    occupied: u32,
    /// Position → shelf, where it differs from the identity.
    at: HashMap<u32, u32>,
    /// Shelf → position, where it differs from the identity.
    position: HashMap<u32, u32>,
}

impl Slots {
    pub(super) fn new(total: u32) -> Self {
        Self {
            total,
            ..Self::default()
        }
    }

    #[cfg(test)]
    pub(super) fn occupied(&self) -> u32 {
        self.occupied
    }

    pub(super) fn free(&self) -> u32 {
        self.total - self.occupied
    }

    fn shelf_at(&self, position: u32) -> u32 {
        self.at.get(&position).copied().unwrap_or(position)
    }

    fn position_of(&self, shelf: u32) -> u32 {
        self.position.get(&shelf).copied().unwrap_or(shelf)
    }

    fn swap(&mut self, p: u32, q: u32) {
        let (a, b) = (self.shelf_at(p), self.shelf_at(q));
        self.at.insert(p, b);
        self.at.insert(q, a);
        self.position.insert(b, p);
        self.position.insert(a, q);
    }

    pub(super) fn is_occupied(&self, shelf: u32) -> bool {
        shelf < self.total && self.position_of(shelf) < self.occupied
    }

    /// Marks a free shelf occupied (nothing happens to an occupied or unknown one).
    pub(super) fn occupy(&mut self, shelf: u32) {
        if shelf >= self.total || self.is_occupied(shelf) {
            return;
        }
        let p = self.position_of(shelf);
        self.swap(p, self.occupied);
        self.occupied += 1;
    }

    /// Marks an occupied shelf free (nothing happens to a free or unknown one).
    pub(super) fn vacate(&mut self, shelf: u32) {
        if !self.is_occupied(shelf) {
            return;
        }
        let p = self.position_of(shelf);
        self.occupied -= 1;
        self.swap(p, self.occupied);
    }

    /// A uniformly drawn occupied shelf; `None` when every shelf is free.
    pub(super) fn random_occupied(&self, rng: &mut SeededRng) -> Option<u32> {
        (self.occupied > 0).then(|| self.shelf_at(rng.below(u64::from(self.occupied)) as u32))
    }

    /// A uniformly drawn free shelf; `None` when every shelf is occupied.
    pub(super) fn random_free(&self, rng: &mut SeededRng) -> Option<u32> {
        let free = self.free();
        (free > 0).then(|| self.shelf_at(self.occupied + rng.below(u64::from(free)) as u32))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn occupied_and_free_stay_a_partition() {
        let mut slots = Slots::new(10);
        let mut rng = SeededRng::new(1);
        let mut occupied = BTreeSet::new();
        for round in 0..500 {
            if round % 3 == 2 {
                if let Some(shelf) = slots.random_occupied(&mut rng) {
                    assert!(
                        occupied.remove(&shelf),
                        "drew free shelf {shelf} as occupied"
                    );
                    slots.vacate(shelf);
                }
            } else if let Some(shelf) = slots.random_free(&mut rng) {
                assert!(
                    occupied.insert(shelf),
                    "drew occupied shelf {shelf} as free"
                );
                slots.occupy(shelf);
            }
            assert_eq!(slots.occupied() as usize, occupied.len());
            for shelf in 0..10 {
                assert_eq!(slots.is_occupied(shelf), occupied.contains(&shelf));
            }
        }
        let mut full = Slots::new(2);
        full.occupy(0);
        full.occupy(1);
        full.occupy(1);
        assert_eq!((full.occupied(), full.free()), (2, 0));
        assert_eq!(full.random_free(&mut rng), None);
        full.vacate(5);
        assert_eq!(full.occupied(), 2);
    }
}
