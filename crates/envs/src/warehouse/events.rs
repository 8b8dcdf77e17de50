//! The warehouse's event sequence: generated up front from the seed by simulating a correct
//! agent (the ground truth), optionally with one drift scenario.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{WarehouseConfig, shelf_name};
use crate::rng::SeededRng;

/// The drift scenarios (docs/paper.md, "Drift (T = 50)": the paper names them, the definitions are ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Drift {
    /// Someone moves an item to another shelf; an audit later says where it is.
    SecretMove,
    /// Someone removes an item; an audit later says it is missing.
    SecretAudit,
    /// An item is relabelled; a notice later gives the new barcode.
    SecretBarcode,
    /// An order is canceled in the same alert that announces it; shipping it is wrong.
    CanceledOrder,
}

impl Drift {
    pub const ALL: [Drift; 4] = [
        Drift::SecretMove,
        Drift::SecretAudit,
        Drift::SecretBarcode,
        Drift::CanceledOrder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Drift::SecretMove => "secret_move",
            Drift::SecretAudit => "secret_audit",
            Drift::SecretBarcode => "secret_barcode",
            Drift::CanceledOrder => "canceled_order",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == name)
    }
}

/// A change to the world that the agent did not make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Moved {
        item: String,
        from: String,
        to: String,
    },
    Removed {
        item: String,
        shelf: String,
    },
    Relabelled {
        item: String,
        new_item: String,
        shelf: String,
    },
}

/// The one action that handles an event correctly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expected {
    Store {
        item: String,
        shelf: String,
    },
    Ship {
        item: String,
        shelf: String,
    },
    Move {
        item: String,
        from: String,
        to: String,
    },
    Wait,
}

impl Expected {
    pub fn call(&self) -> (&'static str, Value) {
        match self {
            Expected::Store { item, shelf } => ("store", json!({"item": item, "shelf": shelf})),
            Expected::Ship { item, shelf } => ("ship", json!({"item": item, "shelf": shelf})),
            Expected::Move { item, from, to } => {
                ("move", json!({"item": item, "from": from, "to": to}))
            }
            Expected::Wait => ("wait", json!({})),
        }
    }
}

/// One step's event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What the agent is told. Orders and maintenance deliberately omit what the agent must
    /// remember (where the item is; which item is on the shelf).
    pub alert: String,
    pub expected: Expected,
    /// Applied to the world, unannounced, when this event arrives.
    pub hidden_change: Option<Change>,
    /// The change this alert reports (an audit or relabel notice).
    pub reveals: Option<Change>,
    /// Whether handling it depends on a drifted fact (counted for recovery).
    pub drift_dependent: bool,
}

impl Event {
    fn plain(alert: String, expected: Expected) -> Self {
        Self {
            alert,
            expected,
            hidden_change: None,
            reveals: None,
            drift_dependent: false,
        }
    }

    /// The ground-truth action as `(tool, args)`.
    pub fn expected_action(&self) -> (&'static str, Value) {
        self.expected.call()
    }
}

/// Steps between the hidden change and the alert that reveals it.
const REVEAL_DELAY: usize = 2;
/// Steps after the reveal at which events depend on the drifted fact.
const PROBE_DELAYS: [usize; 2] = [3, 10];

/// Random draws tried for a fresh item id or a free shelf before the generator picks directly
/// among those left (a scan), so neither can spin once few are left.
const TRIES: usize = 64;
/// Item ids are drawn from `0..ITEM_IDS`; once all of them are used, new ids count up from
/// `ITEM_IDS` (long episodes receive more than `ITEM_IDS` items).
const ITEM_IDS: u64 = 10_000;

struct Generator {
    rng: SeededRng,
    truth: BTreeMap<u32, String>,
    /// Ids drawn from `0..ITEM_IDS` so far.
    used_items: BTreeSet<u64>,
    /// The next id handed out once `0..ITEM_IDS` is used up.
    next_extra_item: u64,
    shelves: u32,
    /// An item kept out of random events because a drift scenario is about it.
    reserved: Option<String>,
    /// The hidden change waiting to be revealed.
    drifted: Option<Change>,
}

/// The `k`-th (from 0) number of `0..` that is not in `taken`; `taken` ascending. Charges one
/// unit of work per entry scanned.
fn kth_free(taken: impl Iterator<Item = u64>, k: u64) -> u64 {
    let mut candidate = k;
    for value in taken {
        crate::rng::charge(1);
        if value <= candidate {
            candidate += 1;
        } else {
            break;
        }
    }
    candidate
}

impl Generator {
    fn new_item(&mut self) -> String {
        let left = ITEM_IDS - self.used_items.len() as u64;
        if left == 0 {
            let n = self.next_extra_item;
            self.next_extra_item += 1;
            return format!("item_{n}");
        }
        for _ in 0..TRIES {
            let n = self.rng.below(ITEM_IDS);
            if self.used_items.insert(n) {
                return format!("item_{n}");
            }
        }
        let k = self.rng.below(left);
        let n = kth_free(self.used_items.iter().copied(), k);
        self.used_items.insert(n);
        format!("item_{n}")
    }

    fn has_free_shelf(&self) -> bool {
        (self.truth.len() as u64) < u64::from(self.shelves)
    }

    /// A free shelf, drawn uniformly; `None` when every shelf holds an item.
    fn empty_shelf(&mut self) -> Option<u32> {
        if !self.has_free_shelf() {
            return None;
        }
        for _ in 0..TRIES {
            let shelf = self.rng.below(u64::from(self.shelves)) as u32;
            if !self.truth.contains_key(&shelf) {
                return Some(shelf);
            }
        }
        let free = u64::from(self.shelves) - self.truth.len() as u64;
        let k = self.rng.below(free);
        let shelf = kth_free(self.truth.keys().map(|s| u64::from(*s)), k);
        u32::try_from(shelf).ok()
    }

    fn stored(&self) -> Vec<(u32, String)> {
        self.truth
            .iter()
            .filter(|(_, item)| Some(*item) != self.reserved.as_ref())
            .map(|(s, i)| (*s, i.clone()))
            .collect()
    }

    fn shelf_of(&self, item: &str) -> Option<u32> {
        self.truth
            .iter()
            .find(|(_, i)| i.as_str() == item)
            .map(|(s, _)| *s)
    }

    /// A shipment to store; `None` when no shelf is free.
    fn receive(&mut self) -> Option<Event> {
        if !self.has_free_shelf() {
            return None;
        }
        let item = self.new_item();
        let shelf = self.empty_shelf()?;
        self.truth.insert(shelf, item.clone());
        let shelf = shelf_name(shelf);
        Some(Event::plain(
            format!("Shipment arrived containing {item}. Store it on {shelf}."),
            Expected::Store { item, shelf },
        ))
    }

    fn order(&mut self, shelf: u32, item: String) -> Event {
        self.truth.remove(&shelf);
        Event::plain(
            format!("Customer ordered {item}."),
            Expected::Ship {
                item,
                shelf: shelf_name(shelf),
            },
        )
    }

    /// Maintenance on `shelf`, whose item moves to a free shelf; an order for the item instead
    /// when no shelf is free (only possible on a two-shelf warehouse during a drift).
    fn maintenance(&mut self, shelf: u32, item: String) -> Event {
        let Some(to) = self.empty_shelf() else {
            return self.order(shelf, item);
        };
        self.truth.remove(&shelf);
        self.truth.insert(to, item.clone());
        let (from, to) = (shelf_name(shelf), shelf_name(to));
        Event::plain(
            format!("Maintenance required on {from}. Move its item to {to}."),
            Expected::Move { item, from, to },
        )
    }

    /// A uniformly drawn event among those possible: only a receive while nothing is stored,
    /// only an order or a maintenance while at most one shelf is free, any of the three
    /// otherwise.
    fn random_event(&mut self) -> Event {
        let stored = self.stored();
        let full = self.truth.len() as u32 >= self.shelves - 1;
        let choice = if stored.is_empty() {
            0
        } else if full {
            1 + self.rng.below(2)
        } else {
            self.rng.below(3)
        };
        match choice {
            0 => match self.receive() {
                Some(event) => event,
                // No shelf is free: then something is stored (shelves >= 2, one reserved).
                None => match stored.first().cloned() {
                    Some((shelf, item)) => self.order(shelf, item),
                    None => Event::plain("No new alerts.".into(), Expected::Wait),
                },
            },
            1 => {
                let (shelf, item) = stored[self.rng.index(stored.len())].clone();
                self.order(shelf, item)
            }
            _ => {
                let (shelf, item) = stored[self.rng.index(stored.len())].clone();
                self.maintenance(shelf, item)
            }
        }
    }
}

/// Generates the event sequence for a configuration.
pub fn generate_events(config: &WarehouseConfig) -> Vec<Event> {
    let mut g = Generator {
        rng: SeededRng::new(config.seed),
        truth: BTreeMap::new(),
        used_items: BTreeSet::new(),
        next_extra_item: ITEM_IDS,
        shelves: config.shelves,
        reserved: None,
        drifted: None,
    };
    let total = config.events as usize;
    let mut events = Vec::with_capacity(total);
    // The drift starts a third of the way in, once something is stored.
    let mut drift_start: Option<usize> = None;
    let mut reveal_at = usize::MAX;
    while events.len() < total {
        let index = events.len();
        let event = match config.drift {
            Some(drift) if drift_start.is_none() && index >= total / 3 && !g.truth.is_empty() => {
                drift_start = Some(index);
                reveal_at = if drift == Drift::CanceledOrder {
                    index
                } else {
                    index + REVEAL_DELAY
                };
                start_drift(&mut g, drift)
            }
            Some(_) if index == reveal_at => reveal(&mut g),
            Some(_)
                if PROBE_DELAYS
                    .iter()
                    .any(|d| reveal_at.checked_add(*d) == Some(index)) =>
            {
                probe(&mut g).unwrap_or_else(|| g.random_event())
            }
            _ => g.random_event(),
        };
        events.push(event);
    }
    events
}

/// The event at which a drift begins: for the secret scenarios an ordinary event with the
/// hidden change attached; for a canceled order, the order and its cancellation.
fn start_drift(g: &mut Generator, drift: Drift) -> Event {
    let stored = g.stored();
    let (shelf, item) = stored[g.rng.index(stored.len())].clone();
    g.reserved = Some(item.clone());
    let shelf_label = shelf_name(shelf);
    match drift {
        Drift::CanceledOrder => Event {
            alert: format!(
                "Customer ordered {item}.\nUpdate: the customer canceled the order for {item} before it shipped."
            ),
            expected: Expected::Wait,
            hidden_change: None,
            reveals: None,
            drift_dependent: true,
        },
        Drift::SecretMove => {
            // Before a drift nothing is reserved, so at least one shelf is free.
            let to = g.empty_shelf().unwrap_or(shelf);
            g.truth.remove(&shelf);
            g.truth.insert(to, item.clone());
            let event = g.random_event();
            with_hidden(
                g,
                event,
                Change::Moved {
                    item,
                    from: shelf_label,
                    to: shelf_name(to),
                },
            )
        }
        Drift::SecretAudit => {
            g.truth.remove(&shelf);
            let event = g.random_event();
            with_hidden(
                g,
                event,
                Change::Removed {
                    item,
                    shelf: shelf_label,
                },
            )
        }
        Drift::SecretBarcode => {
            let new_item = g.new_item();
            g.truth.insert(shelf, new_item.clone());
            g.reserved = Some(new_item.clone());
            let event = g.random_event();
            with_hidden(
                g,
                event,
                Change::Relabelled {
                    item,
                    new_item,
                    shelf: shelf_label,
                },
            )
        }
    }
}

fn with_hidden(g: &mut Generator, mut event: Event, change: Change) -> Event {
    g.drifted = Some(change.clone());
    event.hidden_change = Some(change);
    event
}

fn reveal(g: &mut Generator) -> Event {
    let Some(change) = g.drifted.take() else {
        return g.random_event();
    };
    let alert = match &change {
        Change::Moved { item, to, .. } => {
            format!("Audit: {item} was found on {to}, not where the records say.")
        }
        Change::Removed { item, .. } => {
            format!("Audit: {item} is missing from the warehouse; its shelf is empty.")
        }
        Change::Relabelled {
            new_item, shelf, ..
        } => {
            format!("Relabel notice: the item on {shelf} now carries barcode {new_item}.")
        }
    };
    Event {
        alert,
        expected: Expected::Wait,
        hidden_change: None,
        reveals: Some(change),
        drift_dependent: true,
    }
}

/// An event whose correct handling depends on the drifted item: maintenance on its shelf,
/// or an order for it (an order for a missing item must not be shipped).
fn probe(g: &mut Generator) -> Option<Event> {
    let item = g.reserved.clone()?;
    let mut event = match g.shelf_of(&item) {
        Some(shelf) if g.rng.below(2) == 0 => g.maintenance(shelf, item),
        Some(shelf) => {
            g.reserved = None;
            g.order(shelf, item)
        }
        None => Event::plain(format!("Customer ordered {item}."), Expected::Wait),
    };
    event.drift_dependent = true;
    Some(event)
}
