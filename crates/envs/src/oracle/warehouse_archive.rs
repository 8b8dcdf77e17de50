//! The warehouse-archive oracle. Like every oracle it reads only the rendered prompt: the tool
//! list (is `recall` offered?), the state schema (how large may the recent-moves index grow?),
//! the state block and the latest observation, which after a recall is the recall's result.
//!
//! With a state block (strategies `state` and `stateful`) it keeps the skill's state: a bounded
//! index `recent` of item → shelf for the latest stores and moves (the first-listed entry is
//! deleted when it is full), `pending` for the alert awaiting a recall answer, and counters. An order or
//! a maintenance alert whose item is not in the index is recorded as pending and looked up
//! with `recall` (the journal's actions that name the item or shelf, newest first); the next
//! step answers it from the result. Without the recall tool it cannot know, and waits.
//!
//! Without a state block (`history`, `summary`, `window`) it rebuilds the shelves from the
//! transcript the prompt shows, as the warehouse oracle does, and leaves the state alone.

use serde_json::{Map, Value, json};

use super::view::{PromptView, history_lines, read_prompt, relevant_lines};
use super::warehouse::{Inventory, apply_fact, split_latest, words};

/// Entries of the recent-moves index when the prompt's schema does not say.
const DEFAULT_RECENT: usize = 16;
/// Hits a recall asks for: the newest warehouse action naming the subject decides.
const RECALL_LIMIT: u64 = 3;

pub fn answer(prompt: &str) -> String {
    let view = read_prompt(prompt);
    let reply = match view.state.as_ref().and_then(Value::as_object) {
        Some(state) => with_state(prompt, &view, state),
        None => from_transcript(&view),
    };
    reply.to_string()
}

/// What an alert asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Alert {
    Shipment { item: String, shelf: String },
    Order { item: String },
    Maintenance { shelf: String, to: String },
}

fn parse_alert(line: &str) -> Option<Alert> {
    match words(line).as_slice() {
        [
            "Shipment",
            "arrived",
            "containing",
            item,
            "Store",
            "it",
            "on",
            shelf,
        ] => Some(Alert::Shipment {
            item: (*item).into(),
            shelf: (*shelf).into(),
        }),
        ["Customer", "ordered", item] => Some(Alert::Order {
            item: (*item).into(),
        }),
        [
            "Maintenance",
            "required",
            "on",
            shelf,
            "Move",
            "its",
            "item",
            "to",
            to,
        ] => Some(Alert::Maintenance {
            shelf: (*shelf).into(),
            to: (*to).into(),
        }),
        _ => None,
    }
}

/// Whether the prompt's tool list offers `recall`.
fn offers_recall(prompt: &str) -> bool {
    let tools = prompt
        .split_once("\n# Tools\n")
        .map(|(_, rest)| rest.split_once("\n# State\n").map_or(rest, |(t, _)| t))
        .unwrap_or("");
    tools.lines().any(|l| l.starts_with("- recall: "))
}

/// `maxProperties` of the state schema's `recent`, as the prompt shows the schema.
fn recent_limit(prompt: &str) -> usize {
    const INTRO: &str = "The state is a JSON document that must always satisfy this JSON Schema:\n";
    prompt
        .split_once(INTRO)
        .and_then(|(_, rest)| {
            serde_json::Deserializer::from_str(rest)
                .into_iter::<Value>()
                .next()
                .and_then(Result::ok)
        })
        .and_then(|schema| schema["properties"]["recent"]["maxProperties"].as_u64())
        .map_or(DEFAULT_RECENT, |n| n as usize)
}

/// The state's parts the oracle reads and patches.
struct Memory {
    /// item → shelf, in the order the state lists them.
    recent: Vec<(String, String)>,
    limit: usize,
    pending: Option<Value>,
    counters: Map<String, Value>,
    /// The merge patch built so far.
    recent_patch: Map<String, Value>,
    counter_patch: Map<String, Value>,
}

impl Memory {
    fn read(state: &Map<String, Value>, limit: usize) -> Self {
        Self {
            recent: state
                .get("recent")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
            limit: limit.max(1),
            pending: state.get("pending").filter(|p| !p.is_null()).cloned(),
            counters: state
                .get("counters")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            recent_patch: Map::new(),
            counter_patch: Map::new(),
        }
    }

    fn shelf_of(&self, item: &str) -> Option<String> {
        self.recent
            .iter()
            .find(|(i, _)| i == item)
            .map(|(_, s)| s.clone())
    }

    fn item_on(&self, shelf: &str) -> Option<String> {
        self.recent
            .iter()
            .find(|(_, s)| s == shelf)
            .map(|(i, _)| i.clone())
    }

    fn forget(&mut self, item: &str) {
        if let Some(at) = self.recent.iter().position(|(i, _)| i == item) {
            self.recent.remove(at);
            self.recent_patch.insert(item.to_owned(), Value::Null);
        }
    }

    /// Records that `item` is now on `shelf`: in place when indexed, else as a new entry,
    /// deleting the first-listed entry when the index is full.
    fn remember(&mut self, item: &str, shelf: &str) {
        // Whatever the index thought was on that shelf has left it.
        if let Some(other) = self.item_on(shelf).filter(|i| i != item) {
            self.forget(&other);
        }
        if let Some(entry) = self.recent.iter_mut().find(|(i, _)| i == item) {
            entry.1 = shelf.to_owned();
        } else {
            while self.recent.len() >= self.limit {
                let (first, _) = self.recent.remove(0);
                self.recent_patch.insert(first, Value::Null);
            }
            self.recent.push((item.to_owned(), shelf.to_owned()));
        }
        self.recent_patch.insert(item.to_owned(), json!(shelf));
    }

    fn count(&mut self, name: &str) {
        let n = self.counters.get(name).and_then(Value::as_u64).unwrap_or(0) + 1;
        self.counters.insert(name.to_owned(), json!(n));
        self.counter_patch.insert(name.to_owned(), json!(n));
    }

    /// The answer: this step's patch and action.
    fn reply(
        mut self,
        reasoning: String,
        pending: Option<Value>,
        tool: &str,
        args: Value,
    ) -> Value {
        let mut patch = Map::new();
        if tool == "recall" {
            self.count("recalls");
        } else {
            self.count("events");
        }
        if !self.recent_patch.is_empty() {
            patch.insert("recent".into(), Value::Object(self.recent_patch));
        }
        if pending.is_some() || self.pending.is_some() {
            patch.insert("pending".into(), pending.unwrap_or(Value::Null));
        }
        patch.insert("counters".into(), Value::Object(self.counter_patch));
        json!({
            "reasoning": reasoning,
            "state_patch": patch,
            "action": {"tool": tool, "args": args},
        })
    }
}

/// One recall hit: `[step N KIND] TEXT`.
struct Hit<'a> {
    step: &'a str,
    kind: &'a str,
    text: &'a str,
}

fn hits<'a>(lines: &[&'a str]) -> Vec<Hit<'a>> {
    lines
        .iter()
        .filter_map(|line| {
            let rest = line.strip_prefix("[step ")?;
            let (header, text) = rest.split_once("] ")?;
            let (step, kind) = header.split_once(' ')?;
            Some(Hit { step, kind, text })
        })
        .collect()
}

/// A warehouse action a hit records: `(tool, args)`.
fn recorded_action<'a>(hit: &Hit<'a>) -> Option<(&'a str, Value)> {
    if hit.kind != "action" {
        return None;
    }
    let (tool, args) = hit.text.split_once(' ')?;
    let args: Value = serde_json::from_str(args).ok()?;
    matches!(tool, "store" | "ship" | "move").then_some((tool, args))
}

fn field<'v>(args: &'v Value, key: &str) -> &'v str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Where the recalled history last put `item` (`None`: shipped, or never seen), and the step.
fn last_shelf_of(hits: &[Hit<'_>], item: &str) -> Option<(String, String)> {
    for hit in hits {
        let Some((tool, args)) = recorded_action(hit) else {
            continue;
        };
        if field(&args, "item") != item {
            continue;
        }
        return match tool {
            "store" => Some((field(&args, "shelf").to_owned(), hit.step.to_owned())),
            "move" => Some((field(&args, "to").to_owned(), hit.step.to_owned())),
            _ => None,
        };
    }
    None
}

/// The item the recalled history last put on `shelf` (`None`: it left, or never seen).
fn last_item_on(hits: &[Hit<'_>], shelf: &str) -> Option<(String, String)> {
    for hit in hits {
        let Some((tool, args)) = recorded_action(hit) else {
            continue;
        };
        let put = match tool {
            "store" => field(&args, "shelf") == shelf,
            "move" => field(&args, "to") == shelf,
            _ => false,
        };
        if put {
            return Some((field(&args, "item").to_owned(), hit.step.to_owned()));
        }
        let left = match tool {
            "ship" => field(&args, "shelf") == shelf,
            "move" => field(&args, "from") == shelf,
            _ => false,
        };
        if left {
            return None;
        }
    }
    None
}

fn recall_args(subject: &str) -> Value {
    json!({"query": subject, "kinds": ["action"], "limit": RECALL_LIMIT})
}

fn with_state(prompt: &str, view: &PromptView<'_>, state: &Map<String, Value>) -> Value {
    let mut memory = Memory::read(state, recent_limit(prompt));
    let lines = relevant_lines(view.latest);
    let recalled = lines.first().is_some_and(|l| l.starts_with("Recall:"));
    if let Some(pending) = memory.pending.clone() {
        return answer_pending(memory, &pending, recalled.then(|| hits(&lines)));
    }
    let (_, alerts) = split_latest(view.latest);
    let Some(alert) = alerts.iter().find_map(|l| parse_alert(l)) else {
        return memory.reply("No alert to handle.".into(), None, "wait", json!({}));
    };
    let recall = offers_recall(prompt);
    match alert {
        Alert::Shipment { item, shelf } => {
            memory.remember(&item, &shelf);
            memory.reply(
                format!("{item} arrived for {shelf}."),
                None,
                "store",
                json!({"item": item, "shelf": shelf}),
            )
        }
        Alert::Order { item } => match memory.shelf_of(&item) {
            Some(shelf) => {
                memory.forget(&item);
                memory.reply(
                    format!("{item} is on {shelf} (recent moves)."),
                    None,
                    "ship",
                    json!({"item": item, "shelf": shelf}),
                )
            }
            None if recall => memory.reply(
                format!("{item} is not in the recent moves; recalling where it was put."),
                Some(json!({"order": item})),
                "recall",
                recall_args(&item),
            ),
            None => unknown(memory, format!("{item} is not in the state.")),
        },
        Alert::Maintenance { shelf, to } => match memory.item_on(&shelf) {
            Some(item) => {
                memory.remember(&item, &to);
                memory.reply(
                    format!("{shelf} holds {item} (recent moves)."),
                    None,
                    "move",
                    json!({"item": item, "from": shelf, "to": to}),
                )
            }
            None if recall => memory.reply(
                format!("{shelf} is not in the recent moves; recalling what was put on it."),
                Some(json!({"maintenance": shelf, "to": to})),
                "recall",
                recall_args(&shelf),
            ),
            None => unknown(
                memory,
                format!("Nothing in the state says what {shelf} holds."),
            ),
        },
    }
}

/// An alert the agent cannot answer: it waits (and counts it).
fn unknown(mut memory: Memory, reasoning: String) -> Value {
    memory.count("unresolved");
    memory.reply(reasoning, None, "wait", json!({}))
}

/// Answers the pending alert from the recall result (`None`: the observation is not one).
fn answer_pending(mut memory: Memory, pending: &Value, hits: Option<Vec<Hit<'_>>>) -> Value {
    let Some(hits) = hits else {
        return unknown(
            memory,
            "The recall did not answer; giving up on the pending alert.".into(),
        );
    };
    if let Some(item) = pending.get("order").and_then(Value::as_str) {
        return match last_shelf_of(&hits, item) {
            Some((shelf, step)) => {
                memory.forget(item);
                memory.reply(
                    format!("{item} was put on {shelf} at step {step}."),
                    Some(Value::Null),
                    "ship",
                    json!({"item": item, "shelf": shelf}),
                )
            }
            None => unknown(memory, format!("The journal does not say where {item} is.")),
        };
    }
    let shelf = pending.get("maintenance").and_then(Value::as_str);
    let to = pending.get("to").and_then(Value::as_str);
    if let (Some(shelf), Some(to)) = (shelf, to) {
        return match last_item_on(&hits, shelf) {
            Some((item, step)) => {
                memory.remember(&item, to);
                memory.reply(
                    format!("{item} was put on {shelf} at step {step}."),
                    Some(Value::Null),
                    "move",
                    json!({"item": item, "from": shelf, "to": to}),
                )
            }
            None => unknown(
                memory,
                format!("The journal does not say what {shelf} holds."),
            ),
        };
    }
    unknown(
        memory,
        "The pending alert is not one the procedure knows.".into(),
    )
}

/// Without a state block: the shelves as the visible transcript left them; no state patch.
fn from_transcript(view: &PromptView<'_>) -> Value {
    let mut belief = Inventory::new();
    for line in history_lines(view) {
        apply_fact(line, &mut belief);
    }
    let (results, alerts) = split_latest(view.latest);
    for line in &results {
        apply_fact(line, &mut belief);
    }
    let (reasoning, tool, args) = match alerts.iter().find_map(|l| parse_alert(l)) {
        Some(Alert::Shipment { item, shelf }) => (
            format!("{item} arrived for {shelf}."),
            "store",
            json!({"item": item, "shelf": shelf}),
        ),
        Some(Alert::Order { item }) => match belief.iter().find(|(_, i)| **i == item) {
            Some((shelf, _)) => (
                format!("{item} is on {shelf}."),
                "ship",
                json!({"item": item, "shelf": shelf}),
            ),
            None => (
                format!("{item} is not in the transcript."),
                "wait",
                json!({}),
            ),
        },
        Some(Alert::Maintenance { shelf, to }) => match belief.get(&shelf) {
            Some(item) => (
                format!("{shelf} holds {item}."),
                "move",
                json!({"item": item, "from": shelf, "to": to}),
            ),
            None => (
                format!("The transcript does not say what {shelf} holds."),
                "wait",
                json!({}),
            ),
        },
        None => ("No alert to handle.".into(), "wait", json!({})),
    };
    json!({
        "reasoning": reasoning,
        "state_patch": {},
        "action": {"tool": tool, "args": args},
    })
}
