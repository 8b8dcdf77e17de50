//! The archive's event sequence, generated up front from the seed by simulating a correct agent
//! (the ground truth). Shipments outnumber orders, so the stock grows through the whole run, and
//! orders and maintenance pick uniformly among everything stored: most of them name an item or a
//! shelf last seen hundreds or thousands of events ago.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ArchiveConfig;
use super::slots::Slots;
use crate::rng::SeededRng;
use crate::warehouse::{Expected, shelf_name};

/// Of every 100 events (while a shelf is free and something is stored): shipments to store,
/// then customer orders; the rest is maintenance.
pub const RECEIVE_PERCENT: u64 = 40;
pub const ORDER_PERCENT: u64 = 30;

/// Item ids are `(n · ITEM_STRIDE + offset) mod ITEM_MODULUS` for the n-th item of the run: a
/// prime modulus and a stride below it make every id of a run different without remembering
/// them, and the ids look unrelated to the order the items arrived in.
const ITEM_MODULUS: u64 = 1_000_003;
const ITEM_STRIDE: u64 = 611_953;

/// One event: the alert the agent reads and the one action that handles it correctly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveEvent {
    /// Orders name only the item, maintenance only the shelf: where the item is, or which item
    /// the shelf holds, is for the agent to remember or look up.
    pub alert: String,
    pub expected: Expected,
}

impl ArchiveEvent {
    /// The ground-truth action as `(tool, args)`.
    pub fn expected_action(&self) -> (&'static str, Value) {
        self.expected.call()
    }
}

struct Generator {
    rng: SeededRng,
    slots: Slots,
    /// Shelf → item, as a correct agent leaves the warehouse.
    truth: HashMap<u32, String>,
    items: u64,
    offset: u64,
}

impl Generator {
    fn new_item(&mut self) -> String {
        let n = self.items;
        self.items += 1;
        let id = (n % ITEM_MODULUS * ITEM_STRIDE + self.offset) % ITEM_MODULUS;
        format!("item_{id}")
    }

    fn receive(&mut self, shelf: u32) -> ArchiveEvent {
        let item = self.new_item();
        self.slots.occupy(shelf);
        self.truth.insert(shelf, item.clone());
        let shelf = shelf_name(shelf);
        ArchiveEvent {
            alert: format!("Shipment arrived containing {item}. Store it on {shelf}."),
            expected: Expected::Store { item, shelf },
        }
    }

    fn order(&mut self, shelf: u32) -> ArchiveEvent {
        self.slots.vacate(shelf);
        let item = self.truth.remove(&shelf).unwrap_or_default();
        ArchiveEvent {
            alert: format!("Customer ordered {item}."),
            expected: Expected::Ship {
                item,
                shelf: shelf_name(shelf),
            },
        }
    }

    fn maintenance(&mut self, from: u32, to: u32) -> ArchiveEvent {
        self.slots.vacate(from);
        self.slots.occupy(to);
        let item = self.truth.remove(&from).unwrap_or_default();
        self.truth.insert(to, item.clone());
        let (from, to) = (shelf_name(from), shelf_name(to));
        ArchiveEvent {
            alert: format!("Maintenance required on {from}. Move its item to {to}."),
            expected: Expected::Move { item, from, to },
        }
    }

    /// The next event: a shipment while nothing is stored, an order while no shelf is free,
    /// otherwise drawn by the percentages above.
    fn next_event(&mut self) -> ArchiveEvent {
        let roll = self.rng.below(100);
        let stored = self.slots.random_occupied(&mut self.rng);
        let free = self.slots.random_free(&mut self.rng);
        match (stored, free) {
            (None, Some(free)) => self.receive(free),
            (Some(stored), None) => self.order(stored),
            (Some(_), Some(free)) if roll < RECEIVE_PERCENT => self.receive(free),
            (Some(stored), Some(_)) if roll < RECEIVE_PERCENT + ORDER_PERCENT => self.order(stored),
            (Some(stored), Some(free)) => self.maintenance(stored, free),
            // A warehouse has at least two shelves, so one of the two exists.
            (None, None) => ArchiveEvent {
                alert: "No new alerts.".into(),
                expected: Expected::Wait,
            },
        }
    }
}

/// Generates the event sequence for a configuration: three random draws per event, no scans.
pub fn generate_events(config: &ArchiveConfig) -> Vec<ArchiveEvent> {
    let mut rng = SeededRng::new(config.seed ^ 0xA4C4_1FE5);
    let offset = rng.below(ITEM_MODULUS);
    let mut g = Generator {
        rng,
        slots: Slots::new(config.shelves),
        truth: HashMap::new(),
        items: 0,
        offset,
    };
    (0..config.events).map(|_| g.next_event()).collect()
}
