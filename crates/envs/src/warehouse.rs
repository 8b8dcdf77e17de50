//! The warehouse environment of the SKILL.state paper (BENCHMARK.md): 500 shelves, items that
//! arrive, are ordered and must be moved off shelves under maintenance.
//!
//! The event sequence is generated up front from the seed by simulating a correct agent (the
//! ground truth), so every strategy and every model sees exactly the same events. What the agent
//! really did lives in `World`; the score counts steps whose action both succeeded and was the
//! ground truth's action for that event.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

use crate::params::Params;
use crate::rng::SeededRng;

pub const KIND: &str = "warehouse";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarehouseConfig {
    pub seed: u64,
    /// Number of events, one per step (the horizon T).
    pub events: u32,
    pub shelves: u32,
}

impl WarehouseConfig {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let mut p = Params::new(KIND, params);
        let config = Self {
            seed: p.u64("seed", 0, 0, u64::MAX)?,
            events: p.u64("events", 10, 1, 100_000)? as u32,
            shelves: p.u64("shelves", 500, 2, 100_000)? as u32,
        };
        p.finish()?;
        Ok(config)
    }
}

/// One thing that happens in the warehouse, with the action a correct agent takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Receive {
        item: String,
        shelf: String,
    },
    Order {
        item: String,
        shelf: String,
    },
    Maintenance {
        item: String,
        shelf: String,
        to: String,
    },
}

impl Event {
    /// What the agent is told. Orders and maintenance deliberately omit what the agent must
    /// remember (where the item is; which item is on the shelf).
    pub fn alert(&self) -> String {
        match self {
            Event::Receive { item, shelf } => {
                format!("Shipment arrived containing {item}. Store it on {shelf}.")
            }
            Event::Order { item, .. } => format!("Customer ordered {item}."),
            Event::Maintenance { shelf, to, .. } => {
                format!("Maintenance required on {shelf}. Move its item to {to}.")
            }
        }
    }

    /// The ground-truth action as `(tool, args)`.
    pub fn expected_action(&self) -> (&'static str, Value) {
        match self {
            Event::Receive { item, shelf } => ("store", json!({"item": item, "shelf": shelf})),
            Event::Order { item, shelf } => ("ship", json!({"item": item, "shelf": shelf})),
            Event::Maintenance { item, shelf, to } => {
                ("move", json!({"item": item, "from": shelf, "to": to}))
            }
        }
    }
}

/// The answer a perfect agent gives to `event` with the warehouse skill: the inventory patch
/// and the ground-truth action, in the JSON object form. Scripts for demos and tests are built
/// from it.
pub fn reference_answer(event: &Event) -> String {
    let (tool, args) = event.expected_action();
    let patch = match event {
        Event::Receive { item, shelf } => json!({"inventory": {shelf: item}}),
        Event::Order { shelf, .. } => json!({"inventory": {shelf: Value::Null}}),
        Event::Maintenance { item, shelf, to } => {
            json!({"inventory": {shelf: Value::Null, to: item}})
        }
    };
    json!({"reasoning": "following the procedure", "state_patch": patch, "action": {"tool": tool, "args": args}}).to_string()
}

/// Generates the event sequence for a configuration (BENCHMARK.md "Event generation").
pub fn generate_events(config: &WarehouseConfig) -> Vec<Event> {
    let mut rng = SeededRng::new(config.seed);
    let mut truth: BTreeMap<u32, String> = BTreeMap::new();
    let mut used_items: BTreeSet<u64> = BTreeSet::new();
    let mut events = Vec::with_capacity(config.events as usize);
    for _ in 0..config.events {
        let full = truth.len() as u32 >= config.shelves - 1;
        let choice = if truth.is_empty() {
            0
        } else if full {
            1 + rng.below(2)
        } else {
            rng.below(3)
        };
        let event = match choice {
            0 => {
                let item = loop {
                    let n = rng.below(10_000);
                    if used_items.insert(n) {
                        break format!("item_{n}");
                    }
                };
                let shelf = random_empty_shelf(&mut rng, &truth, config.shelves);
                truth.insert(shelf, item.clone());
                Event::Receive {
                    item,
                    shelf: shelf_name(shelf),
                }
            }
            1 => {
                let (&shelf, item) = nth_entry(&truth, rng.index(truth.len()));
                let item = item.clone();
                truth.remove(&shelf);
                Event::Order {
                    item,
                    shelf: shelf_name(shelf),
                }
            }
            _ => {
                let (&shelf, item) = nth_entry(&truth, rng.index(truth.len()));
                let item = item.clone();
                let to = random_empty_shelf(&mut rng, &truth, config.shelves);
                truth.remove(&shelf);
                truth.insert(to, item.clone());
                Event::Maintenance {
                    item,
                    shelf: shelf_name(shelf),
                    to: shelf_name(to),
                }
            }
        };
        events.push(event);
    }
    events
}

fn nth_entry(map: &BTreeMap<u32, String>, n: usize) -> (&u32, &String) {
    map.iter()
        .nth(n)
        .unwrap_or_else(|| unreachable!("index drawn below the map's length"))
}

fn random_empty_shelf(rng: &mut SeededRng, taken: &BTreeMap<u32, String>, shelves: u32) -> u32 {
    loop {
        let shelf = rng.below(u64::from(shelves)) as u32;
        if !taken.contains_key(&shelf) {
            return shelf;
        }
    }
}

pub fn shelf_name(index: u32) -> String {
    format!("shelf_{index}")
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
    config: WarehouseConfig,
    shelves: BTreeMap<u32, String>,
    /// Items that arrived and wait to be stored.
    dock: BTreeSet<String>,
    /// Index of the event the agent is handling now.
    cursor: usize,
    /// Steps whose action succeeded and matched the ground truth.
    hits: u32,
    /// The action taken since the last event, and whether it succeeded.
    last_action: Option<(String, Value, bool)>,
    #[serde(skip)]
    events: Vec<Event>,
}

impl World {
    fn new(config: WarehouseConfig) -> Self {
        let events = generate_events(&config);
        Self {
            config,
            shelves: BTreeMap::new(),
            dock: BTreeSet::new(),
            cursor: 0,
            hits: 0,
            last_action: None,
            events,
        }
    }

    fn arrive(&mut self) {
        if let Some(Event::Receive { item, .. }) = self.events.get(self.cursor) {
            self.dock.insert(item.clone());
        }
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
        if !self.dock.contains(item) {
            return Err(format!(
                "Error: {item} is not waiting at the dock; nothing changed."
            ));
        }
        self.dock.remove(item);
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Store,
    Ship,
    Move,
    Wait,
}

struct WarehouseTool {
    op: Op,
    spec: ToolSpec,
    world: Arc<Mutex<World>>,
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
            "Do nothing this step.",
            json!({}),
            SideEffect::ReadOnly,
        ),
    };
    let required: Vec<&String> = properties
        .as_object()
        .map(|m| m.keys().collect())
        .unwrap_or_default();
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false
        }),
        side_effect,
        source: KIND.into(),
    }
}

fn arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[async_trait]
impl Tool for WarehouseTool {
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
        let ok = result.is_ok();
        world.last_action = Some((self.spec.name.clone(), args.clone(), ok));
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(text),
        })
    }
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    // A panic while holding the lock cannot leave the world half-updated: every mutation
    // happens after its checks, so the poisoned data is still consistent.
    world
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The warehouse as an `Environment`.
pub struct Warehouse {
    world: Arc<Mutex<World>>,
    tools: Vec<Arc<dyn Tool>>,
}

impl Warehouse {
    pub fn new(config: WarehouseConfig) -> Self {
        let world = Arc::new(Mutex::new(World::new(config)));
        let tools = [Op::Store, Op::Ship, Op::Move, Op::Wait]
            .into_iter()
            .map(|op| {
                Arc::new(WarehouseTool {
                    op,
                    spec: spec(op),
                    world: Arc::clone(&world),
                }) as Arc<dyn Tool>
            })
            .collect();
        Self { world, tools }
    }

    pub fn events(&self) -> Vec<Event> {
        lock(&self.world).events.clone()
    }
}

impl Environment for Warehouse {
    fn kind(&self) -> &str {
        KIND
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    fn opening_observation(&mut self) -> String {
        let mut world = lock(&self.world);
        world.arrive();
        world.events.first().map(Event::alert).unwrap_or_default()
    }

    fn after_action(&mut self) -> Option<String> {
        let mut world = lock(&self.world);
        let event = world.events.get(world.cursor).cloned()?;
        if let Some((tool, args, ok)) = world.last_action.take() {
            let (expected_tool, expected_args) = event.expected_action();
            if ok && tool == expected_tool && args == expected_args {
                world.hits += 1;
            }
        }
        world.cursor += 1;
        world.arrive();
        world.events.get(world.cursor).map(Event::alert)
    }

    fn episode_over(&self) -> bool {
        let world = lock(&self.world);
        world.cursor >= world.events.len()
    }

    fn outcome(&self) -> Value {
        let world = lock(&self.world);
        let events = world.events.len().max(1) as f64;
        json!({
            "score": f64::from(world.hits) / events,
            "correct_actions": world.hits,
            "actionable_events": world.events.len(),
            "events_handled": world.cursor.min(world.events.len()),
        })
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.world)).unwrap_or(Value::Null)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(seed: u64, events: u32) -> WarehouseConfig {
        WarehouseConfig {
            seed,
            events,
            shelves: 500,
        }
    }

    #[test]
    fn events_are_deterministic_and_consistent() {
        let a = generate_events(&config(3, 200));
        assert_eq!(a, generate_events(&config(3, 200)));
        assert_ne!(a, generate_events(&config(4, 200)));
        // Replaying the ground truth never hits an impossible action.
        let mut truth: BTreeMap<String, String> = BTreeMap::new();
        for event in &a {
            match event {
                Event::Receive { item, shelf } => {
                    assert!(truth.insert(shelf.clone(), item.clone()).is_none())
                }
                Event::Order { item, shelf } => {
                    assert_eq!(truth.remove(shelf).as_ref(), Some(item))
                }
                Event::Maintenance { item, shelf, to } => {
                    assert_eq!(truth.remove(shelf).as_ref(), Some(item));
                    assert!(truth.insert(to.clone(), item.clone()).is_none());
                }
            }
        }
        let kinds: BTreeSet<&str> = a.iter().map(|e| e.expected_action().0).collect();
        assert_eq!(kinds.len(), 3);
    }

    #[tokio::test]
    async fn correct_agent_scores_one_and_mistakes_change_nothing() {
        let mut env = Warehouse::new(config(11, 30));
        let events = env.events();
        let tools = env.tools();
        let ctx = CallContext::new("t", 1);
        assert_eq!(env.opening_observation(), events[0].alert());
        let before = lock(&env.world).shelves.clone();
        let store = skillstate_tools::find_tool(&tools, "store").unwrap();
        let bad = store
            .call(&json!({"item": "item_99999", "shelf": "shelf_1"}), &ctx)
            .await
            .unwrap();
        assert!(
            !bad.ok && bad.text.contains("nothing changed"),
            "{}",
            bad.text
        );
        assert_eq!(lock(&env.world).shelves, before);
        for (index, event) in events.iter().enumerate() {
            let (tool, args) = event.expected_action();
            let out = skillstate_tools::find_tool(&tools, tool)
                .unwrap()
                .call(&args, &ctx)
                .await
                .unwrap();
            assert!(out.ok, "{} -> {}", event.alert(), out.text);
            let next = env.after_action();
            assert_eq!(next, events.get(index + 1).map(Event::alert));
        }
        assert!(env.episode_over());
        let outcome = env.outcome();
        assert_eq!(outcome["score"], 1.0);
        let checkpoint = env.checkpoint();
        let mut copy = Warehouse::new(config(0, 1));
        copy.restore(&checkpoint).unwrap();
        assert_eq!(copy.checkpoint(), checkpoint);
        assert_eq!(copy.outcome(), outcome);
    }

    #[tokio::test]
    async fn only_the_ground_truth_action_scores() {
        let mut env = Warehouse::new(config(11, 3));
        env.opening_observation();
        let tools = env.tools();
        let wait = skillstate_tools::find_tool(&tools, "wait").unwrap();
        let out = wait
            .call(&json!({}), &CallContext::new("t", 1))
            .await
            .unwrap();
        assert!(out.ok);
        env.after_action();
        assert_eq!(env.outcome()["correct_actions"], 0);
    }
}
