//! Every status a route answers is in the OpenAPI document, for that operation. The test walks
//! every operation of the served document and provokes what the layers and extractors answer —
//! a body over the limit (413, on every route: the limit layer reads Content-Length first), no
//! key (401 on every /v1 route), a key limited to board pointers (403 off /v1/boards), the
//! local key of `skillstate view` creating something (403), bodies that are not JSON (415),
//! malformed or too deep (400) or of the wrong shape (422), query strings that do not fit —
//! and then calls every route on a real task and board with a plain body. Each answer's
//! status must be documented for the operation it reached. Through the router (tower
//! `oneshot`) and, for the layers' statuses, over a real socket on 127.0.0.1.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use skillstate_server::{ServerConfig, hash_secret, new_key_secret};
use skillstate_store::NewKey;
use support::*;
use tower::ServiceExt;

/// The body limit of these tests: small, so an oversized body is cheap to send.
const LIMIT: usize = 4096;

/// One operation of the document.
#[derive(Debug, Clone)]
struct Operation {
    method: Method,
    path: String,
    id: String,
    documented: BTreeSet<u16>,
    has_body: bool,
    has_query: bool,
}

impl Operation {
    fn is_v1(&self) -> bool {
        self.path.starts_with("/v1/")
    }

    fn is_board_route(&self) -> bool {
        self.path == "/v1/boards" || self.path.starts_with("/v1/boards/")
    }

    fn creates(&self) -> bool {
        self.method == Method::POST
            && matches!(
                self.path.as_str(),
                "/v1/tasks" | "/v1/tasks:batch" | "/v1/boards"
            )
    }

    /// The path with its parameters filled in.
    fn concrete(&self, ids: &Ids) -> String {
        let id = if self.path.starts_with("/v1/boards/") {
            &ids.board
        } else if self.path.starts_with("/v1/batches/") {
            &ids.batch
        } else {
            &ids.task
        };
        self.path
            .replace("{id}", id)
            .replace("{step}", "1")
            .replace("{version}", "0")
    }

    fn assert_documented(&self, status: StatusCode, what: &str) {
        assert!(
            self.documented.contains(&status.as_u16()),
            "{} {} ({}) answered {status} to {what}, which its documented responses {:?} do not list",
            self.method,
            self.path,
            self.id,
            self.documented
        );
    }
}

/// Every operation of `doc`.
fn operations(doc: &Value) -> Vec<Operation> {
    let mut all = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            let documented = operation["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .map(|status| status.parse::<u16>().expect("a numeric status"))
                .collect();
            let has_query = operation["parameters"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
            all.push(Operation {
                method: Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method"),
                path: path.clone(),
                id: operation["operationId"].as_str().unwrap_or("").to_owned(),
                documented,
                has_body: operation["requestBody"].is_object(),
                has_query,
            });
        }
    }
    // Deletions last: the real task and board stay for every other call.
    all.sort_by_key(|op| op.method == Method::DELETE);
    all
}

/// A request to send: headers and a body.
struct Send {
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Send {
    fn new() -> Self {
        Self {
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    fn key(mut self, secret: &str) -> Self {
        self.headers
            .push(("authorization", format!("Bearer {secret}")));
        self
    }

    fn if_match(mut self) -> Self {
        self.headers.push(("if-match", "\"0\"".to_owned()));
        self
    }

    fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        self.headers.push(("content-type", content_type.to_owned()));
        self.body = body.into();
        self
    }
}

/// The status of one request through the router; the body of a success is never read (an
/// event stream does not end).
async fn status_of(router: &axum::Router, method: &Method, uri: &str, send: Send) -> StatusCode {
    let mut request = Request::builder().method(method.clone()).uri(uri);
    for (name, value) in &send.headers {
        request = request.header(*name, value);
    }
    if !send.body.is_empty() {
        // As a client over a socket declares it.
        request = request.header("content-length", send.body.len());
    }
    let request = request.body(Body::from(send.body)).expect("a request");
    let response = tokio::time::timeout(Duration::from_secs(30), router.clone().oneshot(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {uri} did not answer within 30 s"))
        .expect("the router is infallible");
    response.status()
}

/// The status of one request over a real socket; a success's body is dropped unread.
async fn socket_status(
    client: &reqwest::Client,
    base: &str,
    method: &Method,
    path: &str,
    send: Send,
) -> StatusCode {
    let mut request = client.request(method.clone(), format!("{base}{path}"));
    for (name, value) in &send.headers {
        request = request.header(*name, value);
    }
    let response = request
        .body(send.body)
        .send()
        .await
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
    response.status()
}

/// JSON nested `depth` levels.
fn deep_json(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

struct Keys {
    tenant: String,
    scoped: String,
    local: String,
}

async fn keys(harness: &Harness) -> Keys {
    let (tenant, _) = harness.key("acme").await;
    let scoped = new_key_secret();
    harness
        .store()
        .create_key(&NewKey {
            tenant: "acme".into(),
            label: "board pointers only".into(),
            secret_hash: hash_secret(&scoped),
            scopes: Some(json!({"board": {"reads": ["/plan"], "writes": ["/plan"]}})),
        })
        .await
        .expect("a scoped key");
    Keys {
        tenant,
        scoped,
        local: new_key_secret(),
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        body_limit: LIMIT,
        ..ServerConfig::default()
    }
}

/// What the paths' parameters name.
struct Ids {
    task: String,
    board: String,
    batch: String,
}

impl Ids {
    fn missing() -> Self {
        let id = uuid::Uuid::now_v7().to_string();
        Self {
            task: id.clone(),
            board: id.clone(),
            batch: id,
        }
    }
}

/// A task (in a batch) and a board of the tenant, through the API.
async fn real_ids(router: &axum::Router, key: &str) -> Ids {
    let api = InProcess(router.clone());
    let created = api
        .send(
            Call::post(
                "/v1/tasks:batch",
                &json!({"tasks": [{"skill": "warehouse", "model": "oracle", "environment": {"seed": 3, "events": 2}}]}),
            )
            .key(key),
        )
        .await;
    let created = created.expect(201).json();
    let task = created["tasks"][0]["task"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("a task id in {created}"))
        .to_owned();
    let batch = created["batch"]
        .as_str()
        .unwrap_or_else(|| panic!("a batch id in {created}"))
        .to_owned();
    let board = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": "plans", "schema": {"type": "object"}, "initial_state": {"plan": {}}}),
            )
            .key(key),
        )
        .await;
    let board = board.expect(201).json()["id"]
        .as_str()
        .expect("a board id")
        .to_owned();
    Ids { task, board, batch }
}

async fn the_document(router: &axum::Router) -> Value {
    InProcess(router.clone())
        .send(Call::get("/openapi.json"))
        .await
        .expect(200)
        .json()
}

#[tokio::test]
async fn every_status_the_router_answers_is_documented_for_its_operation() {
    let harness = Harness::with_config(Db::sqlite().await, config());
    let keys = keys(&harness).await;
    let state = harness.state.clone().with_local_key(&keys.local);
    let router = skillstate_server::router(state);
    let doc = the_document(&router).await;
    let operations = operations(&doc);
    assert!(operations.len() >= 40, "{} operations", operations.len());
    let real = real_ids(&router, &keys.tenant).await;
    let missing = Ids::missing();
    let mut seen = BTreeSet::new();
    for op in &operations {
        for (ids, exists) in [(&missing, false), (&real, true)] {
            let uri = op.concrete(ids);
            let call = |send: Send| status_of(&router, &op.method, &uri, send);

            // The body limit: a declared length past it is refused on every route.
            let status = call(
                Send::new()
                    .key(&keys.tenant)
                    .body("application/json", format!("\"{}\"", "x".repeat(LIMIT))),
            )
            .await;
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{} {uri}", op.method);
            op.assert_documented(status, "a body over the limit");

            // No key.
            let status = call(Send::new()).await;
            if op.is_v1() {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{} {uri}", op.method);
            }
            op.assert_documented(status, "no key");
            let status = call(Send::new().key("sk_not_a_key")).await;
            op.assert_documented(status, "an unknown key");

            // A key limited to board pointers, and the local key of `skillstate view`.
            let status = call(Send::new().key(&keys.scoped).body("application/json", "{}")).await;
            if op.is_v1() && !op.is_board_route() {
                assert_eq!(status, StatusCode::FORBIDDEN, "{} {uri}", op.method);
            }
            op.assert_documented(status, "a key limited to board pointers");
            let status = call(Send::new().key(&keys.local).body("application/json", "{}")).await;
            if op.creates() {
                assert_eq!(status, StatusCode::FORBIDDEN, "{} {uri}", op.method);
            }
            op.assert_documented(status, "the local key");

            // Bodies that are not what a route reads.
            // With the If-Match the PATCH routes want first, so they go on to the body.
            let status = call(
                Send::new()
                    .key(&keys.tenant)
                    .if_match()
                    .body("text/plain", "hello"),
            )
            .await;
            if op.has_body && exists {
                assert_eq!(
                    status,
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "{} {uri}",
                    op.method
                );
            }
            op.assert_documented(status, "a text/plain body");
            for (what, content_type, body) in [
                ("malformed JSON", "application/json", "{".to_owned()),
                ("too deep JSON", "application/json", deep_json(200)),
                (
                    "an unknown member",
                    "application/json",
                    r#"{"no_such_member": 1}"#.to_owned(),
                ),
                ("a JSON array", "application/json", "[]".to_owned()),
                ("an empty object", "application/json", "{}".to_owned()),
                (
                    "an empty merge patch",
                    "application/merge-patch+json",
                    "{}".to_owned(),
                ),
                (
                    "an empty JSON Patch",
                    "application/json-patch+json",
                    "[]".to_owned(),
                ),
                (
                    "a malformed merge patch",
                    "application/merge-patch+json",
                    "{".to_owned(),
                ),
                (
                    "a malformed JSON Patch",
                    "application/json-patch+json",
                    "{".to_owned(),
                ),
                ("no body", "application/json", String::new()),
            ] {
                let status = call(
                    Send::new()
                        .key(&keys.tenant)
                        .if_match()
                        .body(content_type, body),
                )
                .await;
                if op.has_body && exists && (what == "malformed JSON" || what == "too deep JSON") {
                    // 415 from a route that reads another JSON media type (a PATCH's).
                    assert!(
                        matches!(status.as_u16(), 400 | 415),
                        "{what}: {} {uri}: {status}",
                        op.method
                    );
                }
                op.assert_documented(status, what);
            }
            let status = status_of(&router, &op.method, &uri, Send::new().key(&keys.tenant)).await;
            op.assert_documented(status, "no body at all");
            let mut stale = Send::new().key(&keys.tenant);
            stale.headers.push(("if-match", "\"99\"".to_owned()));
            let status = call(stale.body("application/merge-patch+json", "{}")).await;
            op.assert_documented(status, "a stale If-Match");

            // Query strings that do not fit.
            for query in [
                "?limit=many&after=%ZZ&order=sideways",
                "?limit=0",
                "?limit=100000000000000000000",
                "?after=-1&step=x&pointer=nowhere",
                "?q=&kind=nothing",
            ] {
                let status = status_of(
                    &router,
                    &op.method,
                    &format!("{uri}{query}"),
                    Send::new().key(&keys.tenant).body("application/json", "{}"),
                )
                .await;
                op.assert_documented(status, query);
                if op.has_query && query.starts_with("?limit=many") {
                    assert!(
                        status.is_client_error(),
                        "{} {uri}{query}: {status}",
                        op.method
                    );
                }
            }
            seen.insert((op.method.clone(), op.path.clone()));
        }
    }
    assert_eq!(seen.len(), operations.len());
    harness.db.destroy().await;
}

#[tokio::test]
async fn the_layers_statuses_over_a_socket_are_documented() {
    let harness = Harness::with_config(Db::sqlite().await, config());
    let (key, _) = harness.key("acme").await;
    let socket = Socket::start(harness.state.clone()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a client");
    let doc: Value = client
        .get(format!("{}/openapi.json", socket.base))
        .send()
        .await
        .expect("the document")
        .json()
        .await
        .expect("JSON");
    let missing = Ids::missing();
    for op in operations(&doc) {
        let path = op.concrete(&missing);
        let status = socket_status(
            &client,
            &socket.base,
            &op.method,
            &path,
            Send::new()
                .key(&key)
                .body("application/json", vec![b' '; LIMIT + 1]),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{} {path}",
            op.method
        );
        op.assert_documented(status, "a body over the limit");
        let status = socket_status(&client, &socket.base, &op.method, &path, Send::new()).await;
        if op.is_v1() {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{} {path}", op.method);
        }
        op.assert_documented(status, "no key");
    }
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn fork_and_approve_document_the_body_limit() {
    // The two operations that answered 413 without saying so.
    let harness = Harness::with_config(Db::sqlite().await, config());
    let router = harness.router();
    let doc = the_document(&router).await;
    for (path, method) in [
        ("/v1/tasks/{id}/fork", "post"),
        ("/v1/tasks/{id}/approve", "post"),
    ] {
        let response = &doc["paths"][path][method]["responses"]["413"];
        assert!(
            response["content"]["application/problem+json"]["schema"]["$ref"]
                .as_str()
                .is_some_and(|r| r.ends_with("/Problem")),
            "{method} {path}: {response}"
        );
    }
    harness.db.destroy().await;
}

#[tokio::test]
async fn timeouts_and_panics_are_documented_everywhere() {
    // 503 and 500 are the timeout and panic layers' answers (provoked in guards.rs); every
    // operation lists both.
    let harness = Harness::with_config(Db::sqlite().await, config());
    let doc = the_document(&harness.router()).await;
    for op in operations(&doc) {
        for status in [500, 503, 413] {
            assert!(
                op.documented.contains(&status),
                "{} {}: {status}",
                op.method,
                op.path
            );
        }
    }
    harness.db.destroy().await;
}
