//! The warehouse archive (issue 22, docs/recall.md, "Recall and provenance"): a warehouse far larger
//! than any bounded state. 5,000 shelves and up to 100,000 events; shipments outnumber orders,
//! so the stock grows for the whole run, and orders and maintenance name items and shelves
//! picked uniformly among everything stored, mostly last seen long ago. An agent that keeps
//! only a bounded index of recent moves in its state must look the rest up in its own journal
//! (the built-in `recall` tool); one that cannot, has to guess.
//!
//! Like the warehouse, the events are generated up front from the seed by simulating a correct
//! agent, and the score is the fraction of events handled with the ground truth's action. Unlike
//! it, the environment moves to the next event only after one of ITS OWN tools (store, ship,
//! move, wait): an action of another tool (a `recall`) leaves the current event open, so
//! looking something up costs a step but never an event.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::lock;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

mod events;
mod slots;
#[cfg(test)]
mod tests;

pub use events::{ArchiveEvent, ORDER_PERCENT, RECEIVE_PERCENT, generate_events};

use crate::noise::{warehouse_lines, with_telemetry};
use crate::params::{ParamSpec, Params};
use crate::warehouse::Expected;

pub const KIND: &str = "warehouse-archive";

/// The archive's `[environment]` parameters.
pub const PARAMETERS: &[ParamSpec] = &[
    ParamSpec::whole("seed", 0, 0, u64::MAX),
    ParamSpec::whole("events", 100, 1, 100_000),
    ParamSpec::whole("shelves", 5_000, 2, 100_000),
    ParamSpec::whole("noise", 0, 0, 1000),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveConfig {
    pub seed: u64,
    /// Number of events (the horizon T); a step that is not an action of the warehouse's own
    /// tools does not use one up.
    pub events: u32,
    pub shelves: u32,
    /// Telemetry lines appended to every event.
    #[serde(default)]
    pub noise: u32,
}

impl ArchiveConfig {
    pub fn new(seed: u64, events: u32) -> Self {
        Self {
            seed,
            events,
            shelves: 5_000,
            noise: 0,
        }
    }

    pub fn from_params(params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let p = Params::new(KIND, PARAMETERS, params);
        let config = Self {
            seed: p.u64("seed")?,
            events: p.u64("events")? as u32,
            shelves: p.u64("shelves")? as u32,
            noise: p.u64("noise")? as u32,
        };
        p.finish()?;
        Ok(config)
    }
}

fn parse_shelf(name: &str, shelves: u32) -> Option<u32> {
    let digits = name.strip_prefix("shelf_")?;
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse::<u32>().ok().filter(|n| *n < shelves)
}

/// The warehouse as it really is, after the agent's actions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct World {
    config: ArchiveConfig,
    /// Written as one string (`shelf=item` pairs): the checkpoint is taken at every step and
    /// the stock grows to thousands of items, so its cost must stay small.
    #[serde(with = "shelf_list")]
    shelves: BTreeMap<u32, String>,
    /// Items that arrived and wait to be stored.
    dock: BTreeSet<String>,
    /// Index of the event the agent is handling now.
    cursor: usize,
    /// Events whose action succeeded and matched the ground truth.
    hits: u32,
    /// Actions of the warehouse's own tools, and of any other tool (steps that did not
    /// handle an event: recalls).
    own_actions: u64,
    other_actions: u64,
    /// The warehouse action taken since the current event arrived, and whether it succeeded.
    last_action: Option<(String, Value, bool)>,
    #[serde(skip)]
    events: Vec<ArchiveEvent>,
}

impl World {
    fn new(config: ArchiveConfig) -> Self {
        let events = generate_events(&config);
        Self {
            config,
            shelves: BTreeMap::new(),
            dock: BTreeSet::new(),
            cursor: 0,
            hits: 0,
            own_actions: 0,
            other_actions: 0,
            last_action: None,
            events,
        }
    }

    /// The current event reaches the world: its shipment arrives at the dock.
    fn arrive(&mut self) {
        if let Some(ArchiveEvent {
            expected: Expected::Store { item, .. },
            ..
        }) = self.events.get(self.cursor)
        {
            let item = item.clone();
            self.dock.insert(item);
        }
    }

    fn alert(&self, index: usize) -> Option<String> {
        let alert = self.events.get(index)?.alert.clone();
        Some(with_telemetry(
            alert,
            warehouse_lines(self.config.seed, index, self.config.noise),
        ))
    }

    fn shelf(&self, name: &str) -> Result<u32, String> {
        parse_shelf(name, self.config.shelves).ok_or_else(|| {
            format!(
                "Error: there is no shelf named {name} (shelves are shelf_0 to shelf_{}); nothing changed.",
                self.config.shelves - 1
            )
        })
    }

    fn store(&mut self, item: &str, shelf: &str) -> Result<String, String> {
        let index = self.shelf(shelf)?;
        if let Some(current) = self.shelves.get(&index) {
            return Err(format!(
                "Error: {shelf} is occupied by {current}; nothing changed."
            ));
        }
        if !self.dock.remove(item) {
            return Err(format!(
                "Error: {item} is not waiting at the dock; nothing changed."
            ));
        }
        self.shelves.insert(index, item.to_owned());
        Ok(format!("Success: Stored {item} on {shelf}."))
    }

    fn ship(&mut self, item: &str, shelf: &str) -> Result<String, String> {
        let index = self.shelf(shelf)?;
        match self.shelves.get(&index) {
            None => Err(format!("Error: {shelf} is empty; nothing changed.")),
            Some(current) if current != item => Err(format!(
                "Error: {shelf} holds {current}, not {item}; nothing changed."
            )),
            Some(_) => {
                self.shelves.remove(&index);
                Ok(format!("Success: Shipped {item} from {shelf}."))
            }
        }
    }

    fn relocate(&mut self, item: &str, from: &str, to: &str) -> Result<String, String> {
        let from_index = self.shelf(from)?;
        let to_index = self.shelf(to)?;
        match self.shelves.get(&from_index) {
            None => return Err(format!("Error: {from} is empty; nothing changed.")),
            Some(current) if current != item => {
                return Err(format!(
                    "Error: {from} holds {current}, not {item}; nothing changed."
                ));
            }
            Some(_) => {}
        }
        if let Some(current) = self.shelves.get(&to_index) {
            return Err(format!(
                "Error: {to} is occupied by {current}; nothing changed."
            ));
        }
        self.shelves.remove(&from_index);
        self.shelves.insert(to_index, item.to_owned());
        Ok(format!("Success: Moved {item} from {from} to {to}."))
    }
}

/// The shelves of a checkpoint as `"3=item_5 17=item_9"`.
mod shelf_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(
        shelves: &BTreeMap<u32, String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(shelves.len() * 20);
        for (shelf, item) in shelves {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&shelf.to_string());
            text.push('=');
            text.push_str(item);
        }
        serializer.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<u32, String>, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.split_whitespace()
            .map(|pair| {
                let (shelf, item) = pair.split_once('=').ok_or_else(|| {
                    D::Error::custom(format!("shelf entry `{pair}` is not SHELF=ITEM"))
                })?;
                let shelf = shelf.parse::<u32>().map_err(|_| {
                    D::Error::custom(format!("shelf entry `{pair}` has no shelf number"))
                })?;
                Ok((shelf, item.to_owned()))
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Store,
    Ship,
    Move,
    Wait,
}

fn item_schema() -> Value {
    json!({"type": "string", "pattern": "^item_[0-9]+$"})
}

fn shelf_schema() -> Value {
    json!({"type": "string", "pattern": "^shelf_[0-9]+$"})
}

fn spec(op: Op) -> ToolSpec {
    let (name, description, properties, side_effect) = match op {
        Op::Store => (
            "store",
            "Put an item that arrived at the dock on an empty shelf.",
            json!({"item": item_schema(), "shelf": shelf_schema()}),
            SideEffect::Effectful,
        ),
        Op::Ship => (
            "ship",
            "Ship an item to the customer from the shelf that holds it; the item leaves the warehouse.",
            json!({"item": item_schema(), "shelf": shelf_schema()}),
            SideEffect::Effectful,
        ),
        Op::Move => (
            "move",
            "Move an item from the shelf that holds it to an empty shelf.",
            json!({"item": item_schema(), "from": shelf_schema(), "to": shelf_schema()}),
            SideEffect::Effectful,
        ),
        Op::Wait => (
            "wait",
            "Handle the current alert by doing nothing.",
            json!({}),
            SideEffect::ReadOnly,
        ),
    };
    crate::env_tool(KIND, name, description, properties, side_effect)
}

struct ArchiveTool {
    op: Op,
    spec: ToolSpec,
    world: Arc<Mutex<World>>,
}

fn arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[async_trait]
impl Tool for ArchiveTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let mut world = lock(&self.world);
        let result = match self.op {
            Op::Store => world.store(arg(args, "item"), arg(args, "shelf")),
            Op::Ship => world.ship(arg(args, "item"), arg(args, "shelf")),
            Op::Move => world.relocate(arg(args, "item"), arg(args, "from"), arg(args, "to")),
            Op::Wait => Ok("Waited; nothing changed.".to_owned()),
        };
        world.last_action = Some((self.spec.name.clone(), args.clone(), result.is_ok()));
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(text),
        })
    }
}

/// The warehouse archive as an `Environment`.
pub struct WarehouseArchive {
    world: Arc<Mutex<World>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl WarehouseArchive {
    pub fn new(config: ArchiveConfig) -> Self {
        let world = Arc::new(Mutex::new(World::new(config)));
        let tools = [Op::Store, Op::Ship, Op::Move, Op::Wait]
            .into_iter()
            .map(|op| {
                Arc::new(ArchiveTool {
                    op,
                    spec: spec(op),
                    world: Arc::clone(&world),
                }) as Arc<dyn Tool>
            })
            .collect();
        Self { world, tools }
    }

    pub fn events(&self) -> Vec<ArchiveEvent> {
        lock(&self.world).events.clone()
    }
}

impl Environment for WarehouseArchive {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        let mut world = lock(&self.world);
        world.arrive();
        world.alert(0).unwrap_or_default()
    }

    /// Scores the current event and moves to the next one if the action was the warehouse's
    /// own; after any other tool (a recall) the event stays open and nothing is added to the
    /// observation.
    fn after_action(&mut self) -> Option<String> {
        let mut world = lock(&self.world);
        let Some((tool, args, ok)) = world.last_action.take() else {
            world.other_actions += 1;
            return None;
        };
        world.own_actions += 1;
        let event = world.events.get(world.cursor)?;
        let (expected_tool, expected_args) = event.expected_action();
        let hit = ok && tool == expected_tool && args == expected_args;
        world.hits += u32::from(hit);
        world.cursor += 1;
        world.arrive();
        let index = world.cursor;
        world.alert(index)
    }

    fn episode_over(&self) -> bool {
        let world = lock(&self.world);
        world.cursor >= world.events.len()
    }

    fn outcome(&self) -> Value {
        let world = lock(&self.world);
        let events = world.events.len();
        json!({
            "score": f64::from(world.hits) / events.max(1) as f64,
            "correct_actions": world.hits,
            "actionable_events": events,
            "events_handled": world.cursor.min(events),
            "warehouse_actions": world.own_actions,
            "other_actions": world.other_actions,
            "items_stored": world.shelves.len(),
        })
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.world)).unwrap_or(Value::Null)
    }

    fn replayable(&self) -> bool {
        true
    }

    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError> {
        let mut restored: World =
            serde_json::from_value(checkpoint.clone()).map_err(|e| EnvironmentError::Restore {
                kind: KIND.into(),
                message: e.to_string(),
            })?;
        restored.events = generate_events(&restored.config);
        *lock(&self.world) = restored;
        Ok(())
    }
}
