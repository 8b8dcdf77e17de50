//! Tasks moved to the server's version of their skill through the API: one task
//! (`POST /v1/tasks/{id}:upgrade`) and a tenant's tasks a page at a time
//! (`POST /v1/tasks:upgrade`), through the router in-process on a SQLite file and over a real
//! socket on a SQLite file and on PostgreSQL. The skills directory is a copy of the shipped
//! warehouse skill that the test rewrites version by version, as an operator deploys one.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_server::ServicePolicy;
use skillstate_store::LeaseClaim;
use support::*;

#[tokio::test]
async fn upgrades_in_process_on_a_sqlite_file() {
    let skills = tempfile::tempdir().unwrap();
    let harness = harness(Db::sqlite().await, skills.path());
    upgrades(&harness, skills.path(), &InProcess(harness.router())).await;
}

#[tokio::test]
async fn upgrades_over_a_socket_on_a_sqlite_file() {
    let skills = tempfile::tempdir().unwrap();
    let harness = harness(Db::sqlite().await, skills.path());
    let socket = Socket::start(harness.state.clone()).await;
    upgrades(&harness, skills.path(), &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn upgrades_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let skills = tempfile::tempdir().unwrap();
    let harness = harness(db, skills.path());
    let socket = Socket::start(harness.state.clone()).await;
    upgrades(&harness, skills.path(), &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

fn harness(db: Db, skills: &Path) -> Harness {
    deploy_warehouse(skills, "1.0.0", "inventory", None);
    let mut harness = Harness::with_factory(
        db,
        Arc::new(EnvFactory {
            skills_dir: skills.to_owned(),
        }),
    );
    // As `skillstate serve` does: the skills directory is the policy's.
    let policy = ServicePolicy::default().with_skills_dir(skills.canonicalize().unwrap());
    harness.state = harness.state.clone().with_policy(policy);
    harness
}

async fn create(api: &dyn Transport, key: &str, seed: u64) -> String {
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": seed, "events": 3}}),
            )
            .key(key),
        )
        .await;
    created.expect(201);
    created.json()["task"]["id"].as_str().unwrap().to_owned()
}

fn versions(task: &Value) -> Vec<(u64, String)> {
    task["skill_versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["from_step"].as_u64().unwrap(),
                v["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn upgrades(harness: &Harness, skills: &Path, api: &dyn Transport) {
    let store = harness.store();
    let (key, key_id) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let id = create(api, &key, 1).await;
    let task = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    let task = task.expect(200).json();
    assert_eq!(task["skill_version"]["version"], "1.0.0");
    assert_eq!(versions(&task), [(0, "1.0.0".to_owned())]);
    let v1_hash = task["skill_version"]["hash"].as_str().unwrap().to_owned();
    assert_eq!(v1_hash.len(), 64);

    // 2.0.0 calls the shelves `shelves`, with a migration from 1.0.0.
    let rename = json!([{"op": "move", "from": "/inventory", "path": "/shelves"}]);
    deploy_warehouse(skills, "2.0.0", "shelves", Some(("1.0.0", rename)));
    let upgrade = |body: Option<Value>| {
        let call = Call::new(axum::http::Method::POST, format!("/v1/tasks/{id}:upgrade")).key(&key);
        match body {
            Some(body) => call.json(&body),
            None => call,
        }
    };

    // No body: a dry run; nothing changes.
    let before = store.task(&id).await.unwrap();
    let planned = api.send(upgrade(None)).await;
    let planned = planned.expect(200).json();
    assert_eq!(planned["outcome"], "planned");
    assert_eq!(planned["applied"], false);
    assert_eq!(planned["from"]["version"], "1.0.0");
    assert_eq!(planned["to"]["version"], "2.0.0");
    assert_eq!(planned["migrations"], json!(["1.0.0"]));
    assert_eq!(planned["step"], 1);
    let diff = planned["diff"].to_string();
    assert!(
        diff.contains("/shelves") && diff.contains("/inventory"),
        "{diff}"
    );
    assert_eq!(store.task(&id).await.unwrap(), before);

    // Another tenant's task is no task; an unknown method is a 404 naming the one there is;
    // POST on the task itself is not allowed.
    let hidden = api
        .send(Call::new(axum::http::Method::POST, format!("/v1/tasks/{id}:upgrade")).key(&other))
        .await;
    hidden.problem(404);
    let unknown = api
        .send(
            Call::new(
                axum::http::Method::POST,
                format!("/v1/tasks/{id}:frobnicate"),
            )
            .key(&key),
        )
        .await;
    assert!(
        unknown.problem(404)["detail"]
            .as_str()
            .unwrap()
            .contains(":upgrade")
    );
    api.send(Call::new(axum::http::Method::POST, format!("/v1/tasks/{id}")).key(&key))
        .await
        .expect(405);
    // A skill the server does not have: 422 at /skill.
    let missing = api
        .send(upgrade(Some(json!({"skill": "../warehouse"}))))
        .await;
    assert_eq!(missing.problem(422)["errors"][0]["pointer"], "/skill");

    // Applied: a step of the journal, authored by the key.
    let moved = api.send(upgrade(Some(json!({"apply": true})))).await;
    let moved = moved.expect(200).json();
    assert_eq!(moved["outcome"], "moved");
    assert_eq!(moved["applied"], true);
    assert_eq!(moved["diff"], planned["diff"]);
    let task = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    let task = task.expect(200).json();
    assert_eq!(task["version"], 1);
    assert_eq!(task["skill_version"]["version"], "2.0.0");
    assert_eq!(
        versions(&task),
        [(0, "1.0.0".to_owned()), (1, "2.0.0".to_owned())]
    );
    let state = api
        .send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await;
    let state = state.expect(200).json();
    assert!(state.get("shelves").is_some() && state.get("inventory").is_none());
    let step = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1")).key(&key))
        .await;
    let step = step.expect(200).json();
    assert_eq!(step["accepted"]["author"], key_id.as_str(), "{step}");
    // The same version again is nothing to do.
    api.send(upgrade(Some(json!({"apply": true}))))
        .await
        .problem(409);

    // 3.0.0 needs `bins`, which its migration does not give: refused with pointers, nothing
    // changes.
    deploy_warehouse(
        skills,
        "3.0.0",
        "bins",
        Some(("2.0.0", json!({"note": "forgot the rename"}))),
    );
    let before = store.task(&id).await.unwrap();
    let refused = api.send(upgrade(Some(json!({"apply": true})))).await;
    let refused = refused.problem(422);
    let pointers: Vec<&str> = refused["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert!(!pointers.is_empty(), "{refused}");
    assert!(
        refused["errors"].to_string().contains("bins")
            || refused["errors"].to_string().contains("note"),
        "{refused}"
    );
    assert_eq!(store.task(&id).await.unwrap(), before);
    assert_eq!(store.journal(&id).await.unwrap().len(), 1);

    // Many at once: three more tasks on 2.0.0, one of them being run; 2.1.0 changes only the
    // version (no migration: the state fits as it is). A page at a time; the task being run is refused and the others move.
    deploy_warehouse(
        skills,
        "2.0.0",
        "shelves",
        Some((
            "1.0.0",
            json!([{"op": "move", "from": "/inventory", "path": "/shelves"}]),
        )),
    );
    let mut ids = vec![id.clone()];
    for seed in 2..=4 {
        ids.push(create(api, &key, seed).await);
    }
    // Another tenant's task on the same skill is never touched.
    let foreign = create(api, &other, 9).await;
    let busy = ids[2].clone();
    store
        .acquire_lease(
            &busy,
            &LeaseClaim {
                token: "runner".into(),
                holder: "a worker".into(),
                process: "test".into(),
            },
            60_000,
            None,
        )
        .await
        .unwrap();
    deploy_warehouse(skills, "2.1.0", "shelves", None);
    let many = |body: Value| Call::post("/v1/tasks:upgrade", &body).key(&key);
    // Dry run of everything on 2.0.0.
    let dry = api
        .send(many(
            json!({"skill": "warehouse", "from": "2.0.0", "limit": 100}),
        ))
        .await;
    let dry = dry.expect(200).json();
    assert_eq!(dry["planned"], 4, "{dry}");
    assert_eq!(dry["to"]["version"], "2.1.0");
    assert_eq!(dry["next_cursor"], Value::Null);
    for id in &ids {
        assert_eq!(
            store
                .task(id)
                .await
                .unwrap()
                .skill
                .settings
                .version
                .as_ref()
                .unwrap()
                .to_string(),
            "2.0.0"
        );
    }
    // Applied, two at a time.
    let mut cursor = Value::Null;
    let mut outcomes = std::collections::BTreeMap::new();
    let mut pages = 0;
    loop {
        let page = api
            .send(many(json!({
                "skill": "warehouse", "from": "2.0.0", "apply": true, "limit": 2, "cursor": cursor
            })))
            .await;
        let page = page.expect(200).json();
        pages += 1;
        for result in page["results"].as_array().unwrap() {
            outcomes.insert(
                result["task"].as_str().unwrap().to_owned(),
                result["outcome"].as_str().unwrap().to_owned(),
            );
            if result["outcome"] == "refused" {
                assert_eq!(result["problem"]["status"], 409, "{result}");
            }
        }
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    for id in &ids {
        let expected = if *id == busy { "refused" } else { "moved" };
        assert_eq!(outcomes[id], expected, "{id}");
        let version = store
            .task(id)
            .await
            .unwrap()
            .skill
            .settings
            .version
            .unwrap()
            .to_string();
        assert_eq!(version, if *id == busy { "2.0.0" } else { "2.1.0" });
    }
    assert!(!outcomes.contains_key(&foreign));
    assert_eq!(
        store
            .task(&foreign)
            .await
            .unwrap()
            .skill
            .settings
            .version
            .unwrap()
            .to_string(),
        "2.0.0"
    );
    // A create may pin the version it was written for: the server's (2.1.0) is accepted, by
    // version or by hash prefix; another is refused at /skill_version, nothing created.
    let pinned = |pin: &str| {
        Call::post(
            "/v1/tasks",
            &json!({"skill": "warehouse", "model": "oracle", "skill_version": pin}),
        )
        .key(&key)
    };
    let made = api.send(pinned("2.1.0")).await;
    let hash = made.expect(201).json()["task"]["skill_version"]["hash"]
        .as_str()
        .unwrap()
        .to_owned();
    api.send(pinned(&hash[..8])).await.expect(201);
    let count = store.list_tasks().await.unwrap().len();
    let stale = api.send(pinned("2.0.0")).await;
    let stale = stale.problem(422);
    assert_eq!(stale["errors"][0]["pointer"], "/skill_version", "{stale}");
    assert!(
        stale["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("2.1.0"),
        "{stale}"
    );
    let batch = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"tasks": [
                    {"skill": "warehouse", "model": "oracle"},
                    {"skill": "warehouse", "model": "oracle", "skill_version": "9.9.9"}
                ]}),
            )
            .key(&key),
        )
        .await;
    assert_eq!(
        batch.problem(422)["errors"][0]["pointer"],
        "/tasks/1/skill_version"
    );
    api.send(pinned("abc")).await.problem(422);
    assert_eq!(store.list_tasks().await.unwrap().len(), count);

    // Bad selectors are the caller's to fix.
    api.send(many(json!({"skill": "warehouse", "from": "not a version"})))
        .await
        .problem(422);
    api.send(many(json!({"skill": "warehouse", "limit": 0})))
        .await
        .problem(400);
    api.send(many(json!({"skill": "nowhere"})))
        .await
        .problem(422);
}
