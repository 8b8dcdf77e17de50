//! Where a state value came from over HTTP (`GET /v1/tasks/{id}/state/provenance`): a real
//! warehouse run (the oracle) on a SQLite file, then a state write through the API; asked
//! through the router in-process and over a real socket on 127.0.0.1.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Method;
use serde_json::{Value, json};
use support::*;

async fn get(api: &dyn Transport, key: &str, path: &str) -> Value {
    api.send(Call::get(path).key(key)).await.expect(200).json()
}

async fn provenance_of_a_run_and_an_api_write(harness: &Harness, api: &dyn Transport) {
    let (key, key_id) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let id = create_oracle_task(api, &key, 6).await;
    run_to_end(harness.store(), &id).await;
    let version = get(api, &key, &format!("/v1/tasks/{id}")).await["version"]
        .as_u64()
        .unwrap();

    // The newest value the model wrote: its step, patch and observation, by the model.
    // A value the model wrote that is still there, and the newest write at it the search finds.
    let state = get(api, &key, &format!("/v1/tasks/{id}/state")).await;
    let shelf = state["inventory"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap_or_else(|| panic!("the run left no shelf filled: {state}"))
        .clone();
    let writes = get(
        api,
        &key,
        &format!("/v1/tasks/{id}/journal?pointer=/inventory/{shelf}&limit=1"),
    )
    .await;
    let newest = writes["hits"][0].clone();
    assert_eq!(newest["pointer"], format!("/inventory/{shelf}"), "{writes}");
    let (pointer, step) = (
        newest["pointer"].as_str().unwrap().to_owned(),
        newest["step"].as_u64().unwrap(),
    );
    let found = get(
        api,
        &key,
        &format!("/v1/tasks/{id}/state/provenance?pointer={pointer}"),
    )
    .await;
    let detail = get(api, &key, &format!("/v1/tasks/{id}/steps/{step}")).await;
    assert_eq!(found["pointer"], pointer);
    assert_eq!(&found["current"], state.pointer(&pointer).unwrap());
    let write = &found["writes"][0];
    assert_eq!(write["step"], step, "{found}");
    assert_eq!(write["value"], found["current"]);
    assert_eq!(write["author"], json!({"kind": "model", "model": "oracle"}));
    assert_eq!(write["patch"], detail["accepted"]["patch"]);
    assert_eq!(write["observation"], detail["observation"]);
    assert!(write["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(found["kept_from"], 1);
    assert_eq!(found["older_writes"], 0);

    // A write through the API names its key.
    let written = api
        .send(
            Call::new(Method::PATCH, format!("/v1/tasks/{id}/state"))
                .key(&key)
                .header("if-match", &format!("\"{version}\""))
                .raw(
                    "application/merge-patch+json",
                    serde_json::to_vec(&json!({"inventory": {"shelf_499": "item_777"}})).unwrap(),
                ),
        )
        .await;
    written.expect(200);
    let found = get(
        api,
        &key,
        &format!("/v1/tasks/{id}/state/provenance?pointer=/inventory/shelf_499"),
    )
    .await;
    assert_eq!(found["current"], "item_777");
    let writes = found["writes"].as_array().unwrap();
    assert_eq!(writes.len(), 1, "{found}");
    assert_eq!(writes[0]["step"], version + 1);
    assert_eq!(writes[0]["value"], "item_777");
    assert_eq!(
        writes[0]["author"],
        json!({"kind": "api_key", "key": key_id})
    );
    assert_eq!(
        writes[0]["patch"],
        json!({"inventory": {"shelf_499": "item_777"}})
    );

    // Every write below /inventory, newest first: the API's, then the model's.
    let every = get(
        api,
        &key,
        &format!("/v1/tasks/{id}/state/provenance?pointer=/inventory&all=true"),
    )
    .await;
    let steps: Vec<u64> = every["writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps[0], version + 1, "{steps:?}");
    assert!(steps.contains(&step), "{steps:?} lacks {step}");
    assert!(steps.windows(2).all(|w| w[0] > w[1]), "{steps:?}");
    // Nothing at a location: no value, no write.
    let nothing = get(
        api,
        &key,
        &format!("/v1/tasks/{id}/state/provenance?pointer=/inventory/shelf_0/x"),
    )
    .await;
    assert_eq!(nothing["current"], Value::Null);

    // Bad parameters are 422s naming them; another tenant's task is a 404.
    for (query, parameter) in [
        ("", "/pointer"),
        ("pointer=inventory", "/pointer"),
        ("pointer=/inventory/~2", "/pointer"),
        ("pointer=/inventory&all=maybe", "/all"),
        ("pointer=/inventory&since=3", "/since"),
    ] {
        let refused = api
            .send(Call::get(format!("/v1/tasks/{id}/state/provenance?{query}")).key(&key))
            .await;
        assert_eq!(
            refused.problem(422)["errors"][0]["pointer"],
            parameter,
            "{query}"
        );
    }
    api.send(
        Call::get(format!(
            "/v1/tasks/{id}/state/provenance?pointer=/inventory"
        ))
        .key(&other),
    )
    .await
    .problem(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provenance_through_the_router_and_a_socket() {
    let harness = Harness::new(Db::sqlite().await).await;
    provenance_of_a_run_and_an_api_write(&harness, &InProcess(harness.router())).await;
    let api = Socket::start(harness.state.clone()).await;
    provenance_of_a_run_and_an_api_write(&harness, &api).await;
    // The document lists both routes.
    let document = api.send(Call::get("/openapi.json")).await.json();
    for (path, operation) in [
        ("/v1/tasks/{id}/journal", "searchJournal"),
        ("/v1/tasks/{id}/state/provenance", "getStateProvenance"),
    ] {
        assert_eq!(
            document["paths"][path]["get"]["operationId"], operation,
            "{path}"
        );
    }
    api.stop().await;
    harness.db.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provenance_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let api = Socket::start(harness.state.clone()).await;
    provenance_of_a_run_and_an_api_write(&harness, &api).await;
    api.stop().await;
    harness.db.destroy().await;
}
