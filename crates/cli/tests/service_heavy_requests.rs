//! No request can hold `skillstate serve` (docs/service.md, "Running as a service"): a real server
//! process on 127.0.0.1 answers a create whose environment once looped forever (40,000
//! warehouse events), keeps answering `/healthz` while heavy creates are prepared, and stops on
//! SIGTERM without waiting for work it abandoned.
#![allow(clippy::unwrap_used)]

mod common;
mod service_support;

use std::time::Duration;

use serde_json::{Value, json};
use service_support::{client, new_key, start};

/// A create either made its task or answered a clean problem.
async fn created_or_problem(response: reqwest::Response) -> Value {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: Value = response.json().await.unwrap();
    assert!(
        status == 201 || (content_type == "application/problem+json" && status >= 400),
        "{status} {content_type}: {body}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_creates_answer_while_healthz_answers_and_sigterm_stops_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("service.db");
    let key = new_key(&db, "acme");
    // API only: the point is the request path, not running 40,000 steps.
    let mut server = start(&db, &["--workers", "0"], None);
    let http = client();
    let base = server.base.clone();

    // The horizon that once never answered.
    let create = {
        let (http, base, key) = (http.clone(), base.clone(), key.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/tasks"))
                .bearer_auth(&key)
                .json(&json!({"skill": "warehouse", "model": "oracle",
                    "environment": {"events": 40_000, "seed": 7}}))
                .send()
                .await
        })
    };
    let mut health_answers = 0;
    while !create.is_finished() || health_answers == 0 {
        let health = http.get(format!("{base}/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        health_answers += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = created_or_problem(create.await.unwrap().unwrap()).await;
    assert_eq!(body["created"], true, "{body}");
    assert!(body["task"]["id"].is_string(), "{body}");

    // Every documented extreme answers too.
    for environment in [
        json!({"events": 100_000, "shelves": 2, "drift": "secret_move"}),
        json!({"events": 100_000, "shelves": 100_000}),
    ] {
        let response = http
            .post(format!("{base}/v1/tasks"))
            .bearer_auth(&key)
            .json(&json!({"skill": "warehouse", "model": "oracle", "environment": environment}))
            .send()
            .await
            .unwrap();
        created_or_problem(response).await;
    }

    // A batch of the heaviest creates: /healthz answers while it is prepared, and SIGTERM
    // stops the server although the batch's work is still running.
    let tasks: Vec<Value> = (0..100)
        .map(|seed| {
            json!({"skill": "warehouse", "model": "oracle",
                "environment": {"events": 100_000, "seed": seed}})
        })
        .collect();
    let batch = {
        let (http, base, key) = (http.clone(), base.clone(), key.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/v1/tasks:batch"))
                .bearer_auth(&key)
                .json(&json!({"tasks": tasks}))
                .send()
                .await
        })
    };
    for _ in 0..3 {
        let health = http.get(format!("{base}/healthz")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let batch_was_running = !batch.is_finished();
    // Generous: only guards against a hang (the shutdown grace is 10 s).
    let status = server
        .terminate(Duration::from_secs(120))
        .expect("serve stops on SIGTERM while heavy work runs");
    assert!(status.success(), "{status:?}");
    assert!(
        batch_was_running,
        "the batch ended before SIGTERM, so this run did not show the shutdown abandoning work"
    );
    // The batch got an answer or its connection closed; it never held the server.
    if let Ok(Ok(response)) = batch.await {
        let status = response.status().as_u16();
        assert!(status == 503 || status == 201, "{status}");
    }
}
