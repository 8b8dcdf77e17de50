//! A board's schema changed through the API (`POST /v1/boards/{id}:upgrade`), through the
//! router on a SQLite file and over a real socket on a SQLite file and on PostgreSQL: a dry run
//! writes nothing; a schema that drops a pointer a scoped key names is refused naming the key
//! and the pointer; a migration that breaks the schema is refused with pointers; applied, the
//! change is a write authored by the key and earlier versions keep their schema; a stale plan
//! is a 412; a scoped key, another tenant, a bad schema and an unknown method are refused.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Method;
use serde_json::{Value, json};
use skillstate_server::{hash_secret, new_key_secret};
use skillstate_store::NewKey;
use support::*;

#[tokio::test]
async fn board_upgrades_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    upgrades(&harness, &InProcess(harness.router())).await;
}

#[tokio::test]
async fn board_upgrades_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    upgrades(&harness, &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn board_upgrades_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    upgrades(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

fn schema(api_field: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {"type": "object", "properties": {"goal": {"type": "string"}}},
            api_field: {"type": "object", "properties": {"version": {"type": "integer"}}}
        },
        "additionalProperties": false
    })
}

async fn upgrades(harness: &Harness, api: &dyn Transport) {
    let (key, key_id) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let scoped = new_key_secret();
    let scoped_id = harness
        .store()
        .create_key(&NewKey {
            tenant: "acme".into(),
            label: "api service".into(),
            secret_hash: hash_secret(&scoped),
            scopes: Some(json!({"board": {"reads": ["/plan", "/api"], "writes": ["/api"]}})),
        })
        .await
        .unwrap()
        .id;
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "release", "schema": schema("api"),
                        "initial_state": {"plan": {"goal": "ship"}, "api": {"version": 1}}}),
            )
            .key(&key),
        )
        .await;
    let id = created.expect(201).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let upgrade = |body: Value, secret: &str| {
        Call::post(format!("/v1/boards/{id}:upgrade"), &body).key(secret)
    };
    let board = || Call::get(format!("/v1/boards/{id}")).key(&key);
    let before = api.send(board()).await.json();

    // Renaming /api to /service drops the pointer the scoped key writes: refused, naming it.
    let rename = json!({
        "schema": schema("service"),
        "migration": [{"op": "move", "from": "/api", "path": "/service"}],
        "apply": true
    });
    let refused = api.send(upgrade(rename.clone(), &key)).await.problem(422);
    let scope_errors: Vec<&Value> = refused["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "scope")
        .collect();
    // Its reads and its writes both name /api.
    assert_eq!(scope_errors.len(), 2, "{refused}");
    for (error, list) in scope_errors.iter().zip(["reads", "writes"]) {
        assert_eq!(error["pointer"], "/api");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&scoped_id) && message.contains(list),
            "{message}"
        );
    }
    // A migration that leaves what the new schema forbids: refused with its pointer.
    let breaking = json!({"schema": schema("api"), "migration": {"extra": 1}, "apply": true});
    let broken = api.send(upgrade(breaking, &key)).await.problem(422);
    assert!(broken["errors"].to_string().contains("extra"), "{broken}");
    assert_eq!(api.send(board()).await.json(), before);

    // A compatible change (a new optional field): dry run, then applied.
    let mut wider = schema("api");
    wider["properties"]["notes"] = json!({"type": "string"});
    let dry = api
        .send(upgrade(
            json!({"schema": wider, "migration": {"notes": "moved to v2"}}),
            &key,
        ))
        .await;
    let dry = dry.expect(200).json();
    assert_eq!(dry["outcome"], "planned");
    assert_eq!(dry["planned_at"], 0);
    assert!(dry["diff"].to_string().contains("/notes"), "{dry}");
    assert!(
        dry["members"].to_string().contains(&scoped_id),
        "the scoped key was checked: {dry}"
    );
    assert_eq!(api.send(board()).await.json(), before);
    let applied = api
        .send(upgrade(
            json!({"schema": wider, "migration": {"notes": "moved to v2"}, "planned_at": 0, "apply": true}),
            &key,
        ))
        .await;
    let applied = applied.expect(200).json();
    assert_eq!(
        (applied["outcome"].clone(), applied["version"].clone()),
        (json!("moved"), json!(1))
    );
    let now = api.send(board()).await.json();
    assert_eq!(now["version"], 1);
    assert_eq!(now["schema"], wider);
    let writes = api
        .send(Call::get(format!("/v1/boards/{id}/writes")).key(&key))
        .await
        .json();
    assert!(writes.to_string().contains(&key_id), "{writes}");
    let at_zero = api
        .send(Call::get(format!("/v1/boards/{id}/writes/0/state")).key(&key))
        .await;
    assert!(at_zero.expect(200).json().get("notes").is_none());
    // The same plan again is stale; the same schema again is nothing to do.
    api.send(upgrade(
        json!({"schema": schema("api"), "planned_at": 0, "apply": true}),
        &key,
    ))
    .await
    .problem(412);
    api.send(upgrade(json!({"schema": wider, "apply": true}), &key))
        .await
        .problem(409);

    // Who may not, and what is not a change.
    api.send(upgrade(json!({"schema": wider}), &scoped))
        .await
        .problem(403);
    api.send(upgrade(json!({"schema": wider}), &other))
        .await
        .problem(404);
    let bad = api
        .send(upgrade(
            json!({"schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}),
            &key,
        ))
        .await
        .problem(422);
    assert!(
        bad["errors"][0]["pointer"]
            .as_str()
            .unwrap()
            .starts_with("/schema"),
        "{bad}"
    );
    api.send(upgrade(json!({"schema": wider, "migration": 3}), &key))
        .await
        .problem(422);
    api.send(
        Call::new(Method::POST, format!("/v1/boards/{id}:frobnicate"))
            .key(&key)
            .json(&json!({})),
    )
    .await
    .problem(404);
}
