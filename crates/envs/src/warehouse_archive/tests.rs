#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use super::*;

fn config(seed: u64, events: u32) -> ArchiveConfig {
    ArchiveConfig::new(seed, events)
}

/// Replays the ground truth on a shelf map; every expected action must be possible. Returns,
/// for every order and maintenance, how many events ago its item was last stored or moved.
fn replay(events: &[ArchiveEvent]) -> Vec<usize> {
    let mut truth: BTreeMap<String, String> = BTreeMap::new();
    let mut touched: HashMap<String, usize> = HashMap::new();
    let mut ages = Vec::new();
    for (index, event) in events.iter().enumerate() {
        match &event.expected {
            Expected::Store { item, shelf } => {
                assert!(truth.insert(shelf.clone(), item.clone()).is_none());
                assert!(
                    touched.insert(item.clone(), index).is_none(),
                    "{item} arrived twice"
                );
            }
            Expected::Ship { item, shelf } => {
                assert_eq!(truth.remove(shelf).as_ref(), Some(item), "{}", event.alert);
                ages.push(index - touched[item]);
            }
            Expected::Move { item, from, to } => {
                assert_eq!(truth.remove(from).as_ref(), Some(item), "{}", event.alert);
                assert!(truth.insert(to.clone(), item.clone()).is_none());
                ages.push(index - touched.insert(item.clone(), index).unwrap());
            }
            Expected::Wait => panic!("the archive has no idle events while a shelf is free"),
        }
    }
    ages
}

#[test]
fn events_are_deterministic_consistent_and_mostly_about_the_distant_past() {
    let a = generate_events(&config(3, 3_000));
    assert_eq!(a, generate_events(&config(3, 3_000)));
    assert_ne!(a, generate_events(&config(4, 3_000)));
    // A longer run starts with the same events.
    assert_eq!(a[..500], generate_events(&config(3, 500))[..]);
    let ages = replay(&a);
    let count = |tool: &str| a.iter().filter(|e| e.expected_action().0 == tool).count();
    let (stores, ships, moves) = (count("store"), count("ship"), count("move"));
    assert_eq!(stores + ships + moves, a.len());
    // The mix the constants promise, within a few percent.
    for (n, percent) in [
        (stores, RECEIVE_PERCENT),
        (ships, ORDER_PERCENT),
        (moves, 100 - RECEIVE_PERCENT - ORDER_PERCENT),
    ] {
        let share = n as f64 / a.len() as f64 * 100.0;
        assert!((share - percent as f64).abs() < 4.0, "{share} vs {percent}");
    }
    // A 16-entry index of recent moves would know the item of fewer than one in four orders
    // and maintenance alerts: most name something last touched over 16 events ago.
    let old = ages.iter().filter(|age| **age > 16).count();
    assert!(old * 4 > ages.len() * 3, "{old} of {} are old", ages.len());
    // Alerts never say what the agent must remember.
    for event in &a {
        match &event.expected {
            Expected::Ship { shelf, .. } => assert!(!event.alert.contains(shelf.as_str())),
            Expected::Move { item, .. } => assert!(!event.alert.contains(item.as_str())),
            _ => {}
        }
    }
}

#[test]
fn tiny_warehouses_and_long_runs_stay_consistent() {
    for shelves in [2, 3, 10] {
        let mut c = config(9, 2_000);
        c.shelves = shelves;
        let events = generate_events(&c);
        assert_eq!(events.len(), 2_000);
        replay(&events);
    }
    let events = generate_events(&config(1, 10_000));
    let items: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match &e.expected {
            Expected::Store { item, .. } => Some(item.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        items.len(),
        events
            .iter()
            .filter(|e| e.expected_action().0 == "store")
            .count(),
        "item ids are unique"
    );
}

/// Plays `events` with the ground truth, calling `extra` other actions (as a recall would be)
/// before every `every`-th event.
async fn play(
    c: ArchiveConfig,
    every: usize,
    answer: impl Fn(&ArchiveEvent) -> (String, Value),
) -> Value {
    let events = generate_events(&c);
    let mut env = WarehouseArchive::new(c);
    let tools = env.tools();
    let ctx = CallContext::new("t", 1);
    let mut observation = env.opening_observation();
    for (index, event) in events.iter().enumerate() {
        assert!(
            observation.starts_with(&event.alert),
            "step {index}: {observation}"
        );
        if every > 0 && index % every == 0 {
            // Not one of the warehouse's tools: the event stays, nothing new is observed.
            assert_eq!(env.after_action(), None);
            assert!(!env.episode_over());
        }
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

fn truth(event: &ArchiveEvent) -> (String, Value) {
    let (tool, args) = event.expected_action();
    (tool.to_owned(), args)
}

#[tokio::test]
async fn the_ground_truth_scores_one_and_other_tools_never_use_up_an_event() {
    let outcome = play(config(11, 300), 0, truth).await;
    assert_eq!(outcome["score"], 1.0, "{outcome}");
    let mut c = config(11, 300);
    c.noise = 3;
    let outcome = play(c, 3, truth).await;
    assert_eq!(outcome["score"], 1.0, "{outcome}");
    assert_eq!(outcome["events_handled"], 300);
    assert_eq!(outcome["warehouse_actions"], 300);
    assert_eq!(outcome["other_actions"], 100);
}

#[tokio::test]
async fn a_wrong_guess_scores_nothing_and_changes_nothing() {
    // Waiting on every order (an agent that cannot find the item) loses the orders, and a few
    // shipments more: the item it left behind still blocks the shelf a later shipment is for.
    let events = generate_events(&config(5, 200));
    let orders = events
        .iter()
        .filter(|e| e.expected_action().0 == "ship")
        .count();
    let outcome = play(config(5, 200), 0, |e| match e.expected_action() {
        ("ship", _) => ("wait".to_owned(), json!({})),
        (tool, args) => (tool.to_owned(), args),
    })
    .await;
    let correct = outcome["correct_actions"].as_u64().unwrap() as usize;
    assert!(
        correct + orders <= 200 && correct + orders >= 190,
        "{orders} orders: {outcome}"
    );
    let mut env = WarehouseArchive::new(config(5, 3));
    env.opening_observation();
    let before = lock(&env.world).shelves.clone();
    let ship = env
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "ship")
        .unwrap();
    let bad = ship
        .call(
            &json!({"item": "item_1", "shelf": "shelf_4999"}),
            &CallContext::new("t", 1),
        )
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
    assert_eq!(env.outcome()["events_handled"], 1);
}

#[tokio::test]
async fn checkpoints_restore_the_same_world() {
    let mut env = WarehouseArchive::new(config(11, 50));
    env.opening_observation();
    let events = env.events();
    let tools = env.tools();
    for event in &events[..20] {
        let (tool, args) = event.expected_action();
        skillstate_tools::find_tool(&tools, tool)
            .unwrap()
            .call(&args, &CallContext::new("t", 1))
            .await
            .unwrap();
        env.after_action();
    }
    env.after_action();
    let checkpoint = env.checkpoint();
    let mut copy = WarehouseArchive::new(config(0, 1));
    copy.restore(&checkpoint).unwrap();
    assert_eq!(copy.checkpoint(), checkpoint);
    assert_eq!(copy.outcome(), env.outcome());
    assert_eq!(copy.events(), events);
    assert!(
        checkpoint["shelves"].as_str().unwrap().contains('='),
        "{checkpoint}"
    );
    assert!(
        copy.restore(&json!({"config": 1})).is_err(),
        "a damaged checkpoint is an error, not a panic"
    );
    let mut damaged = checkpoint.clone();
    damaged["shelves"] = json!("12=item_1 shelf_3");
    let error = copy.restore(&damaged).unwrap_err().to_string();
    assert!(error.contains("`shelf_3` is not SHELF=ITEM"), "{error}");
}

#[test]
fn parameters_are_read_and_checked() {
    let params = json!({"seed": 4, "events": 10_000, "shelves": 5000})
        .as_object()
        .cloned()
        .unwrap();
    let c = ArchiveConfig::from_params(&params).unwrap();
    assert_eq!(
        (c.seed, c.events, c.shelves, c.noise),
        (4, 10_000, 5_000, 0)
    );
    for bad in [
        json!({"shelves": 1}),
        json!({"events": 0}),
        json!({"drift": "x"}),
    ] {
        let error = ArchiveConfig::from_params(bad.as_object().unwrap()).unwrap_err();
        assert!(error.to_string().contains("warehouse-archive"), "{error}");
    }
}
