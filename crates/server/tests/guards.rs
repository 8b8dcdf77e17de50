//! What the service refuses, and how: keys (missing, malformed, unknown, revoked), tenants
//! (another tenant's task is a 404 on every route, like a task created outside the service),
//! bodies (malformed, too large, too deep, wrong type, invalid), batches (all or nothing),
//! idempotency, busy tasks, unknown routes — every refusal a problem+json. And the OpenAPI
//! document: valid JSON, an operationId and summary on every operation, every documented
//! operation routed.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::http::Method;
use serde_json::{Value, json};
use skillstate_runtime::{TaskOptions, start_task};
use skillstate_server::ServerConfig;
use skillstate_store::LeaseClaim;
use support::*;

fn warehouse(events: u32) -> Value {
    json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 3, "events": events}})
}

async fn create(api: &dyn Transport, key: &str, body: &Value) -> String {
    let reply = api.send(Call::post("/v1/tasks", body).key(key)).await;
    reply.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Every route that names a task, as (method, path, body).
fn task_routes(id: &str) -> Vec<(Method, String, Option<Value>)> {
    vec![
        (Method::GET, format!("/v1/tasks/{id}"), None),
        (Method::DELETE, format!("/v1/tasks/{id}"), None),
        (Method::POST, format!("/v1/tasks/{id}/cancel"), None),
        (Method::GET, format!("/v1/tasks/{id}/state"), None),
        (
            Method::PATCH,
            format!("/v1/tasks/{id}/state"),
            Some(json!({})),
        ),
        (Method::GET, format!("/v1/tasks/{id}/steps"), None),
        (Method::GET, format!("/v1/tasks/{id}/steps/1"), None),
        (Method::GET, format!("/v1/tasks/{id}/steps/0/state"), None),
        (Method::GET, format!("/v1/tasks/{id}/steps/1/prompt"), None),
        (
            Method::POST,
            format!("/v1/tasks/{id}/fork"),
            Some(json!({"step": 0})),
        ),
        (Method::GET, format!("/v1/tasks/{id}/messages"), None),
        (
            Method::POST,
            format!("/v1/tasks/{id}/messages"),
            Some(json!({"text": "hello"})),
        ),
        (
            Method::POST,
            format!("/v1/tasks/{id}/approve"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/v1/tasks/{id}/reject"),
            Some(json!({"reason": "no"})),
        ),
        (
            Method::POST,
            format!("/v1/tasks/{id}/reply"),
            Some(json!({"text": "yes"})),
        ),
        (Method::POST, format!("/v1/tasks/{id}/resume"), None),
    ]
}

fn call(method: &Method, path: &str, body: &Option<Value>) -> Call {
    let call = Call::new(method.clone(), path).header("if-match", "\"0\"");
    match body {
        Some(body) => call.json(body),
        None => call,
    }
}

#[tokio::test]
async fn a_tenant_never_sees_another_tenants_tasks() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let (acme, _) = harness.key("acme").await;
    let (globex, _) = harness.key("globex").await;
    let id = create(&api, &acme, &warehouse(2)).await;
    run_to_end(harness.store(), &id).await;

    // A task created outside the service (the CLI) belongs to no tenant.
    let skill = skillstate_core::Skill::load(&skills_dir().join("warehouse"))
        .unwrap()
        .skill;
    let mut env =
        skillstate_envs::build_environment(skill.settings().environment.as_ref().unwrap()).unwrap();
    let local = start_task(
        harness.store().as_ref(),
        &skill,
        env.as_mut(),
        &TaskOptions::new("oracle", skillstate_core::ContextStrategy::State),
    )
    .await
    .unwrap();

    let missing = uuid::Uuid::now_v7().to_string();
    for (method, path, body) in task_routes(&id) {
        let foreign = api.send(call(&method, &path, &body).key(&globex)).await;
        let problem = foreign.problem(404);
        // The same answer as for a task that does not exist at all.
        let absent_path = path.replace(&id, &missing);
        let absent = api
            .send(call(&method, &absent_path, &body).key(&globex))
            .await;
        let mut expected = absent.problem(404);
        expected["detail"] = json!(expected["detail"].as_str().unwrap().replace(&missing, &id));
        expected["instance"] = json!(path);
        assert_eq!(problem, expected, "{method} {path}");
        // Nor can any tenant reach the task of no tenant, or use an id prefix.
        let local_path = path.replace(&id, &local.id);
        api.send(call(&method, &local_path, &body).key(&acme))
            .await
            .problem(404);
        let prefix_path = path.replace(&id, &id[..8]);
        api.send(call(&method, &prefix_path, &body).key(&acme))
            .await
            .problem(404);
    }
    let listed = api
        .send(Call::get("/v1/tasks").key(&globex))
        .await
        .expect(200)
        .json();
    assert_eq!(listed["tasks"], json!([]));
    // The owner still has it, untouched (the foreign DELETE, cancel and message did nothing).
    let own = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&acme))
        .await;
    assert_eq!(own.expect(200).json()["status"], "completed");
    assert!(
        harness.store().messages(&id).await.unwrap().is_empty(),
        "a foreign message reached the task"
    );
    let listed = api
        .send(Call::get("/v1/tasks").key(&acme))
        .await
        .expect(200)
        .json();
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn keys_missing_malformed_unknown_or_revoked_are_401() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let (key, key_id) = harness.key("acme").await;
    let id = create(&api, &key, &warehouse(2)).await;
    let path = format!("/v1/tasks/{id}");

    let cases = [
        Call::get(&path),
        Call::get(&path).header("authorization", &format!("Basic {key}")),
        Call::get(&path).header("authorization", "Bearer"),
        Call::get(&path).key("sk_unknown"),
    ];
    for case in cases {
        let reply = api.send(case).await;
        reply.problem(401);
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"skillstate\"")
        );
    }
    api.send(Call::get(&path).key(&key)).await.expect(200);
    harness.store().revoke_key(&key_id).await.unwrap();
    // At once: no cache stands between a revocation and the next request.
    let revoked = api.send(Call::get(&path).key(&key)).await;
    revoked.problem(401);
    let create = api
        .send(Call::post("/v1/tasks", &warehouse(2)).key(&key))
        .await;
    create.problem(401);
    // Open routes stay open.
    api.send(Call::get("/healthz")).await.expect(200);
    api.send(Call::get("/openapi.json")).await.expect(200);
}

#[tokio::test]
async fn bad_bodies_are_refused_with_problems() {
    let config = ServerConfig {
        body_limit: 4096,
        ..ServerConfig::default()
    };
    let harness = Harness::with_config(Db::sqlite().await, config);
    let router = harness.router();
    let socket = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    for api in [&InProcess(router) as &dyn Transport, &socket] {
        let malformed = api
            .send(
                Call::new(Method::POST, "/v1/tasks")
                    .key(&key)
                    .raw("application/json", b"{\"skill\": ".to_vec()),
            )
            .await;
        let problem = malformed.problem(400);
        assert!(
            problem["detail"].as_str().unwrap().contains("line 1"),
            "{problem}"
        );

        let mut big = warehouse(2);
        big["labels"] = json!({"note": "x".repeat(5000)});
        let oversized = api.send(Call::post("/v1/tasks", &big).key(&key)).await;
        let problem = oversized.problem(413);
        assert!(
            problem["detail"].as_str().unwrap().contains("4096"),
            "{problem}"
        );

        let deep = format!(
            "{{\"skill\": \"warehouse\", \"model\": \"oracle\", \"state\": {}1{}}}",
            "[".repeat(65),
            "]".repeat(65)
        );
        let too_deep = api
            .send(
                Call::new(Method::POST, "/v1/tasks")
                    .key(&key)
                    .raw("application/json", deep.into_bytes()),
            )
            .await;
        let problem = too_deep.problem(400);
        assert_eq!(problem["type"], "urn:skillstate:problem:json-too-deep");
        assert!(
            problem["detail"].as_str().unwrap().contains("64"),
            "{problem}"
        );
        // 64 levels are fine as far as parsing goes (the state is then checked by the skill).
        let deep_enough = format!(
            "{{\"skill\": \"warehouse\", \"model\": \"oracle\", \"state\": {{\"a\": {}1{}}}}}",
            "[".repeat(62),
            "]".repeat(62)
        );
        let reply = api
            .send(
                Call::new(Method::POST, "/v1/tasks")
                    .key(&key)
                    .raw("application/json", deep_enough.into_bytes()),
            )
            .await;
        assert_eq!(reply.problem(422)["errors"][0]["kind"], "schema");

        let text = api
            .send(
                Call::new(Method::POST, "/v1/tasks")
                    .key(&key)
                    .raw("text/plain", b"{}".to_vec()),
            )
            .await;
        text.problem(415);

        let unknown_field = api
            .send(
                Call::post(
                    "/v1/tasks",
                    &json!({"skill": "warehouse", "model": "oracle", "colour": 1}),
                )
                .key(&key),
            )
            .await;
        let problem = unknown_field.problem(422);
        assert!(
            problem["detail"].as_str().unwrap().contains("colour"),
            "{problem}"
        );

        let duplicate = api
            .send(Call::new(Method::POST, "/v1/tasks").key(&key).raw(
                "application/json",
                br#"{"skill":"warehouse","skill":"x","model":"oracle"}"#.to_vec(),
            ))
            .await;
        assert_eq!(duplicate.problem(422)["errors"][0]["pointer"], "/skill");

        let bad_state = api
            .send(Call::post("/v1/tasks", &json!({"skill": "warehouse", "model": "oracle", "state": {"shelf_count": "many"}})).key(&key))
            .await;
        let problem = bad_state.problem(422);
        let pointers: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pointer"].as_str().unwrap())
            .collect();
        assert!(pointers.contains(&"/state/shelf_count"), "{problem}");

        let no_skill = api
            .send(
                Call::post(
                    "/v1/tasks",
                    &json!({"skill": "../skills/warehouse", "model": "oracle"}),
                )
                .key(&key),
            )
            .await;
        let problem = no_skill.problem(422);
        assert_eq!(problem["errors"][0]["pointer"], "/skill");
        assert!(
            !problem.to_string().contains(skills_dir().to_str().unwrap()),
            "{problem}"
        );

        let unknown_skill = api
            .send(Call::post("/v1/tasks", &json!({"skill": "nope", "model": "oracle"})).key(&key))
            .await;
        let problem = unknown_skill.problem(422);
        assert!(
            !problem.to_string().contains(skills_dir().to_str().unwrap()),
            "{problem}"
        );

        let route = api.send(Call::get("/v1/nothing").key(&key)).await;
        route.problem(404);
        let method = api
            .send(Call::new(Method::PUT, "/v1/tasks").key(&key))
            .await;
        method.problem(405);
        assert!(method.header("allow").is_some());

        let bad_limit = api.send(Call::get("/v1/tasks?limit=0").key(&key)).await;
        bad_limit.problem(400);
        let bad_status = api
            .send(Call::get("/v1/tasks?status=sleeping").key(&key))
            .await;
        bad_status.problem(400);
        let bad_cursor = api.send(Call::get("/v1/tasks?cursor=x").key(&key)).await;
        bad_cursor.problem(400);
    }
    // Over the socket, a body sent in chunks without Content-Length is cut at the limit too.
    let reply = raw_chunked_post(
        &socket.base,
        "/v1/tasks",
        &key,
        &[vec![b' '; 3000], vec![b' '; 3000]],
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("application/problem+json"), "{reply}");
    socket.stop().await;
}

/// A chunked POST written by hand on a TCP connection; the answer's text (bounded wait).
async fn raw_chunked_post(base: &str, path: &str, key: &str, chunks: &[Vec<u8>]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    // The server may answer and close before reading everything: write errors are expected.
    let _ = stream.write_all(head.as_bytes()).await;
    for chunk in chunks {
        let _ = stream
            .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await;
        let _ = stream.write_all(chunk).await;
        let _ = stream.write_all(b"\r\n").await;
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn idempotency_keys_and_batches() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let (key, _) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;

    let first = api
        .send(
            Call::post("/v1/tasks", &warehouse(2))
                .key(&key)
                .header("idempotency-key", "k1"),
        )
        .await;
    let id = first.expect(201).json()["task"]["id"].clone();
    // The same key for another request is refused, naming the key.
    let mut different = warehouse(2);
    different["skill"] = json!("repository");
    let reused = api
        .send(
            Call::post("/v1/tasks", &different)
                .key(&key)
                .header("idempotency-key", "k1"),
        )
        .await;
    let problem = reused.problem(422);
    assert!(
        problem["detail"].as_str().unwrap().contains("k1"),
        "{problem}"
    );
    // Keys are per tenant: another tenant's k1 is a new task.
    let theirs = api
        .send(
            Call::post("/v1/tasks", &warehouse(2))
                .key(&other)
                .header("idempotency-key", "k1"),
        )
        .await;
    assert_ne!(theirs.expect(201).json()["task"]["id"], id);
    let bad = api
        .send(
            Call::post("/v1/tasks", &warehouse(2))
                .key(&key)
                .header("idempotency-key", "has space"),
        )
        .await;
    bad.problem(400);

    // A batch with one invalid task creates nothing and names each problem under its index.
    let batch = json!({"tasks": [warehouse(2), {"skill": "warehouse", "model": "gpt"}, warehouse(3), {"skill": "warehouse", "model": "oracle", "budget": 0}]});
    let refused = api
        .send(Call::post("/v1/tasks:batch", &batch).key(&key))
        .await;
    let problem = refused.problem(422);
    let pointers: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert_eq!(pointers, ["/tasks/1/model", "/tasks/3/budget"]);
    let listed = api
        .send(Call::get("/v1/tasks").key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);

    let batch = json!({"tasks": [warehouse(2), warehouse(3), warehouse(4)]});
    let made = api
        .send(
            Call::post("/v1/tasks:batch", &batch)
                .key(&key)
                .header("idempotency-key", "b1"),
        )
        .await;
    let made = made.expect(201).json();
    let ids: Vec<Value> = made["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"]["id"].clone())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        made["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["created"] == true)
    );
    let again = api
        .send(
            Call::post("/v1/tasks:batch", &batch)
                .key(&key)
                .header("idempotency-key", "b1"),
        )
        .await;
    let again = again.expect(200).json();
    let again_ids: Vec<Value> = again["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"]["id"].clone())
        .collect();
    assert_eq!(again_ids, ids);
    let empty = api
        .send(Call::post("/v1/tasks:batch", &json!({"tasks": []})).key(&key))
        .await;
    empty.problem(422);

    // Paging: 4 tasks, 3 per page, newest first, no task twice.
    let page = api
        .send(Call::get("/v1/tasks?limit=3").key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 3);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = api
        .send(Call::get(format!("/v1/tasks?limit=3&cursor={cursor}")).key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(rest["tasks"].as_array().unwrap().len(), 1);
    assert!(rest["next_cursor"].is_null());
    assert_eq!(rest["tasks"][0]["id"], id);
    let by_skill = api
        .send(Call::get("/v1/tasks?skill=repository").key(&key))
        .await
        .expect(200)
        .json();
    assert_eq!(by_skill["tasks"], json!([]));
}

#[tokio::test]
async fn a_task_held_by_a_runner_is_not_cancelled_or_deleted_under_it() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let (key, _) = harness.key("acme").await;
    let id = create(&api, &key, &warehouse(2)).await;
    let claim = LeaseClaim {
        token: "worker-token".into(),
        holder: "worker 1".into(),
        process: "elsewhere".into(),
    };
    harness
        .store()
        .acquire_lease(&id, &claim, 60_000, None)
        .await
        .unwrap();

    let cancel = api
        .send(Call::new(Method::POST, format!("/v1/tasks/{id}/cancel")).key(&key))
        .await;
    cancel.problem(409);
    let retry_after: u64 = cancel.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let delete = api
        .send(Call::delete(format!("/v1/tasks/{id}")).key(&key))
        .await;
    delete.problem(409);
    let task = api
        .send(Call::get(format!("/v1/tasks/{id}")).key(&key))
        .await;
    assert_eq!(task.expect(200).json()["status"], "running");

    harness
        .store()
        .release_lease(&id, "worker-token")
        .await
        .unwrap();
    let cancel = api
        .send(Call::new(Method::POST, format!("/v1/tasks/{id}/cancel")).key(&key))
        .await;
    assert_eq!(cancel.expect(200).json()["outcome"]["reason"], "canceled");
    // The server gave its own hold back: a runner can take the task at once.
    harness
        .store()
        .acquire_lease(&id, &claim, 60_000, None)
        .await
        .unwrap();
    harness
        .store()
        .release_lease(&id, "worker-token")
        .await
        .unwrap();
    api.send(Call::delete(format!("/v1/tasks/{id}")).key(&key))
        .await
        .expect(204);
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let reply = api.send(Call::get("/openapi.json")).await;
    assert_eq!(
        reply.expect(200).header("content-type"),
        Some("application/json")
    );
    let doc = reply.json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["components"]["securitySchemes"]["api_key"]["scheme"] == "bearer");
    let mut operation_ids = Vec::new();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 13, "{}", paths.len());
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(
                operation["summary"].as_str().is_some_and(|s| !s.is_empty()),
                "{method} {path}"
            );
            assert!(
                operation["responses"]
                    .as_object()
                    .is_some_and(|r| !r.is_empty()),
                "{method} {path}"
            );
            operation_ids.push(id.to_owned());
            // Every error response is a problem.
            for (status, response) in operation["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert!(
                        response["content"]["application/problem+json"].is_object(),
                        "{method} {path} {status}"
                    );
                }
            }
            // Every documented operation is routed: without a key, /v1 is a 401, never the
            // router's "no such route".
            let concrete = path
                .replace("{id}", &uuid::Uuid::now_v7().to_string())
                .replace("{step}", "1");
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let routed = api
                .send(Call::new(method.clone(), &concrete).json(&json!({})))
                .await;
            if path.starts_with("/v1/") {
                routed.problem(401);
                let secured = operation["security"].as_array().unwrap();
                assert_eq!(secured[0]["api_key"], json!([]), "{method} {path}");
            } else {
                assert!(
                    routed.status.is_success(),
                    "{method} {path}: {}",
                    routed.status
                );
            }
        }
    }
    let count = operation_ids.len();
    operation_ids.sort();
    operation_ids.dedup();
    assert_eq!(operation_ids.len(), count, "operationIds are unique");
    assert!(doc["components"]["schemas"]["Problem"]["properties"]["errors"].is_object());
}

#[tokio::test]
async fn graceful_shutdown_returns_within_the_grace_period() {
    let config = ServerConfig {
        shutdown_grace: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let harness = Harness::with_config(Db::sqlite().await, config);
    let socket = Socket::start(harness.state.clone()).await;
    socket.send(Call::get("/healthz")).await.expect(200);
    let started = std::time::Instant::now();
    socket.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A factory that takes too long, or panics with an internal detail in its message.
struct Misbehaving {
    panic: bool,
}

#[async_trait::async_trait]
impl skillstate_server::TaskFactory for Misbehaving {
    async fn prepare(
        &self,
        _request: &skillstate_server::ResolvedRequest,
    ) -> Result<(skillstate_store::NewTask, Value), skillstate_server::ApiError> {
        if self.panic {
            panic!("internal detail: /srv/secret/path SELECT * FROM api_keys");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        Err(skillstate_server::ApiError::Internal("too late".into()))
    }
}

#[tokio::test]
async fn timeouts_and_panics_are_problems_that_reveal_nothing() {
    let harness = Harness::new(Db::sqlite().await).await;
    let (key, _) = harness.key("acme").await;
    for panic in [false, true] {
        // A panic is reported on the factory's own thread (crate::offload), which may take a
        // while with RUST_BACKTRACE set: the short limit is for the slow factory only.
        let config = ServerConfig {
            request_timeout: if panic {
                Duration::from_secs(20)
            } else {
                Duration::from_millis(200)
            },
            ..ServerConfig::default()
        };
        let state = skillstate_server::AppState::with_config(
            harness.store(),
            std::sync::Arc::new(Misbehaving { panic }),
            config,
        );
        let api = InProcess(skillstate_server::router(state));
        let started = std::time::Instant::now();
        let reply = api
            .send(Call::post("/v1/tasks", &warehouse(2)).key(&key))
            .await;
        if panic {
            let problem = reply.problem(500);
            assert!(!problem.to_string().contains("secret"), "{problem}");
            assert!(!problem.to_string().contains("SELECT"), "{problem}");
        } else {
            let problem = reply.problem(503);
            assert!(
                problem["detail"].as_str().unwrap().contains("longer"),
                "{problem}"
            );
            assert!(started.elapsed() < Duration::from_secs(3));
        }
    }
}

/// Twenty writers race with the same If-Match over real connections: exactly one wins, the
/// others get 412, and the journal has exactly one written step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_with_one_if_match_make_one_step_on_sqlite() {
    concurrent_writes(Db::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_with_one_if_match_make_one_step_on_postgres() {
    if let Some(db) = Db::postgres().await.unwrap() {
        concurrent_writes(db).await;
    }
}

async fn concurrent_writes(db: Db) {
    let harness = Harness::new(db).await;
    let socket = std::sync::Arc::new(Socket::start(harness.state.clone()).await);
    let (key, key_id) = harness.key("acme").await;
    let id = create(socket.as_ref(), &key, &warehouse(2)).await;
    let mut writers = Vec::new();
    for n in 0..20 {
        let socket = socket.clone();
        let (key, id) = (key.clone(), id.clone());
        writers.push(tokio::spawn(async move {
            let body = json!({"inventory": {format!("shelf_{n}"): format!("item_{n}")}});
            socket
                .send(
                    Call::new(Method::PATCH, format!("/v1/tasks/{id}/state"))
                        .key(&key)
                        .header("if-match", "\"0\"")
                        .raw(
                            "application/merge-patch+json",
                            serde_json::to_vec(&body).unwrap(),
                        ),
                )
                .await
        }));
    }
    let mut statuses = Vec::new();
    for writer in writers {
        let reply = writer.await.unwrap();
        if reply.status != 200 {
            reply.problem(412);
        }
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 412).count(),
        19,
        "{statuses:?}"
    );
    let journal = harness.store().journal(&id).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].author.as_deref(), Some(key_id.as_str()));
    let task = harness.store().task(&id).await.unwrap();
    assert_eq!(task.version, 1);
    assert_eq!(task.state["inventory"].as_object().unwrap().len(), 1);
    std::sync::Arc::into_inner(socket).unwrap().stop().await;
    harness.db.destroy().await;
}
