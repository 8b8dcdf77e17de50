//! A board's history after its schema changed, through the API on a SQLite file and on
//! PostgreSQL: a value an earlier schema marked write-only stays hidden in the states of earlier
//! versions and the journal's patches (the event stream shows writes through the same
//! `BoardHistory`), although the schema now in effect no longer names it.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Method;
use serde_json::{Value, json};
use skillstate_core::StateSchema;
use skillstate_runtime::board_upgrade::{BoardUpgrade, upgrade_board};
use skillstate_store::BoardAuthor;
use support::*;

const TOKEN: &str = "tok-5b1e9c7d2a4f8e36";

#[tokio::test]
async fn history_hides_what_any_schema_hid_on_a_sqlite_file() {
    history(Harness::new(Db::sqlite().await).await).await;
}

#[tokio::test]
async fn history_hides_what_any_schema_hid_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    history_on(&harness).await;
    harness.db.destroy().await;
}

async fn history(harness: Harness) {
    history_on(&harness).await;
}

async fn history_on(harness: &Harness) {
    let api = InProcess(harness.router());
    let (key, _) = harness.key("acme").await;
    let schema = json!({
        "type": "object",
        "properties": {
            "token": {"type": "string", "writeOnly": true},
            "note": {"type": "string"}
        },
        "additionalProperties": false
    });
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "vault", "schema": schema, "initial_state": {"note": "start"}}),
            )
            .key(&key),
        )
        .await;
    let id = created.expect(201).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let write = Call::new(Method::PATCH, format!("/v1/boards/{id}/state"))
        .key(&key)
        .raw(
            "application/merge-patch+json",
            serde_json::to_vec(&json!({"token": TOKEN})).unwrap(),
        )
        .header("if-match", "\"0\"");
    api.send(write).await.expect(200);

    // The new schema drops the token (a migration removes it): nothing of it is write-only now.
    let next = StateSchema::compile(json!({
        "type": "object",
        "properties": {"note": {"type": "string"}},
        "additionalProperties": false
    }))
    .unwrap();
    let migration = json!([{"op": "remove", "path": "/token"}]);
    let store = harness.store();
    let upgraded = upgrade_board(
        store.as_ref(),
        &BoardUpgrade {
            board: &id,
            tenant: Some("acme"),
            schema: &next,
            migration: Some(&migration),
            author: BoardAuthor::Cli,
            planned_at: None,
            apply: true,
        },
    )
    .await
    .unwrap();
    assert!(!upgraded.diff.to_string().contains(TOKEN));

    let reads = [
        format!("/v1/boards/{id}/writes/1/state"),
        format!("/v1/boards/{id}/writes"),
    ];
    for path in &reads {
        let reply = api.send(Call::get(path.as_str()).key(&key)).await;
        reply.expect(200);
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(!body.contains(TOKEN), "{path}: {body}");
        assert!(body.contains("[redacted]"), "{path}: {body}");
    }
    let state_at_1: Value = api
        .send(Call::get(format!("/v1/boards/{id}/writes/1/state")).key(&key))
        .await
        .json();
    assert_eq!(state_at_1["token"], "[redacted]");
}
