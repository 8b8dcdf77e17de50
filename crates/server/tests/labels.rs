//! A task's labels in every task response: create (one and batch, replayed too), get, list
//! (filtered or not) and cancel answer the labels given at create, `{}` for none; the OpenAPI
//! document says they are an object of strings. Through the router in-process and over a real
//! socket on 127.0.0.1, on a SQLite file and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Method;
use serde_json::{Value, json};
use support::*;

#[tokio::test]
async fn labels_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let transport = InProcess(harness.router());
    labels(&harness, &transport).await;
}

#[tokio::test]
async fn labels_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    labels(&harness, &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn labels_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    labels(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

fn warehouse(labels: Option<Value>) -> Value {
    let mut body =
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": 2}});
    if let Some(labels) = labels {
        body["labels"] = labels;
    }
    body
}

async fn labels(harness: &Harness, api: &dyn Transport) {
    let (key, _) = harness.key("acme").await;
    let ops = json!({"team": "ops", "ticket": "T-7", "empty": ""});

    // Create: the labels given, also when the create is replayed with its Idempotency-Key
    // (the first request's labels, whatever the retry says).
    let created = api
        .send(
            Call::post("/v1/tasks", &warehouse(Some(ops.clone())))
                .key(&key)
                .header("idempotency-key", "labelled"),
        )
        .await;
    let task = created.expect(201).json()["task"].clone();
    assert_eq!(task["labels"], ops);
    let id = task["id"].as_str().unwrap().to_owned();
    let replay = api
        .send(
            Call::post("/v1/tasks", &warehouse(Some(json!({"team": "dev"}))))
                .key(&key)
                .header("idempotency-key", "labelled"),
        )
        .await;
    assert_eq!(replay.expect(200).json()["task"]["labels"], ops);
    let plain = api
        .send(Call::post("/v1/tasks", &warehouse(None)).key(&key))
        .await;
    let plain = plain.expect(201).json()["task"].clone();
    assert_eq!(plain["labels"], json!({}));

    // A batch: each task its own.
    let batch = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"tasks": [warehouse(Some(json!({"team": "dev"}))), warehouse(None)]}),
            )
            .key(&key),
        )
        .await;
    let batch = batch.expect(201).json();
    assert_eq!(batch["tasks"][0]["task"]["labels"], json!({"team": "dev"}));
    assert_eq!(batch["tasks"][1]["task"]["labels"], json!({}));
    let dev = batch["tasks"][0]["task"]["id"].as_str().unwrap().to_owned();

    // Get.
    let got = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    assert_eq!(got.expect(200).json()["labels"], ops);
    let got = api
        .send(Call::get(format!("/v1/tasks/{}", plain["id"].as_str().unwrap())).key(&key))
        .await;
    assert_eq!(got.expect(200).json()["labels"], json!({}));

    // List: every item with its labels, filtered or not, across pages.
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/v1/tasks?limit=3".to_owned(),
            Some(cursor) => format!("/v1/tasks?limit=3&cursor={cursor}"),
        };
        let page = api.send(Call::get(path).key(&key)).await.expect(200).json();
        listed.extend(page["tasks"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(listed.len(), 4);
    let labels_of = |id: &str| {
        listed
            .iter()
            .find(|t| t["id"] == id)
            .map(|t| t["labels"].clone())
            .unwrap_or_else(|| panic!("{id} is not listed"))
    };
    assert_eq!(labels_of(&id), ops);
    assert_eq!(labels_of(&dev), json!({"team": "dev"}));
    assert_eq!(labels_of(plain["id"].as_str().unwrap()), json!({}));
    let filtered = api
        .send(Call::get("/v1/tasks?label=ticket:T-7").key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(filtered["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(filtered["tasks"][0]["id"], id.as_str());
    assert_eq!(filtered["tasks"][0]["labels"], ops);

    // Cancel answers the task with its labels too.
    let cancelled = api
        .send(Call::new(Method::POST, format!("/v1/tasks/{id}/cancel")).key(&key))
        .await;
    let cancelled = cancelled.expect(200).json();
    assert_eq!(cancelled["outcome"]["reason"], "canceled");
    assert_eq!(cancelled["labels"], ops);
}

#[tokio::test]
async fn the_openapi_document_says_labels_are_an_object_of_strings() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let doc = api
        .send(Call::get("/openapi.json"))
        .await
        .expect(200)
        .json();
    for schema in ["TaskView", "TaskListItem"] {
        let schema = &doc["components"]["schemas"][schema];
        let labels = &schema["properties"]["labels"];
        assert_eq!(labels["type"], "object", "{schema}");
        assert_eq!(labels["additionalProperties"]["type"], "string", "{schema}");
        assert!(
            schema["required"]
                .as_array()
                .unwrap()
                .contains(&json!("labels")),
            "{schema}"
        );
    }
}
