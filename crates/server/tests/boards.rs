//! Boards through the service: create, list, get, state with ETag / If-Match, writes rebased
//! under the concurrent-write rule or refused with 412 and the fresh values, the board's schema
//! and read-only fields enforced (422 with pointers), the journal of writes and time travel,
//! tenant isolation, and keys limited to board pointers (projection of their reads, writes
//! outside their writes refused with the pointer, every other route 403). Through the router
//! in-process and over a real socket on 127.0.0.1, on a SQLite file and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::Method;
use serde_json::{Value, json};
use skillstate_server::{hash_secret, new_key_secret};
use skillstate_store::NewKey;
use support::*;

#[tokio::test]
async fn boards_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let transport = InProcess(harness.router());
    boards(&harness, &transport).await;
}

#[tokio::test]
async fn boards_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    boards(&harness, &socket).await;
    racing_clients(&harness, &socket.base).await;
    socket.stop().await;
}

#[tokio::test]
async fn boards_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    boards(&harness, &socket).await;
    racing_clients(&harness, &socket.base).await;
    socket.stop().await;
    harness.db.destroy().await;
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {"type": "object", "properties": {"goal": {"type": "string"}}},
            "api": {"type": "object", "properties": {"version": {"type": "integer"}}},
            "frontend": {"type": "object"},
            "owner": {"type": "string", "readOnly": true}
        }
    })
}

fn patch(path: &str, key: &str, if_match: Option<&str>, body: &Value) -> Call {
    let call = Call::new(Method::PATCH, path).key(key).raw(
        "application/merge-patch+json",
        serde_json::to_vec(body).unwrap(),
    );
    match if_match {
        Some(tag) => call.header("if-match", tag),
        None => call,
    }
}

/// A key of `tenant` limited to `reads` and `writes` of boards.
async fn scoped_key(harness: &Harness, tenant: &str, reads: &[&str], writes: &[&str]) -> String {
    let secret = new_key_secret();
    harness
        .store()
        .create_key(&NewKey {
            tenant: tenant.into(),
            label: "scoped".into(),
            secret_hash: hash_secret(&secret),
            scopes: Some(json!({"board": {"reads": reads, "writes": writes}})),
        })
        .await
        .unwrap();
    secret
}

async fn boards(harness: &Harness, api: &dyn Transport) {
    let (acme, acme_key_id) = harness.key("acme").await;
    let (globex, _) = harness.key("globex").await;
    let initial =
        json!({"plan": {"goal": "ship"}, "api": {"version": 1}, "frontend": {}, "owner": "ops"});

    // Create: 201, Location, ETag "0".
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "release-42", "schema": schema(), "initial_state": initial}),
            )
            .key(&acme),
        )
        .await;
    created.expect(201);
    let board = created.json();
    let id = board["id"].as_str().unwrap().to_owned();
    assert_eq!(
        created.header("location"),
        Some(format!("/v1/boards/{id}").as_str())
    );
    assert_eq!(created.header("etag"), Some("\"0\""));
    assert_eq!(
        (board["name"].as_str(), board["version"].as_u64()),
        (Some("release-42"), Some(0))
    );
    let base = format!("/v1/boards/{id}");
    let state = format!("{base}/state");

    // Refused creates, each problem with its pointer.
    let again = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "release-42", "schema": schema()}),
            )
            .key(&acme),
        )
        .await;
    assert!(
        again.problem(409)["detail"]
            .as_str()
            .unwrap()
            .contains("release-42")
    );
    let bad = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "no spaces", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}),
            )
            .key(&acme),
        )
        .await
        .problem(422);
    let pointers: Vec<&str> = bad["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert!(pointers.contains(&"/name"), "{bad}");
    assert!(pointers.iter().any(|p| p.starts_with("/schema")), "{bad}");
    let invalid_state = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "other", "schema": schema(), "initial_state": {"api": {"version": "one"}}}),
            )
            .key(&acme),
        )
        .await
        .problem(422);
    assert_eq!(
        invalid_state["errors"][0]["pointer"],
        "/initial_state/api/version"
    );

    // The same name is free for another tenant; each lists only its own.
    api.send(
        Call::post(
            "/v1/boards",
            &json!({"name": "release-42", "schema": schema()}),
        )
        .key(&globex),
    )
    .await
    .expect(201);
    let listed = api.send(Call::get("/v1/boards").key(&acme)).await;
    listed.expect(200);
    let listed = listed.json();
    assert_eq!(listed["boards"].as_array().unwrap().len(), 1);
    assert_eq!(listed["boards"][0]["id"], id.as_str());

    // Tenant isolation: another tenant's board is the same 404 as a missing one.
    for call in [
        Call::get(&base),
        Call::get(&state),
        Call::get(format!("{base}/writes")),
        Call::get(format!("{base}/writes/0/state")),
        patch(
            &state,
            &globex,
            Some("\"0\""),
            &json!({"api": {"version": 2}}),
        ),
    ] {
        let call = if call.headers.iter().any(|(n, _)| n == "authorization") {
            call
        } else {
            call.key(&globex)
        };
        api.send(call).await.problem(404);
    }
    api.send(Call::get("/v1/boards/not-an-id").key(&acme))
        .await
        .problem(404);

    // Reads: the board, its state with ETag, 304 while unchanged.
    let got = api.send(Call::get(&base).key(&acme)).await;
    got.expect(200);
    assert_eq!(got.json()["schema"], schema());
    let read = api.send(Call::get(&state).key(&acme)).await;
    read.expect(200);
    assert_eq!(read.json(), initial);
    assert_eq!(read.header("etag"), Some("\"0\""));
    api.send(
        Call::get(&state)
            .key(&acme)
            .header("if-none-match", "\"0\""),
    )
    .await
    .expect(304);

    // Writes: If-Match required, current version committed.
    api.send(patch(
        &state,
        &acme,
        None,
        &json!({"plan": {"goal": "ship it"}}),
    ))
    .await
    .problem(428);
    let one = api
        .send(patch(
            &state,
            &acme,
            Some("\"0\""),
            &json!({"plan": {"goal": "ship it"}}),
        ))
        .await;
    one.expect(200);
    assert_eq!(one.header("etag"), Some("\"1\""));
    assert_eq!(one.json()["plan"]["goal"], "ship it");

    // A write computed on version 0 that touches nothing changed since is rebased.
    let two = api
        .send(patch(
            &state,
            &acme,
            Some("\"0\""),
            &json!({"api": {"version": 2}}),
        ))
        .await;
    two.expect(200);
    assert_eq!(two.header("etag"), Some("\"2\""));
    assert_eq!(two.json()["plan"]["goal"], "ship it");
    assert_eq!(two.json()["api"]["version"], 2);

    // One that touches what changed since is refused with the fresh value; nothing is lost.
    let conflict = api
        .send(patch(
            &state,
            &acme,
            Some("\"0\""),
            &json!({"plan": {"goal": "overwrite"}}),
        ))
        .await
        .problem(412);
    assert_eq!(conflict["errors"][0]["pointer"], "/plan/goal");
    assert_eq!(conflict["errors"][0]["kind"], "conflict");
    assert!(
        conflict["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("ship it"),
        "{conflict}"
    );
    api.send(patch(
        &state,
        &acme,
        Some("\"9\""),
        &json!({"api": {"version": 3}}),
    ))
    .await
    .problem(412);

    // The board's rules: its schema and its read-only fields, 422 with pointers.
    let wrong_type = api
        .send(patch(
            &state,
            &acme,
            Some("\"2\""),
            &json!({"api": {"version": "three"}}),
        ))
        .await
        .problem(422);
    assert_eq!(wrong_type["errors"][0]["pointer"], "/api/version");
    let read_only = api
        .send(patch(&state, &acme, Some("\"2\""), &json!({"owner": "me"})))
        .await
        .problem(422);
    assert_eq!(read_only["errors"][0]["kind"], "read_only");
    assert_eq!(read_only["errors"][0]["pointer"], "/owner");
    let json_patch = api
        .send(
            Call::new(Method::PATCH, &state)
                .key(&acme)
                .header("if-match", "\"2\"")
                .raw(
                    "application/json-patch+json",
                    serde_json::to_vec(
                        &json!([{"op": "add", "path": "/frontend/page", "value": "home"}]),
                    )
                    .unwrap(),
                ),
        )
        .await;
    json_patch.expect(200);
    assert_eq!(json_patch.header("etag"), Some("\"3\""));

    // The journal: authors, rebases, pages.
    let writes = api
        .send(Call::get(format!("{base}/writes")).key(&acme))
        .await;
    writes.expect(200);
    let writes = writes.json();
    let list = writes["writes"].as_array().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(
        list[0]["author"],
        json!({"kind": "key", "key": acme_key_id})
    );
    assert_eq!(list[0]["rebased_from"], Value::Null);
    assert_eq!(list[1]["rebased_from"], 0);
    assert_eq!(list[1]["patch"], json!({"api": {"version": 2}}));
    assert!(list[2]["state_hash"].is_string());
    assert_eq!(writes["next_after"], Value::Null);
    let page = api
        .send(Call::get(format!("{base}/writes?limit=2")).key(&acme))
        .await
        .json();
    assert_eq!(page["writes"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after"], 2);
    let rest = api
        .send(Call::get(format!("{base}/writes?after=2")).key(&acme))
        .await
        .json();
    assert_eq!(rest["writes"][0]["version"], 3);
    api.send(Call::get(format!("{base}/writes?limit=0")).key(&acme))
        .await
        .problem(400);

    // Time travel.
    let at0 = api
        .send(Call::get(format!("{base}/writes/0/state")).key(&acme))
        .await;
    at0.expect(200);
    assert_eq!(at0.json(), initial);
    let at1 = api
        .send(Call::get(format!("{base}/writes/1/state")).key(&acme))
        .await
        .json();
    assert_eq!(
        (at1["plan"]["goal"].as_str(), at1["api"]["version"].as_u64()),
        (Some("ship it"), Some(1))
    );
    api.send(Call::get(format!("{base}/writes/4/state")).key(&acme))
        .await
        .problem(404);
    api.send(Call::get(format!("{base}/writes/x/state")).key(&acme))
        .await
        .problem(400);

    // A key limited to /plan and /api, writing /api.
    let scoped = scoped_key(harness, "acme", &["/plan", "/api"], &["/api"]).await;
    let seen = api.send(Call::get(&state).key(&scoped)).await;
    seen.expect(200);
    assert_eq!(
        seen.json(),
        json!({"plan": {"goal": "ship it"}, "api": {"version": 2}})
    );
    assert_eq!(seen.header("etag"), Some("\"3\""));
    let outside = api
        .send(patch(
            &state,
            &scoped,
            Some("\"3\""),
            &json!({"frontend": {"page": "about"}}),
        ))
        .await
        .problem(422);
    assert_eq!(outside["errors"][0]["pointer"], "/frontend");
    assert_eq!(outside["errors"][0]["kind"], "outside_write_scope");
    let inside = api
        .send(patch(
            &state,
            &scoped,
            Some("\"3\""),
            &json!({"api": {"version": 4}}),
        ))
        .await;
    inside.expect(200);
    assert_eq!(
        inside.json(),
        json!({"plan": {"goal": "ship it"}, "api": {"version": 4}})
    );
    let past = api
        .send(Call::get(format!("{base}/writes/0/state")).key(&scoped))
        .await
        .json();
    assert_eq!(
        past,
        json!({"plan": {"goal": "ship"}, "api": {"version": 1}})
    );
    assert_eq!(
        api.send(Call::get("/v1/boards").key(&scoped)).await.json()["boards"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    for call in [
        Call::get("/v1/tasks"),
        Call::get(format!("{base}/writes")),
        Call::post("/v1/boards", &json!({"name": "mine", "schema": schema()})),
    ] {
        api.send(call.key(&scoped)).await.problem(403);
    }
    // The unscoped key sees everything, the scoped write included.
    let full = api.send(Call::get(&state).key(&acme)).await.json();
    assert_eq!(full["frontend"], json!({"page": "home"}));
    assert_eq!(full["api"]["version"], 4);
}

/// Clients racing on one board over HTTP: each computes its patch on the version it read.
/// Disjoint writers all land (rebased when others wrote first); writers of one counter are
/// refused with 412 when it moved, and retry from the fresh value — no increment is lost.
async fn racing_clients(harness: &Harness, base: &str) {
    let api = Remote::to(base);
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 4;
    let (key, _) = harness.key("race").await;
    let created = api
        .send(Call::post(
            "/v1/boards",
            &json!({"name": "race", "schema": {"type": "object"}, "initial_state": {"agents": {}, "counter": 0}}),
        ).key(&key))
        .await;
    created.expect(201);
    let state = format!(
        "/v1/boards/{}/state",
        created.json()["id"].as_str().unwrap()
    );
    let mut clients = Vec::new();
    for me in 0..CLIENTS {
        let (api, key, state) = (Remote::to(base), key.clone(), state.clone());
        clients.push(tokio::spawn(async move {
            let mut refused = 0;
            for round in 0..ROUNDS {
                for shared in [false, true] {
                    loop {
                        let read = api.send(Call::get(&state).key(&key)).await;
                        let tag = read.header("etag").unwrap().to_owned();
                        let body = if shared {
                            json!({"counter": read.json()["counter"].as_u64().unwrap() + 1})
                        } else {
                            json!({"agents": {(me.to_string()): round}})
                        };
                        let wrote = api.send(patch(&state, &key, Some(&tag), &body)).await;
                        match wrote.status.as_u16() {
                            200 => break,
                            412 if shared => refused += 1,
                            other => panic!(
                                "write answered {other}: {}",
                                String::from_utf8_lossy(&wrote.body)
                            ),
                        }
                    }
                }
            }
            refused
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    let end = api.send(Call::get(&state).key(&key)).await;
    assert_eq!(
        end.header("etag"),
        Some(format!("\"{}\"", 2 * CLIENTS as u64 * ROUNDS).as_str())
    );
    let end = end.json();
    assert_eq!(end["counter"], CLIENTS as u64 * ROUNDS);
    for me in 0..CLIENTS {
        assert_eq!(end["agents"][me.to_string()], ROUNDS - 1);
    }
}

/// A client of its own to a server on a socket, one per racing writer.
struct Remote {
    base: String,
    client: reqwest::Client,
}

impl Remote {
    fn to(base: &str) -> Self {
        Self {
            base: base.to_owned(),
            client: reqwest::Client::new(),
        }
    }
}

#[async_trait::async_trait]
impl Transport for Remote {
    async fn send(&self, call: Call) -> Reply {
        let mut request = self
            .client
            .request(call.method, format!("{}{}", self.base, call.path));
        for (name, value) in &call.headers {
            request = request.header(name, value);
        }
        if let Some(body) = call.body {
            request = request.body(body);
        }
        let response = request.send().await.unwrap();
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }
}

#[tokio::test]
async fn the_openapi_document_describes_the_board_routes() {
    let harness = Harness::new(Db::sqlite().await).await;
    let doc = InProcess(harness.router())
        .send(Call::get("/openapi.json"))
        .await
        .json();
    for (path, method) in [
        ("/v1/boards", "post"),
        ("/v1/boards", "get"),
        ("/v1/boards/{id}", "get"),
        ("/v1/boards/{id}/state", "get"),
        ("/v1/boards/{id}/state", "patch"),
        ("/v1/boards/{id}/writes", "get"),
        ("/v1/boards/{id}/writes/{version}/state", "get"),
    ] {
        let operation = &doc["paths"][path][method];
        assert!(operation["operationId"].is_string(), "{method} {path}");
        assert!(operation["responses"]["401"].is_object(), "{method} {path}");
    }
    assert!(doc["paths"]["/v1/boards/{id}/state"]["patch"]["responses"]["428"].is_object());
    assert!(doc["components"]["schemas"]["BoardWritePage"].is_object());
}
