//! The warehouse oracle: reads the prompt, rebuilds the inventory from what the prompt says,
//! and answers with the action and patch a perfect agent would choose on that knowledge.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::view::{PromptView, history_lines, read_prompt, relevant_lines};

/// What the oracle believes is on each shelf.
pub(super) type Inventory = BTreeMap<String, String>;

pub fn answer(prompt: &str) -> String {
    let view = read_prompt(prompt);
    let base = starting_belief(&view);
    let mut belief = base.clone();
    let (result_lines, alert_lines) = split_latest(view.latest);
    for line in result_lines.iter().chain(alert_lines.iter()) {
        apply_fact(line, &mut belief);
    }
    let (reasoning, tool, args) = decide(&alert_lines, &mut belief);
    let patch = diff(&base, &belief);
    json!({
        "reasoning": reasoning,
        "state_patch": {"inventory": patch},
        "action": {"tool": tool, "args": args},
    })
    .to_string()
}

/// The belief before the latest observation: the state block if the prompt has one,
/// otherwise everything the summary and transcript say, replayed in order.
fn starting_belief(view: &PromptView<'_>) -> Inventory {
    if let Some(state) = &view.state {
        return state
            .get("inventory")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
    }
    let mut belief = Inventory::new();
    for line in history_lines(view) {
        apply_fact(line, &mut belief);
    }
    belief
}

/// The latest observation's result lines (what the previous action did) and alert lines.
pub(super) fn split_latest(latest: &str) -> (Vec<&str>, Vec<&str>) {
    relevant_lines(latest).into_iter().partition(|l| {
        l.starts_with("Success:")
            || l.starts_with("Error:")
            || l.starts_with("Waited")
            || l.starts_with("Outcome unknown")
    })
}

pub(super) fn words(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map(|w| w.trim_end_matches(['.', ',', ';']))
        .collect()
}

fn forget_item(belief: &mut Inventory, item: &str) {
    belief.retain(|_, i| i != item);
}

/// Updates the belief with one line's facts; lines without facts change nothing.
pub(super) fn apply_fact(line: &str, belief: &mut Inventory) {
    let w = words(line);
    match w.as_slice() {
        ["Success:", "Stored", item, "on", shelf] => {
            forget_item(belief, item);
            belief.insert((*shelf).into(), (*item).into());
        }
        ["Success:", "Shipped", _item, "from", shelf] => {
            belief.remove(*shelf);
        }
        ["Success:", "Moved", item, "from", from, "to", to] => {
            belief.remove(*from);
            belief.insert((*to).into(), (*item).into());
        }
        ["Error:", shelf, "is", "occupied", "by", item, ..]
        | ["Error:", shelf, "holds", item, ..] => {
            belief.insert((*shelf).into(), (*item).into());
        }
        ["Error:", shelf, "is", "empty", ..] => {
            belief.remove(*shelf);
        }
        ["Audit:", item, "was", "found", "on", shelf, ..] => {
            forget_item(belief, item);
            belief.insert((*shelf).into(), (*item).into());
        }
        ["Audit:", item, "is", "missing", ..] => forget_item(belief, item),
        [
            "Relabel",
            "notice:",
            "the",
            "item",
            "on",
            shelf,
            "now",
            "carries",
            "barcode",
            item,
        ] => {
            belief.insert((*shelf).into(), (*item).into());
        }
        _ => {}
    }
}

/// The action for the alert, applied to the belief.
fn decide(alerts: &[&str], belief: &mut Inventory) -> (String, &'static str, Value) {
    let canceled: Vec<String> = alerts
        .iter()
        .filter_map(|l| match words(l).as_slice() {
            [
                "Update:",
                "the",
                "customer",
                "canceled",
                "the",
                "order",
                "for",
                item,
                ..,
            ] => Some((*item).to_owned()),
            _ => None,
        })
        .collect();
    for line in alerts {
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
            ] => {
                belief.insert((*shelf).into(), (*item).into());
                return (
                    format!("{item} arrived for {shelf}."),
                    "store",
                    json!({"item": item, "shelf": shelf}),
                );
            }
            ["Customer", "ordered", item] if canceled.iter().any(|c| c == item) => {
                return (
                    format!("The order for {item} was canceled; nothing to ship."),
                    "wait",
                    json!({}),
                );
            }
            ["Customer", "ordered", item] => {
                let Some(shelf) = belief
                    .iter()
                    .find(|(_, i)| i == item)
                    .map(|(s, _)| s.clone())
                else {
                    return (
                        format!("{item} is not in the inventory."),
                        "wait",
                        json!({}),
                    );
                };
                belief.remove(&shelf);
                return (
                    format!("{item} is on {shelf}."),
                    "ship",
                    json!({"item": item, "shelf": shelf}),
                );
            }
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
            ] => {
                let Some(item) = belief.get(*shelf).cloned() else {
                    return (
                        format!("The inventory has nothing on {shelf}."),
                        "wait",
                        json!({}),
                    );
                };
                belief.remove(*shelf);
                belief.insert((*to).into(), item.clone());
                return (
                    format!("{shelf} holds {item}."),
                    "move",
                    json!({"item": item, "from": shelf, "to": to}),
                );
            }
            _ => {}
        }
    }
    ("Nothing to do; records updated.".into(), "wait", json!({}))
}

/// A merge patch turning `before` into `after`.
fn diff(before: &Inventory, after: &Inventory) -> Map<String, Value> {
    let mut patch = Map::new();
    for shelf in before.keys().filter(|s| !after.contains_key(*s)) {
        patch.insert(shelf.clone(), Value::Null);
    }
    for (shelf, item) in after {
        if before.get(shelf) != Some(item) {
            patch.insert(shelf.clone(), json!(item));
        }
    }
    patch
}
