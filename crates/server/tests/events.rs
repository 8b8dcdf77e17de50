//! Live events over Server-Sent Events: a real server on 127.0.0.1 read by a streaming HTTP
//! client (SSE parsed here, line by line), on a SQLite file and on PostgreSQL. A task is run
//! by the runtime with the oracle (as a worker would) while streams are open; what the
//! streams deliver is checked against the store's own events: order, ids, no gap and no
//! duplicate on reconnect with Last-Event-ID, also across a server restart on the same
//! database; tenant isolation; malformed positions; the shutdown event; a deleted task's
//! stream ending. Plus the routes through the router in-process.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use futures_util::StreamExt;
use serde_json::{Value, json};
use skillstate_server::{AppState, ServerConfig, rfc3339};
use skillstate_store::{EventQuery, EventRecord, Store};
use support::*;
use tower::ServiceExt;

/// How long a test waits for an event it expects.
const EXPECT: Duration = Duration::from_secs(30);
/// How long a stream must stay silent to count as having nothing more (many poll intervals).
const QUIET: Duration = Duration::from_millis(400);

fn config() -> ServerConfig {
    ServerConfig {
        events_poll: Duration::from_millis(20),
        ..ServerConfig::default()
    }
}

fn warehouse(seed: u64) -> Value {
    json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": seed, "events": 3}})
}

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
struct SseEvent {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

impl SseEvent {
    fn id(&self) -> &str {
        self.id.as_deref().unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

/// What reading a stream gave.
#[derive(Debug)]
enum Next {
    Event(SseEvent),
    /// The server ended the stream.
    End,
    /// Nothing within the wait.
    Silent,
}

/// An open event stream, parsed as the SSE specification says (fields up to a blank line;
/// `:` lines are comments).
struct Stream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    comments: Vec<String>,
}

async fn open(client: &reqwest::Client, base: &str, path: &str, key: &str) -> reqwest::Response {
    open_after(client, base, path, key, None).await
}

async fn open_after(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    last_event_id: Option<&str>,
) -> reqwest::Response {
    let mut request = client
        .get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    tokio::time::timeout(EXPECT, request.send())
        .await
        .expect("the stream's head within the wait")
        .unwrap()
}

impl Stream {
    fn of(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200, "{path}", path = response.url());
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Self {
            response,
            buffer: Vec::new(),
            comments: Vec::new(),
        }
    }

    async fn open(client: &reqwest::Client, base: &str, path: &str, key: &str) -> Self {
        Self::of(open(client, base, path, key).await)
    }

    async fn resume(
        client: &reqwest::Client,
        base: &str,
        path: &str,
        key: &str,
        last_event_id: &str,
    ) -> Self {
        Self::of(open_after(client, base, path, key, Some(last_event_id)).await)
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
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                let line = String::from_utf8(line).unwrap();
                if line.is_empty() {
                    if fields > 0 {
                        return Next::Event(event);
                    }
                    continue;
                }
                if let Some(comment) = line.strip_prefix(':') {
                    self.comments.push(comment.trim().to_owned());
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
                    "data" => {
                        if !event.data.is_empty() {
                            event.data.push('\n');
                        }
                        event.data.push_str(value);
                    }
                    other => panic!("unexpected SSE field `{other}`"),
                }
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buffer.extend_from_slice(&bytes),
                Ok(Ok(None)) => {
                    assert!(self.buffer.is_empty(), "a partial event at the end");
                    return Next::End;
                }
                Ok(Err(error)) => panic!("reading the stream failed: {error}"),
                Err(_) => return Next::Silent,
            }
        }
    }

    async fn event(&mut self) -> SseEvent {
        match self.next(EXPECT).await {
            Next::Event(event) => event,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    async fn take(&mut self, n: usize) -> Vec<SseEvent> {
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            events.push(self.event().await);
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
        match self.next(EXPECT).await {
            Next::End => {}
            other => panic!("expected the end of the stream, got {other:?}"),
        }
    }
}

/// Every stored event of `tenant` (and `task`) after `after`, read from the store directly.
async fn stored(
    store: &dyn Store,
    tenant: &str,
    task: Option<&str>,
    after: Option<&str>,
) -> Vec<EventRecord> {
    let mut events = Vec::new();
    let mut query = EventQuery {
        tenant: Some(tenant.into()),
        task: task.map(str::to_owned),
        after: after.map(str::to_owned),
        limit: 7,
    };
    loop {
        let page = store.events_after(&query).await.unwrap();
        let Some(last) = page.last() else {
            return events;
        };
        query.after = Some(last.position.clone());
        events.extend(page);
    }
}

/// [`stored`] once at least `n` events are readable. On PostgreSQL an event becomes readable
/// once every transaction older than it has ended, across the whole server (other tests'
/// included), so a read right after a write may not see it yet.
async fn stored_at_least(
    store: &dyn Store,
    tenant: &str,
    after: Option<&str>,
    n: usize,
) -> Vec<EventRecord> {
    let deadline = Instant::now() + EXPECT;
    loop {
        let events = stored(store, tenant, None, after).await;
        if events.len() >= n || Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`stored`] for `task` once its whole run is readable (its last event is the status
/// `completed`; see [`stored_at_least`]).
async fn stored_run(store: &dyn Store, tenant: &str, task: &str) -> Vec<EventRecord> {
    let deadline = Instant::now() + EXPECT;
    loop {
        let events = stored(store, tenant, Some(task), None).await;
        let done = events.last().and_then(|e| e.data.get("status")) == Some(&json!("completed"));
        assert!(
            done || Instant::now() < deadline,
            "the run's events never became readable: {events:?}"
        );
        if done {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The event as the API must deliver it.
fn expected(record: &EventRecord) -> SseEvent {
    SseEvent {
        id: Some(record.position.clone()),
        event: Some(record.kind.as_str().to_owned()),
        data: json!({
            "task": record.task,
            "kind": record.kind.as_str(),
            "step": record.step,
            "data": record.data,
            "created_at": rfc3339(record.created_at),
        })
        .to_string(),
    }
}

fn assert_delivered(got: &[SseEvent], records: &[EventRecord]) {
    assert_eq!(got.len(), records.len());
    for (got, record) in got.iter().zip(records) {
        let want = expected(record);
        assert_eq!(got.id, want.id);
        assert_eq!(got.event, want.event);
        assert_eq!(got.json(), want.json(), "event {}", got.id());
    }
}

/// A position's numbers, for ordering (`7` on SQLite, `<tx>.<id>` on PostgreSQL).
fn position_key(id: &str) -> Vec<u64> {
    id.split('.').map(|n| n.parse().unwrap()).collect()
}

/// A whole run of one task as its stream shows it: `created` first, the final `status`
/// last, ids strictly increasing, every accepted step once and in order.
fn assert_one_run(events: &[SseEvent], task: &str, version: u64) {
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_deref().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"created"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"status"), "{kinds:?}");
    assert!(kinds.contains(&"action"), "{kinds:?}");
    assert_eq!(events.last().unwrap().json()["data"]["status"], "completed");
    for pair in events.windows(2) {
        assert!(
            position_key(pair[0].id()) < position_key(pair[1].id()),
            "{} then {}",
            pair[0].id(),
            pair[1].id()
        );
    }
    let steps: Vec<u64> = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("step"))
        .map(|e| e.json()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=version).collect::<Vec<_>>());
    for event in events {
        let data = event.json();
        assert_eq!(data["task"], task);
        assert_eq!(data["kind"], event.event.as_deref().unwrap());
    }
}

async fn create(api: &dyn Transport, key: &str, body: &Value) -> String {
    let reply = api.send(Call::post("/v1/tasks", body).key(key)).await;
    reply.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn events_over_a_socket_on_a_sqlite_file() {
    scenario(Db::sqlite().await).await;
}

#[tokio::test]
async fn events_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    scenario(db).await;
}

async fn scenario(db: Db) {
    let harness = Harness::with_config(db, config());
    let store = harness.store();
    let (acme, _) = harness.key("acme").await;
    let (globex, _) = harness.key("globex").await;
    let socket = Socket::start(harness.state.clone()).await;
    let base = socket.base.clone();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // A tenant stream opened before anything happened gets the task's events live.
    let mut live = Stream::open(&client, &base, "/v1/events", &acme).await;
    live.expect_quiet().await;
    let id = create(&socket, &acme, &warehouse(21)).await;
    let first = live.event().await;
    assert_eq!(first.event.as_deref(), Some("created"));
    assert_eq!(first.json()["task"], id.as_str());
    run_to_end(store.clone(), &id).await;
    let version = store.task(&id).await.unwrap().version;
    let records = stored_run(store.as_ref(), "acme", &id).await;
    assert!(records.len() >= 6, "{}", records.len());
    let n = records.len();
    let mut events = vec![first];
    events.extend(live.take(n - 1).await);
    assert_delivered(&events, &records);
    assert_one_run(&events, &id, version);
    live.expect_quiet().await;
    drop(live);

    // The task's own stream, from its first event.
    let task_path = format!("/v1/tasks/{id}/events");
    let mut whole = Stream::open(&client, &base, &task_path, &acme).await;
    let all = whole.take(n).await;
    assert_eq!(all, events);
    whole.expect_quiet().await;
    drop(whole);

    // Disconnect after 3 events; reconnect with Last-Event-ID: exactly the rest.
    let mut part = Stream::open(&client, &base, &task_path, &acme).await;
    let head = part.take(3).await;
    drop(part);
    let mut rest = Stream::resume(&client, &base, &task_path, &acme, head[2].id()).await;
    let tail = rest.take(n - 3).await;
    rest.expect_quiet().await;
    drop(rest);
    assert_eq!([head.clone(), tail.clone()].concat(), events);
    // `?after=` does the same; the header wins over it.
    let after_path = format!("{task_path}?after={}", head[2].id());
    let mut by_query = Stream::open(&client, &base, &after_path, &acme).await;
    assert_eq!(by_query.take(n - 3).await, tail);
    by_query.expect_quiet().await;
    drop(by_query);
    let both = format!("{task_path}?after={}", head[0].id());
    let mut header_wins = Stream::resume(&client, &base, &both, &acme, head[2].id()).await;
    assert_eq!(header_wins.event().await, tail[0]);
    drop(header_wins);
    // The last id: nothing more.
    let mut caught_up = Stream::resume(&client, &base, &task_path, &acme, events[n - 1].id()).await;
    caught_up.expect_quiet().await;
    drop(caught_up);

    // Another tenant: the task's stream is the 404 of a missing task, and its own stream
    // shows only its own tasks.
    let foreign = socket
        .send(Call::get(task_path.clone()).key(&globex))
        .await
        .problem(404);
    let missing = uuid::Uuid::now_v7().to_string();
    let absent = socket
        .send(Call::get(format!("/v1/tasks/{missing}/events")).key(&globex))
        .await
        .problem(404);
    assert_eq!(
        foreign["detail"],
        absent["detail"].as_str().unwrap().replace(&missing, &id)
    );
    socket
        .send(Call::get(format!("/v1/tasks/{}/events", &id[..8])).key(&acme))
        .await
        .problem(404);
    let mut theirs = Stream::open(&client, &base, "/v1/events", &globex).await;
    theirs.expect_quiet().await;
    let other = create(&socket, &globex, &warehouse(22)).await;
    let created = theirs.event().await;
    assert_eq!(created.event.as_deref(), Some("created"));
    assert_eq!(created.json()["task"], other.as_str());
    theirs.expect_quiet().await;
    drop(theirs);

    // Malformed positions: 400 problems naming the position and where it came from.
    for bad in ["not-a-position", "7x"] {
        for path in [task_path.as_str(), "/v1/events"] {
            let reply = socket
                .send(Call::get(path).key(&acme).header("last-event-id", bad))
                .await;
            let detail = reply.problem(400)["detail"].as_str().unwrap().to_owned();
            assert!(
                detail.contains(bad) && detail.contains("Last-Event-ID"),
                "{detail}"
            );
            let reply = socket
                .send(Call::get(format!("{path}?after={bad}")).key(&acme))
                .await;
            let detail = reply.problem(400)["detail"].as_str().unwrap().to_owned();
            assert!(
                detail.contains(bad) && detail.contains("`after`"),
                "{detail}"
            );
        }
    }
    socket
        .send(Call::get("/v1/events?from=1").key(&acme))
        .await
        .problem(400);

    // Shutdown: an open stream gets a final `shutdown` event and ends, and the server stops
    // well within its grace period (10 s) instead of waiting on the stream.
    let saved = events[2].id().to_owned();
    let mut open_at_shutdown = Stream::open(&client, &base, "/v1/events", &acme).await;
    assert_eq!(open_at_shutdown.take(n).await, events);
    let stopping = Instant::now();
    socket.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopping.elapsed()
    );
    let last = open_at_shutdown.event().await;
    assert_eq!(last.event.as_deref(), Some("shutdown"));
    assert!(last.id.is_none());
    open_at_shutdown.expect_end().await;

    // Restart: a new server on a new handle of the same database; more happens; resuming
    // from the id saved before the restart gets exactly everything after it.
    let reopened = harness.db.reopen().await;
    let factory = Arc::new(EnvFactory {
        skills_dir: skills_dir(),
    });
    let state = AppState::with_config(reopened.clone(), factory, config());
    let socket = Socket::start(state).await;
    let base = socket.base.clone();
    let second = create(&socket, &acme, &warehouse(23)).await;
    run_to_end(reopened.clone(), &second).await;
    let second_records = stored_run(reopened.as_ref(), "acme", &second).await;
    let later = stored(reopened.as_ref(), "acme", None, Some(&saved)).await;
    assert_eq!(later.len(), n - 3 + second_records.len());
    assert_eq!(later[..n - 3], records[3..]);
    assert_eq!(later[n - 3..], second_records[..]);
    let mut resumed = Stream::resume(&client, &base, "/v1/events", &acme, &saved).await;
    let got = resumed.take(later.len()).await;
    assert_delivered(&got, &later);
    assert_eq!(got[..n - 3], events[3..]);
    resumed.expect_quiet().await;
    drop(resumed);
    let mut task_resumed = Stream::resume(&client, &base, &task_path, &acme, &saved).await;
    assert_eq!(task_resumed.take(n - 3).await, events[3..]);
    task_resumed.expect_quiet().await;
    drop(task_resumed);
    let second_version = reopened.task(&second).await.unwrap().version;
    let mut second_stream =
        Stream::open(&client, &base, &format!("/v1/tasks/{second}/events"), &acme).await;
    let second_events = second_stream.take(second_records.len()).await;
    assert_one_run(&second_events, &second, second_version);

    // Deleting the task ends its stream.
    socket
        .send(Call::delete(format!("/v1/tasks/{second}")).key(&acme))
        .await
        .expect(204);
    second_stream.expect_end().await;
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn the_routes_answer_event_streams_in_process() {
    let config = ServerConfig {
        events_poll: Duration::from_millis(20),
        events_keep_alive: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let harness = Harness::with_config(Db::sqlite().await, config);
    let router = harness.router();
    let api = InProcess(router.clone());
    let (key, _) = harness.key("acme").await;
    let id = create(&api, &key, &warehouse(31)).await;

    // Without a key: 401, as every /v1 route.
    api.send(Call::get("/v1/events")).await.problem(401);
    api.send(Call::get(format!("/v1/tasks/{id}/events")))
        .await
        .problem(401);
    let missing = uuid::Uuid::now_v7().to_string();
    api.send(Call::get(format!("/v1/tasks/{missing}/events")).key(&key))
        .await
        .problem(404);

    let open = |path: String| {
        let router = router.clone();
        let key = key.clone();
        async move {
            let request = Request::get(&path)
                .header("authorization", format!("Bearer {key}"))
                .body(Body::empty())
                .unwrap();
            let response = router.oneshot(request).await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            assert_eq!(
                response.headers()["content-type"].to_str().unwrap(),
                "text/event-stream",
                "{path}"
            );
            assert_eq!(response.headers()["cache-control"], "no-cache");
            response.into_body().into_data_stream()
        }
    };
    let mut streams = Vec::new();
    for path in ["/v1/events".to_owned(), format!("/v1/tasks/{id}/events")] {
        let mut body = open(path.clone()).await;
        // The task's `created` event, then a keep-alive comment while nothing happens.
        let mut text = String::new();
        let deadline = tokio::time::Instant::now() + EXPECT;
        while !text
            .lines()
            .any(|line| line.starts_with(':') && line.contains("keep-alive"))
        {
            let chunk = tokio::time::timeout_at(deadline, body.next())
                .await
                .unwrap_or_else(|_| panic!("{path}: no keep-alive comment within the wait: {text}"))
                .expect("the stream is open")
                .unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert!(text.starts_with("id: "), "{path}: {text}");
        assert!(
            text.contains("event: created\n") && text.contains(&format!("\"task\":\"{id}\"")),
            "{path}: {text}"
        );
        streams.push((path, body));
    }

    // The shutdown starts: every open stream sends its final `shutdown` event and ends.
    harness.state.begin_shutdown();
    for (path, mut body) in streams {
        let mut rest = String::new();
        let deadline = tokio::time::Instant::now() + EXPECT;
        while let Some(chunk) = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("{path}: the stream did not end: {rest}"))
        {
            rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        assert!(rest.contains("event: shutdown\n"), "{path}: {rest}");
        assert!(!rest.contains("event: created"), "{path}: {rest}");
        // A stream opened after the shutdown started ends at once, with the same event.
        let late = open(path.clone()).await;
        let late = tokio::time::timeout(EXPECT, late.collect::<Vec<_>>())
            .await
            .expect("a stream opened after the shutdown ends at once");
        let late: String = late
            .into_iter()
            .map(|chunk| String::from_utf8(chunk.unwrap().to_vec()).unwrap())
            .collect();
        assert!(late.starts_with("event: shutdown\n"), "{path}: {late}");
    }
}

#[tokio::test]
async fn after_latest_starts_from_now_on_a_sqlite_file() {
    after_latest(Db::sqlite().await).await;
}

#[tokio::test]
async fn after_latest_starts_from_now_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    after_latest(db).await;
}

/// `?after=latest`: a stream (the tenant's, or a task's) that reads none of the past, then
/// every later event, exactly as a stream resumed after the last past event would; the
/// `Last-Event-ID` header still wins over it.
async fn after_latest(db: Db) {
    let harness = Harness::with_config(db, config());
    let store = harness.store();
    let (acme, _) = harness.key("acme").await;
    let socket = Socket::start(harness.state.clone()).await;
    let base = socket.base.clone();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // The past: a whole run, readable before the streams open.
    let old = create(&socket, &acme, &warehouse(41)).await;
    run_to_end(store.clone(), &old).await;
    // Wait for the whole run to be readable, so "latest" is after all of it.
    stored_run(store.as_ref(), "acme", &old).await;
    let past = stored(store.as_ref(), "acme", None, None).await;
    assert!(past.len() >= 6, "{}", past.len());
    let last_past = past.last().unwrap().position.clone();

    let mut tenant = Stream::open(&client, &base, "/v1/events?after=latest", &acme).await;
    let mut task = Stream::open(
        &client,
        &base,
        &format!("/v1/tasks/{old}/events?after=latest"),
        &acme,
    )
    .await;
    tenant.expect_quiet().await;
    task.expect_quiet().await;

    // Now: a new task and a message to the old one, seen live and nothing else.
    let new = create(&socket, &acme, &warehouse(42)).await;
    socket
        .send(
            Call::post(
                format!("/v1/tasks/{old}/messages"),
                &json!({"text": "one more thing"}),
            )
            .key(&acme),
        )
        .await
        .expect(202);
    let later = stored_at_least(store.as_ref(), "acme", Some(&last_past), 2).await;
    assert!(later.len() >= 2, "{later:?}");
    let got = tenant.take(later.len()).await;
    assert_delivered(&got, &later);
    assert_eq!(got[0].json()["task"], new.as_str());
    tenant.expect_quiet().await;
    let of_old: Vec<EventRecord> = later.into_iter().filter(|e| e.task == old).collect();
    assert!(!of_old.is_empty());
    let got = task.take(of_old.len()).await;
    assert_delivered(&got, &of_old);
    task.expect_quiet().await;

    // The header wins: resuming after the first past event replays the rest of the past.
    let response = client
        .get(format!("{base}/v1/events?after=latest"))
        .header("authorization", format!("Bearer {acme}"))
        .header("last-event-id", past[0].position.as_str())
        .send()
        .await
        .unwrap();
    let mut resumed = Stream::of(response);
    let got = resumed.take(past.len() - 1).await;
    assert_delivered(&got, &past[1..]);
    drop((tenant, task, resumed));
    socket.stop().await;
    harness.db.destroy().await;
}
