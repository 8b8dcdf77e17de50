//! A message to a finished task: it is stored and reopens the task, but a task whose episode is
//! over finishes again at once, without the step the message was stored for. The messages
//! listing then says so (`delivery: unshown`, the step the task finished at) and never that it
//! was delivered at a step that does not exist. A message a task took is `shown` at its step.
//! Through the router in-process and over a real socket, on a SQLite file.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

async fn messages(api: &dyn Transport, key: &str, id: &str) -> Vec<Value> {
    let reply = api
        .send(Call::get(format!("/v1/tasks/{id}/messages")).key(key))
        .await;
    reply.expect(200).json()["messages"]
        .as_array()
        .unwrap()
        .clone()
}

async fn task(api: &dyn Transport, key: &str, id: &str) -> Value {
    api.send(Call::get(format!("/v1/tasks/{id}")).key(key))
        .await
        .expect(200)
        .json()
}

async fn send(api: &dyn Transport, key: &str, id: &str, text: &str) -> Value {
    api.send(Call::post(format!("/v1/tasks/{id}/messages"), &json!({"text": text})).key(key))
        .await
        .expect(202)
        .json()
}

async fn a_message_to_a_finished_task_is_never_said_delivered_at_a_step_it_lacks(
    harness: &Harness,
    api: &dyn Transport,
) {
    let (key, _) = harness.key("acme").await;
    let id = create_oracle_task(api, &key, 2).await;

    // A message the task takes: shown at step 1.
    send(api, &key, &id, "Shelf 7 is blocked today").await;
    run_to_end(harness.store(), &id).await;
    let finished = task(api, &key, &id).await;
    assert_eq!(finished["status"], "completed", "{finished}");
    let last = finished["version"].as_u64().unwrap();
    assert!(last >= 1);
    let listed = messages(api, &key, &id).await;
    assert_eq!(listed[0]["delivered_step"], 1);
    assert_eq!(listed[0]["delivery"], "shown");
    assert_eq!(listed[0]["summary"], "delivered at step 1");
    assert_eq!(listed[0]["finished_at_step"], Value::Null);

    // A message to the finished task: stored, waiting, and the answer says the task finished.
    let posted = send(api, &key, &id, "One more thing").await;
    assert_eq!(posted["delivery"], "waiting");
    assert_eq!(posted["delivered_step"], Value::Null);
    assert_eq!(posted["finished_at_step"], last);
    let summary = posted["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("the task finished at step {last}")),
        "{summary}"
    );

    // A worker reopens it; the episode is over, so it finishes again without a new step.
    run_to_end(harness.store(), &id).await;
    let again = task(api, &key, &id).await;
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(
        again["version"].as_u64().unwrap(),
        last,
        "the premise: no step {} was taken",
        last + 1
    );
    let listed = messages(api, &key, &id).await;
    let late = &listed[1];
    assert_eq!(late["delivered_step"], last + 1, "{late}");
    assert_eq!(late["delivery"], "unshown", "{late}");
    assert_eq!(late["finished_at_step"], last, "{late}");
    let summary = late["summary"].as_str().unwrap();
    assert_eq!(
        summary,
        format!(
            "stored for step {}, but the task finished at step {last} without taking that step; no model saw it",
            last + 1
        )
    );
    assert!(!summary.contains("delivered at"), "{summary}");
    // The first message is still shown where it was.
    assert_eq!(listed[0]["delivery"], "shown");
}

#[tokio::test]
async fn through_the_router() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    a_message_to_a_finished_task_is_never_said_delivered_at_a_step_it_lacks(&harness, &api).await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn over_a_socket() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    a_message_to_a_finished_task_is_never_said_delivered_at_a_step_it_lacks(&harness, &socket)
        .await;
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn the_document_describes_delivery() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let doc = api
        .send(Call::get("/openapi.json"))
        .await
        .expect(200)
        .json();
    let view = &doc["components"]["schemas"]["MessageView"];
    for field in ["delivery", "finished_at_step", "summary"] {
        assert!(view["properties"][field].is_object(), "{field}: {view}");
    }
    let delivery = &doc["components"]["schemas"]["DeliveryName"];
    let names: Vec<&str> = delivery["enum"]
        .as_array()
        .or_else(|| delivery["oneOf"].as_array())
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str().or_else(|| v["enum"][0].as_str()))
        .collect();
    assert_eq!(
        names,
        ["waiting", "shown", "next_step", "unshown"],
        "{delivery}"
    );
    harness.db.destroy().await;
}
