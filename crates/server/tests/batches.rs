//! Batches and task totals through the API: `POST /v1/tasks:batch` records its tasks as a
//! batch of the caller's tenant (a replay with its Idempotency-Key finds the same batch);
//! `GET /v1/batches` pages through the tenant's batches; `GET /v1/batches/{id}` answers the
//! figures `skillstate batch status` shows (the same `Report`, built here from the store);
//! `GET /v1/tasks?batch=` lists a batch's tasks; every task response carries its token totals
//! and cost (a model that reports usage, at a configured price). Other tenants, batches of no
//! tenant (as `skillstate batch submit` makes) and malformed ids are 404s; bad parameters
//! 400s. `POST /v1/batches/{id}/stop` and `/reopen` are the tenant's kill switch: a stopped
//! batch's queued tasks are claimed by no worker until it is reopened. Through the router
//! in-process and over a real socket on 127.0.0.1, on a SQLite file and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use axum::http::Method;
use serde_json::{Value, json};
use skillstate_envs::oracle::OracleModel;
use skillstate_providers::{
    ModelProvider, ModelRequest, ModelResponse, Price, ProviderError, Usage,
};
use skillstate_server::batch_report::{Report, now_millis};
use skillstate_server::{AppState, hash_secret, new_key_secret};
use skillstate_store::prelude::*;
use skillstate_store::{LeaseClaim, NewBatch, NewKey, OnError, QueuedTask, RateLimit, Settle};
use support::*;

/// Provider-reported usage of every answer of the reporting model.
const INPUT: u64 = 1000;
const OUTPUT: u64 = 100;

fn price() -> Price {
    Price {
        input: 2.0,
        output: 8.0,
        cached_input: None,
    }
}

/// The oracle, with a provider's usage report on each answer.
struct Reporting(OracleModel);

#[async_trait]
impl ModelProvider for Reporting {
    fn spec(&self) -> String {
        "oracle".into()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let mut response = self.0.complete(request).await?;
        response.usage = Some(Usage {
            input_tokens: INPUT,
            output_tokens: OUTPUT,
            ..Usage::default()
        });
        Ok(response)
    }
}

fn priced(harness: &Harness) -> AppState {
    harness
        .state
        .clone()
        .with_prices(BTreeMap::from([("oracle".to_owned(), price())]))
}

#[tokio::test]
async fn batches_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let transport = InProcess(skillstate_server::router(priced(&harness)));
    batches(&harness, &transport).await;
}

#[tokio::test]
async fn batches_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(priced(&harness)).await;
    batches(&harness, &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn batches_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(priced(&harness)).await;
    batches(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn stop_and_reopen_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let transport = InProcess(harness.router());
    stop_and_reopen(&harness, &transport).await;
}

#[tokio::test]
async fn stop_and_reopen_over_a_socket_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    let socket = Socket::start(harness.state.clone()).await;
    stop_and_reopen(&harness, &socket).await;
    socket.stop().await;
}

#[tokio::test]
async fn stop_and_reopen_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    stop_and_reopen(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

fn warehouse(seed: u64, item: &str) -> Value {
    json!({
        "skill": "warehouse",
        "model": "oracle",
        "environment": {"seed": seed, "events": 2},
        "labels": {"item": item},
    })
}

fn claim(token: &str) -> LeaseClaim {
    LeaseClaim {
        token: token.into(),
        holder: format!("test {token}"),
        process: "test".into(),
    }
}

/// Claims the oldest claimable task of `batch` and settles it done, as a worker does once it
/// ran it; returns its id.
async fn settle_next(store: &dyn Store, batch: &str, failure: Option<&str>) -> String {
    let claimed = store
        .claim_task(&claim("settler"), 60_000, Some(batch))
        .await
        .unwrap()
        .expect("a claimable task in the batch");
    store
        .settle_claim(&claimed.task_id, "settler", &Settle::Done, failure)
        .await
        .unwrap();
    claimed.task_id
}

fn cost(input: u64, output: u64) -> f64 {
    price().cost(&Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    })
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

async fn batches(harness: &Harness, api: &dyn Transport) {
    let store = harness.store();
    let (key, _) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;

    // A batch create records one batch of the tenant; its replay finds the same one.
    let body = json!({
        "name": "nightly",
        "tasks": [warehouse(1, "done"), warehouse(2, "canceled"), warehouse(3, "waiting")],
    });
    let created = api
        .send(
            Call::post("/v1/tasks:batch", &body)
                .key(&key)
                .header("idempotency-key", "nightly-1"),
        )
        .await;
    let created = created.expect(201).json();
    let batch = created["batch"].as_str().unwrap().to_owned();
    let ids: Vec<String> = created["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(created["tasks"][0]["task"]["totals"]["answers"], 0);
    let replay = api
        .send(
            Call::post("/v1/tasks:batch", &body)
                .key(&key)
                .header("idempotency-key", "nightly-1"),
        )
        .await;
    let replay = replay.expect(200).json();
    assert_eq!(replay["batch"], batch.as_str());
    assert_eq!(replay["tasks"][2]["task"]["id"], ids[2].as_str());

    // The first runs to its end with a model that reports usage; the second is canceled;
    // a worker settles both; the third waits in the queue.
    run_with(
        store.clone(),
        &ids[0],
        Arc::new(Reporting(
            OracleModel::for_environment("warehouse").unwrap(),
        )),
    )
    .await;
    api.send(Call::post(format!("/v1/tasks/{}/cancel", ids[1]), &json!({})).key(&key))
        .await
        .expect(200);
    assert_eq!(settle_next(store.as_ref(), &batch, None).await, ids[0]);
    assert_eq!(
        settle_next(store.as_ref(), &batch, Some("canceled through the API")).await,
        ids[1]
    );

    // The task's totals: every answer's counted tokens, the provider's report, the cost.
    let task = api
        .send(Call::get(format!("/v1/tasks/{}", ids[0])).key(&key))
        .await;
    let totals = task.expect(200).json()["totals"].clone();
    let journal = store.journal(&ids[0]).await.unwrap();
    let answers = journal.len() as u64;
    assert!(answers > 0);
    assert_eq!(totals["answers"], answers);
    assert_eq!(
        totals["prompt_tokens"],
        journal.iter().map(|e| e.prompt_tokens).sum::<u64>()
    );
    assert_eq!(
        totals["output_tokens"],
        journal
            .iter()
            .map(|e| e.output_tokens.unwrap_or(0))
            .sum::<u64>()
    );
    assert_eq!(
        totals["reported"],
        json!({"answers": answers, "input_tokens": INPUT * answers, "output_tokens": OUTPUT * answers})
    );
    assert!(
        close(&totals["cost_usd"], cost(INPUT * answers, OUTPUT * answers)),
        "{totals}"
    );

    // The batch's tasks, with the same totals in the listing.
    let listed = api
        .send(Call::get(format!("/v1/tasks?batch={batch}")).key(&key))
        .await;
    let listed = listed.expect(200).json();
    let listed_ids: Vec<&str> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed_ids, [&ids[2], &ids[1], &ids[0]]);
    assert_eq!(listed["tasks"][2]["totals"], totals);
    assert_eq!(
        listed["tasks"][0]["totals"],
        json!({"answers": 0, "prompt_tokens": 0, "output_tokens": 0, "reported": null, "cost_usd": 0.0})
    );
    // Without a price for the model, no cost.
    let unpriced = InProcess(harness.router());
    let plain = unpriced
        .send(Call::get(format!("/v1/tasks/{}", ids[0])).key(&key))
        .await;
    assert_eq!(plain.expect(200).json()["totals"]["cost_usd"], Value::Null);

    // The batch's figures are `batch status`'s.
    let view = api
        .send(Call::get(format!("/v1/batches/{batch}")).key(&key))
        .await;
    let view = view.expect(200).json();
    let record = store.batch(&batch).await.unwrap();
    let report = Report::build(
        record,
        &store.batch_tasks(&batch).await.unwrap(),
        Some("oracle".into()),
        Some("warehouse".into()),
        Some(&price()),
        now_millis(),
    );
    assert_eq!(view["counts"], serde_json::to_value(report.counts).unwrap());
    assert_eq!(
        view["counts"],
        json!({"total": 3, "queued": 1, "running": 0, "retry_waiting": 0, "completed": 1, "failed": 1, "paused": 0, "unknown": 0})
    );
    assert_eq!(view["batch"]["id"], batch.as_str());
    assert_eq!(view["batch"]["name"], "nightly");
    assert_eq!(view["batch"]["model"], "oracle");
    assert_eq!(view["batch"]["skill"], "warehouse");
    assert_eq!(view["batch"]["state"], "open");
    let metrics = &view["metrics"];
    assert_eq!(metrics["input_tokens"], INPUT * answers);
    assert_eq!(metrics["output_tokens"], OUTPUT * answers);
    assert_eq!(metrics["tokens"], (INPUT + OUTPUT) * answers);
    assert_eq!(metrics["prompt_tokens"], totals["prompt_tokens"]);
    assert!(close(
        &metrics["cost_usd"],
        cost(INPUT * answers, OUTPUT * answers)
    ));
    assert!(close(&metrics["completion_rate"], 1.0 / 3.0));
    assert!(metrics["eta_ms"].as_i64().unwrap() >= 0, "{metrics}");
    let slowest: Vec<&str> = view["slowest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(slowest, [ids[0].as_str()]);
    assert_eq!(view["failed_total"], 1);
    assert_eq!(view["failed"][0]["id"], ids[1].as_str());
    assert_eq!(view["failed"][0]["status"], "failed");
    assert_eq!(view["failed"][0]["failure"], "canceled through the API");
    assert_eq!(view["failed"][0]["labels"], json!({"item": "canceled"}));

    // Listing: newest first, a page at a time.
    let second = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"tasks": [warehouse(4, "later")]}),
            )
            .key(&key),
        )
        .await;
    let second = second.expect(201).json()["batch"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = api.send(Call::get("/v1/batches?limit=1").key(&key)).await;
    let page = page.expect(200).json();
    assert_eq!(page["batches"][0]["id"], second.as_str());
    assert_eq!(page["batches"][0]["name"], "api");
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let next = api
        .send(Call::get(format!("/v1/batches?limit=1&cursor={cursor}")).key(&key))
        .await;
    let next = next.expect(200).json();
    assert_eq!(next["batches"][0]["id"], batch.as_str());
    assert_eq!(next["batches"][0]["state"], "open");
    assert_eq!(next["next_cursor"], Value::Null);

    // Another tenant sees none of them; a batch of no tenant is nobody's.
    let theirs = api.send(Call::get("/v1/batches").key(&other)).await;
    assert_eq!(theirs.expect(200).json()["batches"], json!([]));
    api.send(Call::get(format!("/v1/batches/{batch}")).key(&other))
        .await
        .problem(404);
    let none = api
        .send(Call::get(format!("/v1/tasks?batch={batch}")).key(&other))
        .await;
    assert_eq!(none.expect(200).json()["tasks"], json!([]));
    let local = store
        .create_batch(&NewBatch {
            name: "submitted".into(),
            spec: json!({"skill": "warehouse", "model": "oracle"}),
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: RateLimit::default(),
        })
        .await
        .unwrap();
    let task = store.task(&ids[0]).await.unwrap();
    store
        .enqueue_tasks(
            &local.id,
            vec![QueuedTask {
                task: skillstate_store::NewTask {
                    skill: task.skill.clone(),
                    tools: task.tools.clone(),
                    context: task.context,
                    context_budget: task.context_budget,
                    model: task.model.clone(),
                    environment: task.environment.clone(),
                    env_checkpoint: None,
                    opening_observation: "start".into(),
                },
                initial_state: task.skill.initial_state.clone(),
                labels: json!({}),
                tenant: None,
            }],
        )
        .await
        .unwrap();
    api.send(Call::get(format!("/v1/batches/{}", local.id)).key(&key))
        .await
        .problem(404);
    let listed = api.send(Call::get("/v1/batches").key(&key)).await;
    assert_eq!(
        listed.expect(200).json()["batches"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Malformed and unknown ids, bad parameters, no key.
    for path in [
        "/v1/batches/not-a-batch".to_owned(),
        "/v1/batches/0190aaaa-0000-7000-8000-000000000000".to_owned(),
        format!("/v1/batches/{}", batch.to_uppercase()),
    ] {
        let problem = api.send(Call::get(&path).key(&key)).await.problem(404);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("GET /v1/batches"),
            "{problem}"
        );
    }
    for path in [
        "/v1/batches?limit=0",
        "/v1/batches?limit=501",
        "/v1/batches?cursor=nope",
        "/v1/batches?colour=red",
        "/v1/tasks?batch=nope",
    ] {
        api.send(Call::get(path).key(&key)).await.problem(400);
    }
    api.send(Call::get("/v1/batches")).await.problem(401);
    api.send(Call::get(format!("/v1/batches/{batch}")))
        .await
        .problem(401);
    let nameless = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"name": "", "tasks": [warehouse(5, "x")]}),
            )
            .key(&key),
        )
        .await;
    let problem = nameless.problem(422);
    assert_eq!(problem["errors"][0]["pointer"], "/name");
}

/// Whether any worker could claim a task now (of `batch`, or of any batch); a claim taken is
/// released at once.
async fn claimable(store: &dyn Store, batch: Option<&str>) -> Option<String> {
    let claimed = store
        .claim_task(&claim("probe"), 60_000, batch)
        .await
        .unwrap()?;
    store
        .release_lease(&claimed.task_id, "probe")
        .await
        .unwrap();
    Some(claimed.task_id)
}

async fn stop_and_reopen(harness: &Harness, api: &dyn Transport) {
    let store = harness.store();
    let (key, key_id) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let created = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"name": "mistake", "tasks": [warehouse(1, "a"), warehouse(2, "b"), warehouse(3, "c")]}),
            )
            .key(&key),
        )
        .await;
    let batch = created.expect(201).json()["batch"]
        .as_str()
        .unwrap()
        .to_owned();
    let stop = format!("/v1/batches/{batch}/stop");
    let reopen = format!("/v1/batches/{batch}/reopen");
    assert!(claimable(store.as_ref(), Some(&batch)).await.is_some());

    // Stop with a reason: the answer is the batch as GET shows it; nothing is claimed.
    let stopped = api
        .send(Call::post(&stop, &json!({"reason": "  wrong inputs file "})).key(&key))
        .await;
    let stopped = stopped.expect(200).json();
    assert_eq!(stopped["batch"]["id"], batch.as_str());
    assert_eq!(stopped["batch"]["state"], "stopped");
    assert_eq!(stopped["batch"]["stop_reason"], "wrong inputs file");
    assert_eq!(stopped["counts"]["total"], 3);
    assert_eq!(stopped["counts"]["queued"], 3);
    assert_eq!(claimable(store.as_ref(), Some(&batch)).await, None);
    assert_eq!(claimable(store.as_ref(), None).await, None);
    let shown = api
        .send(Call::get(format!("/v1/batches/{batch}")).key(&key))
        .await;
    let shown = shown.expect(200).json();
    assert_eq!(shown["batch"], stopped["batch"]);
    assert_eq!(shown["counts"], stopped["counts"]);
    let listed = api.send(Call::get("/v1/batches").key(&key)).await;
    let listed = listed.expect(200).json();
    assert_eq!(listed["batches"][0]["state"], "stopped");
    assert_eq!(listed["batches"][0]["stop_reason"], "wrong inputs file");

    // Stopping again (no body at all) keeps the first reason.
    let again = api.send(Call::new(Method::POST, &stop).key(&key)).await;
    assert_eq!(
        again.expect(200).json()["batch"]["stop_reason"],
        "wrong inputs file"
    );

    // Bodies that do not fit: nothing changes.
    for (body, pointer) in [
        (json!({"reason": ""}), "/reason"),
        (json!({"reason": "two\nlines"}), "/reason"),
        (json!({"reason": "nul\u{0}byte"}), "/reason"),
        (json!({"reason": "x".repeat(2001)}), "/reason"),
        (json!({"colour": "red"}), "/colour"),
        (json!({"reason": 7}), "/reason"),
    ] {
        let problem = api
            .send(Call::post(&stop, &body).key(&key))
            .await
            .problem(422);
        assert_eq!(
            problem["errors"][0]["pointer"], pointer,
            "{body}: {problem}"
        );
    }
    api.send(
        Call::new(Method::POST, &stop)
            .raw("application/json", b"{".to_vec())
            .key(&key),
    )
    .await
    .problem(400);
    api.send(
        Call::new(Method::POST, &stop)
            .raw("text/plain", b"stop it".to_vec())
            .key(&key),
    )
    .await
    .problem(415);
    assert_eq!(
        store.batch(&batch).await.unwrap().stop_reason.as_deref(),
        Some("wrong inputs file")
    );

    // Another tenant, a batch of no tenant, malformed and unknown ids: 404, nothing changes.
    for path in [&stop, &reopen] {
        let problem = api
            .send(Call::new(Method::POST, path).key(&other))
            .await
            .problem(404);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("GET /v1/batches"),
            "{problem}"
        );
    }
    assert_eq!(
        store.batch(&batch).await.unwrap().state,
        skillstate_store::BatchState::Stopped
    );
    let local = store
        .create_batch(&NewBatch {
            name: "submitted".into(),
            spec: json!({"skill": "warehouse", "model": "oracle"}),
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: RateLimit::default(),
        })
        .await
        .unwrap();
    for path in [
        format!("/v1/batches/{}/stop", local.id),
        "/v1/batches/not-a-batch/stop".to_owned(),
        "/v1/batches/0190aaaa-0000-7000-8000-000000000000/reopen".to_owned(),
        format!("/v1/batches/{}/stop", &batch[..13]),
        format!("/v1/batches/{}/reopen", batch.to_uppercase()),
    ] {
        api.send(Call::new(Method::POST, &path).key(&key))
            .await
            .problem(404);
    }
    assert_eq!(
        store.batch(&local.id).await.unwrap().state,
        skillstate_store::BatchState::Open
    );
    // No key; a key limited to board pointers.
    api.send(Call::new(Method::POST, &reopen))
        .await
        .problem(401);
    let secret = new_key_secret();
    store
        .create_key(&NewKey {
            tenant: "acme".into(),
            label: "boards only".into(),
            secret_hash: hash_secret(&secret),
            scopes: Some(json!({"board": {"reads": ["/plan"], "writes": []}})),
        })
        .await
        .unwrap();
    api.send(Call::new(Method::POST, &reopen).key(&secret))
        .await
        .problem(403);
    assert_eq!(claimable(store.as_ref(), None).await, None);

    // Reopen: open, no reason, the queued tasks claimable again (nothing requeued).
    let reopened = api.send(Call::new(Method::POST, &reopen).key(&key)).await;
    let reopened = reopened.expect(200).json();
    assert_eq!(reopened["batch"]["state"], "open");
    assert_eq!(reopened["batch"]["stop_reason"], Value::Null);
    assert_eq!(reopened["counts"]["queued"], 3);
    let record = store.batch(&batch).await.unwrap();
    assert_eq!(
        (record.state, record.stop_reason),
        (skillstate_store::BatchState::Open, None)
    );
    assert!(claimable(store.as_ref(), Some(&batch)).await.is_some());
    let again = api.send(Call::new(Method::POST, &reopen).key(&key)).await;
    assert_eq!(again.expect(200).json()["batch"]["state"], "open");

    // Without a reason, the stop names the key that made it.
    let stopped = api.send(Call::new(Method::POST, &stop).key(&key)).await;
    let reason = stopped.expect(200).json()["batch"]["stop_reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains(&key_id), "{reason}");
    assert_eq!(claimable(store.as_ref(), None).await, None);
    // The document describes both routes.
    let doc = api
        .send(Call::get("/openapi.json"))
        .await
        .expect(200)
        .json();
    assert_eq!(
        doc["paths"]["/v1/batches/{id}/stop"]["post"]["operationId"],
        "stopBatch"
    );
    // The body is optional: `required` is absent (false) in OpenAPI 3.1.
    let body = &doc["paths"]["/v1/batches/{id}/stop"]["post"]["requestBody"];
    assert!(body["content"]["application/json"].is_object(), "{body}");
    assert_ne!(body["required"], true, "{body}");
    assert_eq!(
        doc["paths"]["/v1/batches/{id}/reopen"]["post"]["operationId"],
        "reopenBatch"
    );
}
