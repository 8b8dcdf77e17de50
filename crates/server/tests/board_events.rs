//! A board's writes as Server-Sent Events (`GET /v1/boards/{id}/events`): through the router
//! in-process (tower `oneshot`) and over a real socket on 127.0.0.1, on a SQLite file and on
//! PostgreSQL. What a stream delivers is checked against the journal the API lists: every
//! version once, in order, while writers race; resuming with Last-Event-ID (also on a restarted
//! server over the same database) and `?after=latest`; write-only values redacted; a key
//! limited to board pointers sees versions only; another tenant's board is a 404; malformed
//! positions are 400s; the shutdown event; the stream ends when the board is deleted.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::http::{Method, Request};
use futures_util::StreamExt;
use serde_json::{Value, json};
use skillstate_server::{AppState, ServerConfig, hash_secret, new_key_secret};
use skillstate_store::NewKey;
use support::*;
use tower::ServiceExt;

/// How long a test waits for an event it expects.
const EXPECT: Duration = Duration::from_secs(30);
/// How long a stream must stay silent to count as having nothing more (many poll intervals).
const QUIET: Duration = Duration::from_millis(400);

fn config() -> ServerConfig {
    ServerConfig {
        events_poll: Duration::from_millis(20),
        events_keep_alive: Duration::from_millis(100),
        ..ServerConfig::default()
    }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {"type": "object", "properties": {"goal": {"type": "string"}}},
            "frontend": {"type": "object"},
            "token": {"type": "string", "writeOnly": true},
            "agents": {"type": "object", "additionalProperties": {
                "type": "object", "properties": {"count": {"type": "integer"}}}}
        }
    })
}

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
struct SseEvent {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

impl SseEvent {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

#[derive(Debug)]
enum Next {
    Event(SseEvent),
    End,
    Silent,
}

enum Source {
    InProcess(BodyDataStream),
    Socket(reqwest::Response),
}

/// An open stream, parsed as the SSE specification says.
struct Stream {
    source: Source,
    buffer: Vec<u8>,
    comments: usize,
}

impl Stream {
    fn new(source: Source) -> Self {
        Self {
            source,
            buffer: Vec::new(),
            comments: 0,
        }
    }

    async fn chunk(&mut self) -> Option<Vec<u8>> {
        match &mut self.source {
            Source::InProcess(body) => body.next().await.map(|c| c.unwrap().to_vec()),
            Source::Socket(response) => response.chunk().await.unwrap().map(|c| c.to_vec()),
        }
    }

    async fn next(&mut self, wait: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + wait;
        let mut event = SseEvent {
            id: None,
            event: None,
            data: String::new(),
        };
        let mut fields = 0;
        loop {
            while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                let line = String::from_utf8(line).unwrap();
                if line.is_empty() {
                    if fields > 0 {
                        return Next::Event(event);
                    }
                    continue;
                }
                if line.starts_with(':') {
                    self.comments += 1;
                    continue;
                }
                let (field, value) = match line.split_once(':') {
                    Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                    None => (line.as_str(), ""),
                };
                fields += 1;
                match field {
                    "id" => event.id = Some(value.to_owned()),
                    "event" => event.event = Some(value.to_owned()),
                    "data" => event.data.push_str(value),
                    other => panic!("unexpected SSE field `{other}`"),
                }
            }
            match tokio::time::timeout_at(deadline, self.chunk()).await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => return Next::End,
                Err(_) => return Next::Silent,
            }
        }
    }

    async fn take(&mut self, n: usize) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for _ in 0..n {
            match self.next(EXPECT).await {
                Next::Event(event) => events.push(event),
                other => panic!("expected event {} of {n}, got {other:?}", events.len() + 1),
            }
        }
        events
    }

    async fn expect_quiet(&mut self) {
        match self.next(QUIET).await {
            Next::Silent => {}
            other => panic!("expected nothing more, got {other:?}"),
        }
    }

    async fn expect_end(&mut self) {
        loop {
            match self.next(EXPECT).await {
                Next::End => return,
                Next::Event(event) if event.event.as_deref() == Some("shutdown") => {}
                other => panic!("expected the end of the stream, got {other:?}"),
            }
        }
    }
}

/// Opens `path` through the router with `key` (and `Last-Event-ID`), expecting a stream.
async fn open_in_process(
    router: &axum::Router,
    path: &str,
    key: &str,
    last_event_id: Option<&str>,
) -> Stream {
    let mut request = Request::get(path)
        .header("authorization", format!("Bearer {key}"))
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{path}");
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    Stream::new(Source::InProcess(response.into_body().into_data_stream()))
}

async fn open_socket(base: &str, path: &str, key: &str, last_event_id: Option<&str>) -> Stream {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut request = client
        .get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = tokio::time::timeout(EXPECT, request.send())
        .await
        .expect("the stream's head within the wait")
        .unwrap();
    assert_eq!(response.status(), 200, "{path}");
    Stream::new(Source::Socket(response))
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

async fn create_board(api: &dyn Transport, key: &str, name: &str) -> String {
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({"name": name, "schema": schema(), "initial_state": {"agents": {}}}),
            )
            .key(key),
        )
        .await;
    created.expect(201).json()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Writes `patch` on top of `version`; returns the new version.
async fn write(api: &dyn Transport, key: &str, board: &str, version: u64, patch: Value) -> u64 {
    let reply = api
        .send(
            Call::new(Method::PATCH, format!("/v1/boards/{board}/state"))
                .key(key)
                .header("if-match", &format!("\"{version}\""))
                .raw(
                    "application/merge-patch+json",
                    serde_json::to_vec(&patch).unwrap(),
                ),
        )
        .await;
    reply.expect(200);
    reply
        .header("etag")
        .unwrap()
        .trim_matches('"')
        .parse()
        .unwrap()
}

/// The journal as `GET …/writes` lists it.
async fn journal(api: &dyn Transport, key: &str, board: &str) -> Vec<Value> {
    let page = api
        .send(Call::get(format!("/v1/boards/{board}/writes?limit=1000")).key(key))
        .await;
    page.expect(200).json()["writes"]
        .as_array()
        .unwrap()
        .clone()
}

/// Each event is the journal's row for its version, in order from `first`.
fn assert_journal(events: &[SseEvent], board: &str, journal: &[Value], first: u64) {
    for (offset, event) in events.iter().enumerate() {
        let version = first + offset as u64;
        assert_eq!(event.id.as_deref(), Some(version.to_string().as_str()));
        assert_eq!(event.event.as_deref(), Some("write"));
        let data = event.json();
        assert_eq!(data["board"], board);
        assert_eq!(data["version"], version);
        assert_eq!(
            data["write"],
            journal[version as usize - 1],
            "version {version}"
        );
    }
}

#[tokio::test]
async fn board_events_through_the_router_in_process() {
    let harness = Harness::with_config(Db::sqlite().await, config());
    let router = harness.router();
    let api = InProcess(router.clone());
    let (acme, acme_id) = harness.key("acme").await;
    let (globex, _) = harness.key("globex").await;
    let reader = scoped_key(&harness, "acme", &["/plan", "/frontend"], &["/frontend"]).await;
    let board = create_board(&api, &acme, "release").await;
    let path = format!("/v1/boards/{board}/events");

    let v1 = write(&api, &acme, &board, 0, json!({"plan": {"goal": "ship"}})).await;
    let v2 = write(&api, &acme, &board, v1, json!({"token": "s3cret-value"})).await;
    let v3 = write(
        &api,
        &reader,
        &board,
        v2,
        json!({"frontend": {"done": true}}),
    )
    .await;
    assert_eq!((v1, v2, v3), (1, 2, 3));

    // As every /v1 route: a key is needed; another tenant's board and a malformed id are 404s.
    api.send(Call::get(&path)).await.problem(401);
    api.send(Call::get(&path).key(&globex)).await.problem(404);
    api.send(Call::get("/v1/boards/not-a-board/events").key(&acme))
        .await
        .problem(404);
    // Positions that are not a version of this board.
    for (call, named) in [
        (
            Call::get(&path).key(&acme).header("last-event-id", "abc"),
            "Last-Event-ID",
        ),
        (Call::get(format!("{path}?after=4")).key(&acme), "`after`"),
        (Call::get(format!("{path}?after=-1")).key(&acme), "`after`"),
    ] {
        let problem = api.send(call).await.problem(400);
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(named) && detail.contains("version 3"),
            "{detail}"
        );
    }
    api.send(Call::get(format!("{path}?from=1")).key(&acme))
        .await
        .problem(400);

    // From the first write: each event is the journal's row, write-only values redacted.
    let journal = journal(&api, &acme, &board).await;
    assert_eq!(journal.len(), 3);
    let mut all = open_in_process(&router, &path, &acme, None).await;
    let events = all.take(3).await;
    assert_journal(&events, &board, &journal, 1);
    assert_eq!(events[0].json()["write"]["author"]["key"], acme_id.as_str());
    assert!(events.iter().all(|e| !e.data.contains("s3cret")));
    assert_ne!(events[1].json()["write"]["patch"]["token"], "s3cret-value");
    all.expect_quiet().await;

    // A key limited to board pointers: versions only (it may not read the journal).
    api.send(Call::get(format!("/v1/boards/{board}/writes")).key(&reader))
        .await
        .problem(403);
    let mut limited = open_in_process(&router, &path, &reader, None).await;
    for (n, event) in limited.take(3).await.iter().enumerate() {
        assert_eq!(event.json(), json!({"board": board, "version": n + 1}));
    }

    // From now, and resumed after version 2 (the header wins over `after`).
    let mut latest = open_in_process(&router, &format!("{path}?after=latest"), &acme, None).await;
    latest.expect_quiet().await;
    let mut resumed =
        open_in_process(&router, &format!("{path}?after=latest"), &acme, Some("2")).await;
    let v4 = write(
        &api,
        &acme,
        &board,
        v3,
        json!({"agents": {"a": {"count": 1}}}),
    )
    .await;
    let journal = self::journal(&api, &acme, &board).await;
    assert_journal(&latest.take(1).await, &board, &journal, v4);
    assert_journal(&resumed.take(2).await, &board, &journal, 3);
    assert_journal(&all.take(1).await, &board, &journal, 4);
    let update = limited.take(1).await;
    assert_eq!(update[0].json(), json!({"board": board, "version": 4}));
    resumed.expect_quiet().await;
    assert!(all.comments > 0, "keep-alive comments while idle");

    // The shutdown: every open stream sends `shutdown` and ends.
    harness.state.begin_shutdown();
    for mut stream in [all, limited, latest, resumed] {
        match stream.next(EXPECT).await {
            Next::Event(event) => assert_eq!(event.event.as_deref(), Some("shutdown")),
            other => panic!("expected the shutdown event, got {other:?}"),
        }
        assert!(matches!(stream.next(EXPECT).await, Next::End));
    }
}

#[tokio::test]
async fn board_events_over_a_socket_on_a_sqlite_file() {
    racing_writers(Db::sqlite().await).await;
}

#[tokio::test]
async fn board_events_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    racing_writers(db).await;
}

/// Writers race on one board while streams are open: every version arrives once, in order;
/// a restarted server resumes a stream after any version; a deleted board ends its stream.
async fn racing_writers(db: Db) {
    const WRITERS: u64 = 4;
    const EACH: u64 = 5;
    let harness = Harness::with_config(db, config());
    let (acme, _) = harness.key("acme").await;
    let reader = scoped_key(&harness, "acme", &["/agents/w0"], &["/agents/w0"]).await;
    let socket = Socket::start(harness.state.clone()).await;
    let board = create_board(&socket, &acme, "race").await;
    let path = format!("/v1/boards/{board}/events");
    let mut stream = open_socket(&socket.base, &path, &acme, None).await;
    let mut limited = open_socket(&socket.base, &path, &reader, None).await;
    stream.expect_quiet().await;

    // Each writer writes its own part on top of the version it last saw: stale writes are
    // rebased (the parts are disjoint), none is lost.
    let base = socket.base.clone();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (base, key, board) = (base.clone(), acme.clone(), board.clone());
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut seen = 0u64;
            let mut i = 1;
            while i <= EACH {
                let reply = client
                    .patch(format!("{base}/v1/boards/{board}/state"))
                    .header("authorization", format!("Bearer {key}"))
                    .header("if-match", format!("\"{seen}\""))
                    .header("content-type", "application/merge-patch+json")
                    .body(json!({"agents": {format!("w{w}"): {"count": i}}}).to_string())
                    .send()
                    .await
                    .unwrap();
                match reply.status().as_u16() {
                    200 => {
                        let tag = reply.headers()["etag"].to_str().unwrap();
                        seen = tag.trim_matches('"').parse().unwrap();
                        i += 1;
                    }
                    // The board kept moving through every commit attempt: read it and retry.
                    412 => {
                        let state = client
                            .get(format!("{base}/v1/boards/{board}/state"))
                            .header("authorization", format!("Bearer {key}"))
                            .send()
                            .await
                            .unwrap();
                        let tag = state.headers()["etag"].to_str().unwrap();
                        seen = tag.trim_matches('"').parse().unwrap();
                    }
                    other => panic!("a write failed with {other}"),
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let total = (WRITERS * EACH) as usize;
    let journal = journal(&socket, &acme, &board).await;
    assert_eq!(journal.len(), total);
    let events = stream.take(total).await;
    assert_journal(&events, &board, &journal, 1);
    stream.expect_quiet().await;
    let versions: Vec<Value> = limited
        .take(total)
        .await
        .iter()
        .map(|e| e.json()["version"].clone())
        .collect();
    assert_eq!(versions, (1..=total).map(|v| json!(v)).collect::<Vec<_>>());
    let final_state = socket
        .send(Call::get(format!("/v1/boards/{board}/state")).key(&acme))
        .await
        .json();
    for w in 0..WRITERS {
        assert_eq!(final_state["agents"][format!("w{w}")]["count"], EACH);
    }
    drop((stream, limited));
    socket.stop().await;

    // A restarted server over the same database resumes after any version it sent.
    let state = AppState::with_config(
        harness.db.reopen().await,
        harness.state.factory.clone(),
        config(),
    );
    let socket = Socket::start(state).await;
    let mut resumed = open_socket(&socket.base, &path, &acme, Some("7")).await;
    assert_journal(&resumed.take(total - 7).await, &board, &journal, 8);
    resumed.expect_quiet().await;
    // The board is deleted: its stream ends.
    harness.store().delete_board(&board).await.unwrap();
    resumed.expect_end().await;
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn the_openapi_document_describes_the_board_event_stream() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let document = api.send(Call::get("/openapi.json")).await.json();
    let operation = &document["paths"]["/v1/boards/{id}/events"]["get"];
    assert_eq!(operation["operationId"], "streamBoardEvents");
    assert_eq!(operation["tags"], json!(["events"]));
    let stream = &operation["responses"]["200"]["content"]["text/event-stream"]["schema"];
    assert!(
        stream["properties"]["event"]["enum"]
            .as_array()
            .unwrap()
            .contains(&json!("write")),
        "{stream}"
    );
    let names: Vec<&str> = operation["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["id", "Last-Event-ID", "after"]);
    let view = &document["components"]["schemas"]["BoardEventView"];
    assert_eq!(view["required"], json!(["board", "version"]));
    assert!(view["properties"]["write"].is_object());
}
