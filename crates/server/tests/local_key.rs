//! The local key of `skillstate view` (`AppState::with_local_key`): a key held by the server
//! process only, never stored, that sees every task, board and batch of the database — those
//! made outside the service (the CLI's, of no tenant) and every tenant's — and steers them, but
//! creates nothing. Through the router in-process and over a real socket, on a SQLite file.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};
use skillstate_server::{CreateTaskRequest, LOCAL_KEY_ID, ServicePolicy, TaskFactory, hash_secret};
use skillstate_store::NewBoard;
use support::*;

fn ids(page: &Value, list: &str) -> Vec<String> {
    page[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_local_key_sees_the_whole_database_and_creates_nothing() {
    let harness = Harness::with_config(
        Db::sqlite().await,
        skillstate_server::ServerConfig {
            events_poll: Duration::from_millis(20),
            ..Default::default()
        },
    );
    let store = harness.store();
    let local = skillstate_server::new_key_secret();
    let state = harness.state.clone().with_local_key(&local);
    let api = InProcess(skillstate_server::router(state.clone()));
    let (acme, _) = harness.key("acme").await;

    // A task as the CLI makes it (no tenant), run to its end; a task of tenant acme.
    let factory = EnvFactory {
        skills_dir: skills_dir(),
    };
    let request: CreateTaskRequest = serde_json::from_value(json!({
        "skill": "warehouse", "model": "oracle", "environment": {"seed": 4, "events": 3}
    }))
    .unwrap();
    let request = ServicePolicy::default().resolve(&request).unwrap();
    let (task, initial) = factory.prepare(&request).await.unwrap();
    let cli_task = store.create_task(task, &initial).await.unwrap().id;
    run_to_end(store.clone(), &cli_task).await;
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle"}),
            )
            .key(&acme),
        )
        .await;
    let acme_task = created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A board of no tenant with the CLI task attached.
    let board = store
        .create_board(NewBoard {
            name: "local-board".into(),
            schema: json!({"type": "object"}),
            initial_state: json!({"notes": {}}),
            tenant: None,
        })
        .await
        .unwrap();
    store.attach_task(&board.id, &cli_task).await.unwrap();

    // Listings: the local key sees both tasks; the tenant's key only its own.
    let listed = api.send(Call::get("/v1/tasks").key(&local)).await;
    let listed = ids(&listed.expect(200).json(), "tasks");
    assert!(
        listed.contains(&cli_task) && listed.contains(&acme_task),
        "{listed:?}"
    );
    let tenant_listed = api.send(Call::get("/v1/tasks").key(&acme)).await;
    assert_eq!(ids(&tenant_listed.json(), "tasks"), vec![acme_task.clone()]);

    // The CLI task, its journal, states and prompt: all readable with the local key only.
    let version = store.task(&cli_task).await.unwrap().version;
    assert!(version >= 3);
    for path in [
        format!("/v1/tasks/{cli_task}"),
        format!("/v1/tasks/{cli_task}/state"),
        format!("/v1/tasks/{cli_task}/steps"),
        format!("/v1/tasks/{cli_task}/steps/2"),
        format!("/v1/tasks/{cli_task}/steps/2/state"),
        format!("/v1/tasks/{cli_task}/steps/2/prompt"),
        format!("/v1/tasks/{cli_task}/messages"),
    ] {
        api.send(Call::get(&path).key(&local)).await.expect(200);
        api.send(Call::get(&path).key(&acme)).await.problem(404);
    }
    let shown = api
        .send(Call::get(format!("/v1/tasks/{cli_task}/state")).key(&local))
        .await
        .json();
    assert_eq!(shown, store.task(&cli_task).await.unwrap().state);
    // A tenant's task too.
    api.send(Call::get(format!("/v1/tasks/{acme_task}")).key(&local))
        .await
        .expect(200);

    // Boards: listed, read, written (as the local key), its writes journaled.
    let boards = api.send(Call::get("/v1/boards").key(&local)).await.json();
    assert_eq!(ids(&boards, "boards"), vec![board.id.clone()]);
    assert_eq!(boards["boards"][0]["members"], 1);
    let tenant_boards = api.send(Call::get("/v1/boards").key(&acme)).await.json();
    assert!(ids(&tenant_boards, "boards").is_empty());
    let got = api
        .send(Call::get(format!("/v1/boards/{}", board.id)).key(&local))
        .await
        .json();
    assert_eq!(got["members"], json!([cli_task]));
    api.send(Call::get(format!("/v1/boards/{}", board.id)).key(&acme))
        .await
        .problem(404);
    let written = api
        .send(
            Call::new(Method::PATCH, format!("/v1/boards/{}/state", board.id))
                .key(&local)
                .header("if-match", "\"0\"")
                .raw(
                    "application/merge-patch+json",
                    br#"{"notes": {"seen": true}}"#.to_vec(),
                ),
        )
        .await;
    written.expect(200);
    let writes = api
        .send(Call::get(format!("/v1/boards/{}/writes", board.id)).key(&local))
        .await
        .json();
    assert_eq!(
        writes["writes"][0]["author"],
        json!({"kind": "key", "key": LOCAL_KEY_ID})
    );

    // Steering: a message to the CLI task, authored by the local key.
    api.send(
        Call::post(
            format!("/v1/tasks/{cli_task}/messages"),
            &json!({"text": "looked at it"}),
        )
        .key(&local),
    )
    .await
    .expect(202);
    let inbox = api
        .send(Call::get(format!("/v1/tasks/{cli_task}/messages")).key(&local))
        .await
        .json();
    assert_eq!(inbox["messages"][0]["author"], LOCAL_KEY_ID);

    // Creating: refused by name, whatever the body.
    for path in ["/v1/tasks", "/v1/tasks:batch", "/v1/boards"] {
        let problem = api
            .send(Call::post(path, &json!({})).key(&local))
            .await
            .problem(403);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("skillstate view"),
            "{problem}"
        );
    }
    // Batches: a tenant's, listed and read with the local key too.
    let batch = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"name": "nightly", "tasks": [{"skill": "warehouse", "model": "oracle"}]}),
            )
            .key(&acme),
        )
        .await;
    let batch = batch.expect(201).json()["batch"]
        .as_str()
        .unwrap()
        .to_owned();
    let batches = api.send(Call::get("/v1/batches").key(&local)).await;
    assert_eq!(
        ids(&batches.expect(200).json(), "batches"),
        vec![batch.clone()]
    );
    let one = api
        .send(Call::get(format!("/v1/batches/{batch}")).key(&local))
        .await;
    assert_eq!(one.expect(200).json()["counts"]["total"], 1);
    let paged = api
        .send(Call::get(format!("/v1/batches?cursor={batch}")).key(&local))
        .await;
    assert!(ids(&paged.expect(200).json(), "batches").is_empty());

    // Nothing of it is stored: the store has acme's key only, and no key of that secret.
    let keys = store.list_keys(None).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].tenant, "acme");
    let tenant_batches = api.send(Call::get("/v1/batches").key(&acme)).await;
    assert_eq!(ids(&tenant_batches.json(), "batches").len(), 1);
    assert!(
        store
            .key_by_hash(&hash_secret(&local))
            .await
            .unwrap()
            .is_none()
    );
    // A server of the same database without it (another process, or this one restarted)
    // refuses it.
    let other = InProcess(harness.router());
    other
        .send(Call::get("/v1/tasks").key(&local))
        .await
        .problem(401);

    // Over a socket: the tenant-wide stream of the local key carries the CLI task's events.
    let socket = Socket::start(state).await;
    let client = reqwest::Client::new();
    let mut response = client
        .get(format!("{}/v1/events", socket.base))
        .header("authorization", format!("Bearer {local}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(text.contains(&cli_task) && text.contains(&acme_task)) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .unwrap_or_else(|_| panic!("both tasks' events within the wait: {text}"))
            .unwrap()
            .expect("the stream is open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(response);
    let tasks = socket.send(Call::get("/v1/tasks").key(&local)).await;
    assert!(ids(&tasks.json(), "tasks").contains(&cli_task));
    socket.stop().await;
}
