//! A task's whole life through the API, the same scenario three ways: through the router
//! in-process, over a real socket on 127.0.0.1 with a SQLite file, and over a socket with
//! PostgreSQL. The task runs in between as a worker would run it (the runtime with the oracle
//! model in the real warehouse environment), so the journal routes read real steps.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_envs::warehouse::{WarehouseConfig, generate_events, reference_answer};
use skillstate_providers::ScriptedModel;
use skillstate_store::{Verdict, state_at};
use support::*;

#[tokio::test]
async fn lifecycle_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let transport = InProcess(harness.router());
    lifecycle(&harness, &transport).await;
}

#[tokio::test]
async fn lifecycle_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    lifecycle(&harness, &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn lifecycle_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    lifecycle(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

async fn lifecycle(harness: &Harness, api: &dyn Transport) {
    let store = harness.store();
    let (key, key_id) = harness.key("acme").await;

    api.send(Call::get("/healthz")).await.expect(200);
    let ready = api.send(Call::get("/readyz")).await;
    assert_eq!(ready.expect(200).json()["status"], "ok");

    // Create, with an Idempotency-Key; the retry returns the same task.
    let request = json!({
        "skill": "warehouse",
        "model": "oracle",
        "environment": {"seed": 11, "events": 4},
        "labels": {"team": "ops"}
    });
    let create = || {
        Call::post("/v1/tasks", &request)
            .key(&key)
            .header("idempotency-key", "create-1")
    };
    let created = api.send(create()).await;
    created.expect(201);
    let task = created.json()["task"].clone();
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(created.json()["created"], true);
    assert_eq!(
        created.header("location"),
        Some(format!("/v1/tasks/{id}").as_str())
    );
    assert_eq!(task["status"], "running");
    assert_eq!(task["version"], 0);
    assert_eq!(task["skill"], "warehouse");
    assert_eq!(task["context"], "state");
    let replay = api.send(create()).await;
    replay.expect(200);
    assert_eq!(replay.json()["created"], false);
    assert_eq!(replay.json()["task"]["id"], id.as_str());

    // The state, with its version as the ETag.
    let initial = api
        .send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await;
    initial.expect(200);
    assert_eq!(initial.header("etag"), Some("\"0\""));
    let stored = store.task(&id).await.unwrap();
    assert_eq!(initial.json(), stored.state);
    let unchanged = api
        .send(
            Call::get(format!("/v1/tasks/{id}/state"))
                .key(&key)
                .header("if-none-match", "\"0\""),
        )
        .await;
    unchanged.expect(304);
    assert!(unchanged.body.is_empty());

    // A worker runs it.
    run_to_end(store.clone(), &id).await;
    let done = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    let done = done.expect(200).json();
    assert_eq!(done["status"], "completed", "{done}");
    let version = done["version"].as_u64().unwrap();
    assert!(version >= 4, "{done}");
    let current = api
        .send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await;
    assert_eq!(
        current.expect(200).header("etag"),
        Some(format!("\"{version}\"").as_str())
    );
    let stored = store.task(&id).await.unwrap();
    assert_eq!(current.json(), stored.state);

    // Steps, paged by cursor: every step once, in order.
    let mut steps = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/tasks/{id}/steps?limit=2&cursor={c}"),
            None => format!("/v1/tasks/{id}/steps?limit=2"),
        };
        let page = api.send(Call::get(path).key(&key)).await.expect(200).json();
        let items = page["steps"].as_array().unwrap();
        assert!(items.len() <= 2);
        steps.extend(items.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let numbers: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (1..=version).collect::<Vec<_>>());
    assert!(
        steps
            .iter()
            .all(|s| s["verdict"] == "accepted" && s["author"].is_null())
    );

    // One step in full: its answer, action and result as journaled.
    let journal = store.journal(&id).await.unwrap();
    let first = journal
        .iter()
        .find(|e| e.step == 1 && e.verdict == Verdict::Accepted)
        .unwrap();
    let step = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1")).key(&key))
        .await;
    let step = step.expect(200).json();
    assert_eq!(step["step"], 1);
    assert_eq!(step["accepted"]["output"], first.output.as_str());
    assert_eq!(
        step["accepted"]["patch"],
        first.patch.clone().unwrap_or(Value::Null)
    );
    assert_eq!(step["accepted"]["prompt_tokens"], first.prompt_tokens);
    assert_eq!(
        step["accepted"]["state_hash"],
        first.state_hash.clone().unwrap()
    );
    assert_eq!(step["rejected"], json!([]));
    assert_eq!(
        step["observation"].as_str(),
        store.observation(&id, 1).await.unwrap().as_deref()
    );
    let intent = &step["intent"];
    assert_eq!(intent["idempotency_key"], format!("{id}:1"));
    assert_eq!(intent["done"], true);
    assert!(intent["result"].is_string());

    // Time travel: every step's state, checked against the recorded hashes.
    let zero = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/0/state")).key(&key))
        .await;
    assert_eq!(zero.expect(200).json(), initial.json());
    for entry in journal.iter().filter(|e| e.verdict == Verdict::Accepted) {
        let at = api
            .send(Call::get(format!("/v1/tasks/{id}/steps/{}/state", entry.step)).key(&key))
            .await;
        let at = at.expect(200).json();
        assert_eq!(
            Some(state_hash(&at)),
            entry.state_hash,
            "step {}",
            entry.step
        );
    }
    let last = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/{version}/state")).key(&key))
        .await;
    assert_eq!(last.expect(200).json(), current.json());

    // The prompt of a step, byte-identical to what the model received.
    let prompt = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/2/prompt")).key(&key))
        .await;
    let prompt = prompt.expect(200).json();
    let second = journal.iter().find(|e| e.step == 2).unwrap();
    assert_eq!(prompt["identical"], true);
    assert_eq!(prompt["recorded_sha256"], second.prompt_hash.as_str());
    assert_eq!(prompt["sha256"], second.prompt_hash.as_str());
    assert_eq!(prompt["tokens"], second.prompt_tokens);
    assert!(prompt["text"].as_str().unwrap().contains("warehouse"));
    let no_attempt = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/2/prompt?attempt=9")).key(&key))
        .await;
    no_attempt.problem(404);

    // Steps that are not there.
    let beyond = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/{}", version + 5)).key(&key))
        .await;
    beyond.problem(404);
    let beyond_state = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/{}/state", version + 5)).key(&key))
        .await;
    beyond_state.problem(404);
    let not_a_number = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/one")).key(&key))
        .await;
    not_a_number.problem(400);

    // Fork at step 1: a new task of the same tenant with the state after step 1.
    let fork = api
        .send(Call::post(format!("/v1/tasks/{id}/fork"), &json!({"step": 1})).key(&key))
        .await;
    fork.expect(201);
    let fork = fork.json();
    let fork_id = fork["id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, id);
    assert_eq!(fork["parent"], json!({"task": id, "step": 1}));
    assert_eq!(fork["version"], 1);
    assert_eq!(fork["status"], "running");
    let fork_state = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/state")).key(&key))
        .await;
    assert_eq!(fork_state.expect(200).header("etag"), Some("\"1\""));
    let at_one = state_at(store.as_ref(), &id, 1, version).await.unwrap();
    assert_eq!(fork_state.json(), at_one);
    let too_far = api
        .send(
            Call::post(
                format!("/v1/tasks/{id}/fork"),
                &json!({"step": version + 1}),
            )
            .key(&key),
        )
        .await;
    assert_eq!(too_far.problem(422)["errors"][0]["pointer"], "/step");

    // Write the fork's state: a merge patch on the version read, journaled with its author.
    let patch = |version: &str, content_type: &str, body: &Value| {
        Call::new(
            axum::http::Method::PATCH,
            format!("/v1/tasks/{fork_id}/state"),
        )
        .key(&key)
        .header("if-match", version)
        .raw(content_type, serde_json::to_vec(body).unwrap())
    };
    let merge = json!({"inventory": {"shelf_499": "item_4242"}});
    let written = api
        .send(patch("\"1\"", "application/merge-patch+json", &merge))
        .await;
    assert_eq!(written.expect(200).header("etag"), Some("\"2\""));
    assert_eq!(written.json()["inventory"]["shelf_499"], "item_4242");
    let reread = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/state")).key(&key))
        .await;
    assert_eq!(reread.expect(200).json(), written.json());
    let step = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/steps/2")).key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(step["accepted"]["author"], key_id.as_str());
    assert_eq!(step["accepted"]["patch"], merge);
    assert_eq!(
        step["accepted"]["state_hash"].as_str(),
        Some(state_hash(&written.json()).as_str())
    );
    let no_prompt = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/steps/2/prompt")).key(&key))
        .await;
    no_prompt.problem(404);
    // The same If-Match again: the version moved on.
    let stale = api
        .send(patch("\"1\"", "application/merge-patch+json", &merge))
        .await;
    stale.problem(412);
    // RFC 6902 operations.
    let ops = json!([{"op": "remove", "path": "/inventory/shelf_499"}]);
    let removed = api
        .send(patch("\"2\"", "application/json-patch+json", &ops))
        .await;
    assert_eq!(removed.expect(200).header("etag"), Some("\"3\""));
    assert!(removed.json()["inventory"].get("shelf_499").is_none());
    // The same checks as a model's patch: a read-only field, the schema, with pointers.
    let read_only = api
        .send(patch(
            "\"3\"",
            "application/merge-patch+json",
            &json!({"shelf_count": 7}),
        ))
        .await;
    let problem = read_only.problem(422);
    assert_eq!(problem["errors"][0]["kind"], "read_only", "{problem}");
    assert_eq!(problem["errors"][0]["pointer"], "/shelf_count", "{problem}");
    let schema = api
        .send(patch(
            "\"3\"",
            "application/json",
            &json!({"inventory": {"shelf_1": 5}}),
        ))
        .await;
    let problem = schema.problem(422);
    assert_eq!(problem["errors"][0]["kind"], "schema", "{problem}");
    assert_eq!(
        problem["errors"][0]["pointer"], "/inventory/shelf_1",
        "{problem}"
    );
    let no_if_match = api
        .send(
            Call::new(
                axum::http::Method::PATCH,
                format!("/v1/tasks/{fork_id}/state"),
            )
            .key(&key)
            .raw("application/merge-patch+json", b"{}".to_vec()),
        )
        .await;
    no_if_match.problem(428);
    let star = api
        .send(patch("*", "application/merge-patch+json", &merge))
        .await;
    star.problem(400);
    let wrong_type = api.send(patch("\"3\"", "text/plain", &merge)).await;
    wrong_type.problem(415);
    let not_an_object = api
        .send(patch("\"3\"", "application/merge-patch+json", &ops))
        .await;
    not_an_object.problem(422);
    // Refusals wrote nothing; the journal rebuilds the written state.
    let after = api
        .send(Call::get(format!("/v1/tasks/{fork_id}")).key(&key))
        .await;
    assert_eq!(after.expect(200).json()["version"], 3);
    let rebuilt = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/steps/3/state")).key(&key))
        .await;
    assert_eq!(rebuilt.expect(200).json(), removed.json());

    // Listing: both tasks, newest first; filters.
    let list = api
        .send(Call::get("/v1/tasks").key(&key))
        .await
        .expect(200)
        .json();
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [fork_id.as_str(), id.as_str()]);
    assert!(list["next_cursor"].is_null());
    let completed = api
        .send(Call::get("/v1/tasks?status=completed").key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(completed["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(completed["tasks"][0]["id"], id.as_str());
    let labelled = api
        .send(Call::get("/v1/tasks?label=team:ops").key(&key))
        .await
        .expect(200)
        .json();
    // A fork carries its parent's labels: the filter finds both, in the listing's order.
    let labelled: Vec<&str> = labelled["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(labelled, [fork_id.as_str(), id.as_str()]);

    // Cancel the fork (idempotent), then delete it.
    let canceled = api
        .send(
            Call::new(
                axum::http::Method::POST,
                format!("/v1/tasks/{fork_id}/cancel"),
            )
            .key(&key),
        )
        .await;
    let canceled = canceled.expect(200).json();
    assert_eq!(canceled["status"], "failed");
    assert_eq!(
        canceled["outcome"],
        json!({"reason": "canceled", "by": key_id})
    );
    let again = api
        .send(
            Call::new(
                axum::http::Method::POST,
                format!("/v1/tasks/{fork_id}/cancel"),
            )
            .key(&key),
        )
        .await;
    assert_eq!(again.expect(200).json()["status"], "failed");
    let finished = api
        .send(Call::new(axum::http::Method::POST, format!("/v1/tasks/{id}/cancel")).key(&key))
        .await;
    finished.problem(409);
    let deleted = api
        .send(Call::delete(format!("/v1/tasks/{fork_id}")).key(&key))
        .await;
    deleted.expect(204);
    let gone = api
        .send(Call::get(format!("/v1/tasks/{fork_id}")).key(&key))
        .await;
    gone.problem(404);
    // The original is untouched by its fork's life.
    let original = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    assert_eq!(original.expect(200).json()["version"], version);
}

/// A step with a rejected answer: the step lists both answers, the rejection's errors, and
/// the prompt of the retry (which shows the errors) is rebuilt byte for byte.
#[tokio::test]
async fn rejected_answers_and_the_prompt_of_a_retry() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let (key, _) = harness.key("acme").await;
    let request =
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": 2}});
    let created = api.send(Call::post("/v1/tasks", &request).key(&key)).await;
    let id = created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let config = WarehouseConfig::new(5, 2);
    let mut answers = vec!["no JSON here".to_owned()];
    answers.extend(generate_events(&config).iter().map(reference_answer));
    let model = ScriptedModel::from_outputs("answers.jsonl".into(), answers);
    run_with(harness.store(), &id, Arc::new(model)).await;

    let list = api
        .send(Call::get(format!("/v1/tasks/{id}/steps")).key(&key))
        .await;
    let first = list.expect(200).json()["steps"][0].clone();
    assert_eq!(first["step"], 1);
    assert_eq!(first["answers"], 2);
    assert_eq!(first["verdict"], "accepted");
    let step = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1")).key(&key))
        .await;
    let step = step.expect(200).json();
    assert_eq!(step["rejected"].as_array().unwrap().len(), 1);
    assert_eq!(step["rejected"][0]["attempt"], 1);
    assert_eq!(step["rejected"][0]["output"], "no JSON here");
    assert!(
        step["rejected"][0]["errors"][0]["kind"].is_string(),
        "{step}"
    );
    assert_eq!(step["accepted"]["attempt"], 2);

    let retry = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1/prompt?attempt=2")).key(&key))
        .await;
    let retry = retry.expect(200).json();
    assert_eq!(retry["identical"], true);
    let default = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1/prompt")).key(&key))
        .await;
    assert_eq!(default.expect(200).json()["attempt"], 2);
    let first_try = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1/prompt?attempt=1")).key(&key))
        .await;
    let first_try = first_try.expect(200).json();
    assert_eq!(first_try["identical"], true);
    assert_ne!(first_try["sha256"], retry["sha256"]);
    let bad = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1/prompt?attempt=x")).key(&key))
        .await;
    bad.problem(400);
}
