//! The warehouse environment of the SKILL.state paper (docs/example-skills.md, "The example skills"): 500 shelves,
//! items that arrive, are ordered and must be moved off shelves under maintenance.
//!
//! The event sequence is generated up front from the seed by simulating a correct agent (the
//! ground truth), so every strategy and every model sees exactly the same events. What the agent
//! really did lives in `World`; the score counts steps whose action both succeeded and was the
//! ground truth's action for that event.

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

pub use events::{Change, Drift, Event, Expected, generate_events};

use crate::noise::{warehouse_lines, with_telemetry};
use crate::params::{ParamSpec, Params};

pub const KIND: &str = "warehouse";

/// `drift`'s values: `none` and every [`Drift`] scenario.
pub const DRIFT_NAMES: &[&str] = &[
    "none",
    "secret_move",
    "secret_audit",
    "secret_barcode",
    "canceled_order",
];

/// The warehouse's `[environment]` parameters (docs/example-skills.md, "The example skills").
pub const PARAMETERS: &[ParamSpec] = &[
    ParamSpec::whole("seed", 0, 0, u64::MAX),
    ParamSpec::whole("events", 10, 1, 100_000),
    ParamSpec::whole("shelves", 500, 2, 100_000),
    ParamSpec::whole("noise", 0, 0, 1000),
    ParamSpec::one_of("drift", "none", DRIFT_NAMES),
    ParamSpec::path("audit_log"),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarehouseConfig {
    pub seed: u64,
    /// Number of events, one per step (the horizon T).
    pub events: u32,
    pub shelves: u32,
    /// Telemetry lines appended to every observation.
    #[serde(default)]
    pub noise: u32,
    #[serde(default)]
    pub drift: Option<Drift>,
    /// A file that every executed store/ship/move appends one line to (idempotency key, tool,
    /// arguments, outcome), synced before the tool returns: an external record of side effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<String>,
}

impl WarehouseConfig {
    pub fn new(seed: u64, events: u32) -> Self {
        Self {
            seed,
            events,
            shelves: 500,
            noise: 0,
            drift: None,
            audit_log: None,
        }
    }

    pub fn from_params(params: &Map<String, Value>) -> Result<Self, EnvironmentError> {
        let p = Params::new(KIND, PARAMETERS, params);
        let config = Self {
            seed: p.u64("seed")?,
            events: p.u64("events")? as u32,
            shelves: p.u64("shelves")? as u32,
            noise: p.u64("noise")? as u32,
            drift: Drift::parse(&p.string("drift")?),
            audit_log: p.optional_text("audit_log")?,
        };
        p.finish()?;
        Ok(config)
    }
}

/// The answer a perfect agent gives to `event` with the warehouse skill: the inventory patch
/// and the ground-truth action, in the JSON object form. Scripts for demos and tests are built
/// from it.
pub fn reference_answer(event: &Event) -> String {
    let (tool, args) = event.expected_action();
    let mut patch = Map::new();
    match &event.expected {
        Expected::Store { item, shelf } => {
            patch.insert(shelf.clone(), json!(item));
        }
        Expected::Ship { shelf, .. } => {
            patch.insert(shelf.clone(), Value::Null);
        }
        Expected::Move { item, from, to } => {
            patch.insert(from.clone(), Value::Null);
            patch.insert(to.clone(), json!(item));
        }
        Expected::Wait => {}
    }
    match &event.reveals {
        Some(Change::Moved { item, from, to }) => {
            patch.insert(from.clone(), Value::Null);
            patch.insert(to.clone(), json!(item));
        }
        Some(Change::Removed { shelf, .. }) => {
            patch.insert(shelf.clone(), Value::Null);
        }
        Some(Change::Relabelled {
            new_item, shelf, ..
        }) => {
            patch.insert(shelf.clone(), json!(new_item));
        }
        None => {}
    }
    json!({"reasoning": "following the procedure", "state_patch": {"inventory": patch}, "action": {"tool": tool, "args": args}})
        .to_string()
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
    /// Drift-dependent events seen, and how many of them were handled wrongly.
    #[serde(default)]
    dependent_seen: u32,
    #[serde(default)]
    dependent_misses: u32,
    /// Whether the last drift-dependent event was handled correctly.
    #[serde(default)]
    last_dependent_hit: bool,
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
            dependent_seen: 0,
            dependent_misses: 0,
            last_dependent_hit: false,
            last_action: None,
            events,
        }
    }

    /// The current event reaches the world: its hidden change happens, its shipment arrives.
    fn arrive(&mut self) {
        let Some(event) = self.events.get(self.cursor).cloned() else {
            return;
        };
        if let Some(change) = &event.hidden_change {
            self.apply_hidden(change);
        }
        if let Expected::Store { item, .. } = &event.expected {
            self.dock.insert(item.clone());
        }
    }

    /// Someone else changes the world. Works from where the item really is, which may differ
    /// from the ground truth if the agent went wrong earlier.
    fn apply_hidden(&mut self, change: &Change) {
        let location = |world: &World, item: &str| {
            world
                .shelves
                .iter()
                .find(|(_, i)| i.as_str() == item)
                .map(|(s, _)| *s)
        };
        match change {
            Change::Moved { item, to, .. } => {
                if let (Some(from), Some(to)) =
                    (location(self, item), parse_shelf(to, self.config.shelves))
                    && !self.shelves.contains_key(&to)
                {
                    self.shelves.remove(&from);
                    self.shelves.insert(to, item.clone());
                }
            }
            Change::Removed { item, .. } => {
                if let Some(from) = location(self, item) {
                    self.shelves.remove(&from);
                }
            }
            Change::Relabelled { item, new_item, .. } => {
                if let Some(at) = location(self, item) {
                    self.shelves.insert(at, new_item.clone());
                }
            }
        }
    }

    fn telemetry(&self, text: String, index: usize) -> String {
        with_telemetry(
            text,
            warehouse_lines(self.config.seed, index, self.config.noise),
        )
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
    crate::env_tool(KIND, name, description, properties, side_effect)
}

fn arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[async_trait]
impl Tool for WarehouseTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let mut world = lock(&self.world);
        let result = match self.op {
            Op::Store => world.store(arg(args, "item"), arg(args, "shelf")),
            Op::Ship => world.ship(arg(args, "item"), arg(args, "shelf")),
            Op::Move => world.relocate(arg(args, "item"), arg(args, "from"), arg(args, "to")),
            Op::Wait => Ok("Waited; nothing changed.".to_owned()),
        };
        let ok = result.is_ok();
        world.last_action = Some((self.spec.name.clone(), args.clone(), ok));
        if self.op != Op::Wait
            && let Some(path) = &world.config.audit_log
        {
            append_audit(
                path,
                &format!(
                    "{}\t{}\t{args}\t{ok}\n",
                    ctx.idempotency_key, self.spec.name
                ),
            )
            .map_err(|e| ToolError::Failed {
                tool: self.spec.name.clone(),
                message: format!("cannot write the audit log {path}: {e}"),
            })?;
            skillstate_tools::failpoint("in_tool");
        }
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(text),
        })
    }
}

fn append_audit(path: &str, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())?;
    file.sync_data()
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
        let alert = world
            .events
            .first()
            .map(|e| e.alert.clone())
            .unwrap_or_default();
        world.telemetry(alert, 0)
    }

    fn after_action(&mut self) -> Option<String> {
        let mut world = lock(&self.world);
        let event = world.events.get(world.cursor).cloned()?;
        let (expected_tool, expected_args) = event.expected_action();
        let hit = matches!(world.last_action.take(), Some((tool, args, true)) if tool == expected_tool && args == expected_args);
        world.hits += u32::from(hit);
        if event.drift_dependent {
            world.dependent_seen += 1;
            world.dependent_misses += u32::from(!hit);
            world.last_dependent_hit = hit;
        }
        world.cursor += 1;
        world.arrive();
        let index = world.cursor;
        let alert = world.events.get(index).map(|e| e.alert.clone())?;
        Some(world.telemetry(alert, index))
    }

    fn episode_over(&self) -> bool {
        let world = lock(&self.world);
        world.cursor >= world.events.len()
    }

    fn outcome(&self) -> Value {
        let world = lock(&self.world);
        let events = world.events.len().max(1) as f64;
        let mut outcome = json!({
            "score": f64::from(world.hits) / events,
            "correct_actions": world.hits,
            "actionable_events": world.events.len(),
            "events_handled": world.cursor.min(world.events.len()),
        });
        if let Some(drift) = world.config.drift {
            outcome["drift"] = json!({
                "scenario": drift.as_str(),
                "dependent_events": world.dependent_seen,
                "recovery_steps": world.dependent_misses,
                "recovered": world.last_dependent_hit,
            });
        }
        outcome
    }

    fn checkpoint(&self) -> Value {
        serde_json::to_value(&*lock(&self.world)).unwrap_or(Value::Null)
    }

    /// A simulation, unless it keeps an audit log: that file is outside the world, and
    /// running the recorded actions again would append them to it a second time.
    fn replayable(&self) -> bool {
        lock(&self.world).config.audit_log.is_none()
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
        WarehouseConfig::new(seed, events)
    }

    /// Replays the ground truth; every expected action must be possible.
    fn replay(events: &[Event]) {
        let mut truth: BTreeMap<String, String> = BTreeMap::new();
        for event in events {
            match &event.hidden_change {
                Some(Change::Moved { item, from, to }) => {
                    assert_eq!(truth.remove(from).as_ref(), Some(item));
                    assert!(truth.insert(to.clone(), item.clone()).is_none());
                }
                Some(Change::Removed { item, shelf }) => {
                    assert_eq!(truth.remove(shelf).as_ref(), Some(item))
                }
                Some(Change::Relabelled {
                    item,
                    new_item,
                    shelf,
                }) => {
                    assert_eq!(
                        truth.insert(shelf.clone(), new_item.clone()).as_ref(),
                        Some(item)
                    )
                }
                None => {}
            }
            match &event.expected {
                Expected::Store { item, shelf } => {
                    assert!(truth.insert(shelf.clone(), item.clone()).is_none())
                }
                Expected::Ship { item, shelf } => {
                    assert_eq!(truth.remove(shelf).as_ref(), Some(item), "{}", event.alert)
                }
                Expected::Move { item, from, to } => {
                    assert_eq!(truth.remove(from).as_ref(), Some(item), "{}", event.alert);
                    assert!(truth.insert(to.clone(), item.clone()).is_none());
                }
                Expected::Wait => {}
            }
        }
    }

    #[test]
    fn events_are_deterministic_and_consistent() {
        let a = generate_events(&config(3, 200));
        assert_eq!(a, generate_events(&config(3, 200)));
        assert_ne!(a, generate_events(&config(4, 200)));
        replay(&a);
        let kinds: BTreeSet<&str> = a.iter().map(|e| e.expected_action().0).collect();
        assert_eq!(kinds, BTreeSet::from(["move", "ship", "store"]));
    }

    #[test]
    fn drift_scenarios_hide_a_change_then_reveal_and_probe_it() {
        for drift in Drift::ALL {
            for seed in 0..20 {
                let mut c = config(seed, 50);
                c.drift = Some(drift);
                let events = generate_events(&c);
                assert_eq!(events.len(), 50);
                replay(&events);
                let dependent = events.iter().filter(|e| e.drift_dependent).count();
                assert!(
                    dependent >= 2,
                    "{drift:?} seed {seed}: {dependent} dependent events"
                );
                let hidden = events.iter().filter(|e| e.hidden_change.is_some()).count();
                assert_eq!(
                    hidden,
                    usize::from(drift != Drift::CanceledOrder),
                    "{drift:?}"
                );
            }
        }
    }

    async fn play(config: WarehouseConfig, answer: impl Fn(&Event) -> (String, Value)) -> Value {
        let events = generate_events(&config);
        let mut env = Warehouse::new(config);
        let tools = env.tools();
        let ctx = CallContext::new("t", 1);
        let mut observation = env.opening_observation();
        for (index, event) in events.iter().enumerate() {
            assert!(
                observation.contains(&event.alert),
                "step {index}: {observation}"
            );
            let (tool, args) = answer(event);
            skillstate_tools::find_tool(&tools, &tool)
                .unwrap()
                .call(&args, &ctx)
                .await
                .unwrap();
            match env.after_action() {
                Some(next) => observation = next,
                None => assert_eq!(index + 1, events.len()),
            }
        }
        assert!(env.episode_over());
        env.outcome()
    }

    #[tokio::test]
    async fn the_ground_truth_scores_one_even_with_drift_and_noise() {
        for drift in [
            None,
            Some(Drift::SecretMove),
            Some(Drift::SecretBarcode),
            Some(Drift::CanceledOrder),
            Some(Drift::SecretAudit),
        ] {
            let mut c = config(11, 40);
            c.drift = drift;
            c.noise = 5;
            let outcome = play(c, |e| {
                let (tool, args) = e.expected_action();
                (tool.to_owned(), args)
            })
            .await;
            assert_eq!(outcome["score"], 1.0, "{drift:?}: {outcome}");
            if drift.is_some() {
                assert_eq!(outcome["drift"]["recovery_steps"], 0, "{outcome}");
                assert_eq!(outcome["drift"]["recovered"], true);
            }
        }
    }

    #[tokio::test]
    async fn stale_knowledge_shows_up_as_recovery_steps() {
        let mut c = config(5, 50);
        c.drift = Some(Drift::SecretMove);
        // An agent that ignores the audit keeps using the old shelf and never waits on it.
        let outcome = play(c, |e| {
            let (tool, args) = e.expected_action();
            if e.reveals.is_some() {
                (
                    "ship".to_owned(),
                    json!({"item": "item_0", "shelf": "shelf_0"}),
                )
            } else {
                (tool.to_owned(), args)
            }
        })
        .await;
        assert!(
            outcome["drift"]["recovery_steps"].as_u64().unwrap() >= 1,
            "{outcome}"
        );
    }

    #[tokio::test]
    async fn mistakes_change_nothing_and_score_nothing() {
        let mut env = Warehouse::new(config(11, 3));
        env.opening_observation();
        let before = lock(&env.world).shelves.clone();
        let tools = env.tools();
        let ctx = CallContext::new("t", 1);
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
        env.after_action();
        assert_eq!(env.outcome()["correct_actions"], 0);
    }

    #[tokio::test]
    async fn checkpoints_restore_the_same_world() {
        let mut env = Warehouse::new(config(11, 30));
        env.opening_observation();
        let events = env.events();
        let tools = env.tools();
        for event in &events[..10] {
            let (tool, args) = event.expected_action();
            skillstate_tools::find_tool(&tools, tool)
                .unwrap()
                .call(&args, &CallContext::new("t", 1))
                .await
                .unwrap();
            env.after_action();
        }
        let checkpoint = env.checkpoint();
        let mut copy = Warehouse::new(config(0, 1));
        copy.restore(&checkpoint).unwrap();
        assert_eq!(copy.checkpoint(), checkpoint);
        assert_eq!(copy.outcome(), env.outcome());
        assert_eq!(copy.events(), events);
    }

    #[test]
    fn a_warehouse_with_an_audit_log_is_not_replayed() {
        assert!(Warehouse::new(config(3, 5)).replayable());
        let mut audited = config(3, 5);
        audited.audit_log = Some("/tmp/audit.log".into());
        let audited = Warehouse::new(audited);
        assert!(!audited.replayable());
        // Nor is a world restored from such a warehouse's checkpoint.
        let mut restored = Warehouse::new(config(3, 5));
        restored.restore(&audited.checkpoint()).unwrap();
        assert!(!restored.replayable());
    }

    #[test]
    fn telemetry_follows_the_alert() {
        let mut c = config(2, 5);
        c.noise = 3;
        let mut env = Warehouse::new(c);
        let first = env.opening_observation();
        let lines: Vec<&str> = first.lines().collect();
        assert_eq!(lines.len(), 5, "{first}");
        assert_eq!(lines[1], crate::noise::HEADER);
    }
}
