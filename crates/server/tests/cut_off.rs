//! A change the server makes under a task's lease (cancel, delete) runs to its end even when
//! its request is cut off while the server holds the lease — the client goes away, or the
//! request times out: the lease is free again at once, not only when the server's hold expires
//! (10 s), and the change happened whole.
//!
//! PostgreSQL makes the moment certain: the test locks the `events` table, which every one of
//! these changes writes (a cancel's status event) or deletes from (a deleted task's events), but
//! which taking the lease does not touch. So the request takes the lease and then waits on the
//! lock; the test sees it waiting (`pg_locks`), cuts the request, and only then lets the change
//! go on. There is no such lock on SQLite, whose writes all wait on the one write lock: taking
//! the lease would wait too.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use skillstate_server::{AppState, ServerConfig};
use skillstate_store::{EventKind, EventQuery, Store, StoreError, TaskStatus};
use sqlx::Connection;
use support::*;
use tokio::io::AsyncWriteExt;

/// How soon the lease must be free once the change may go on: well before the hold's expiry.
const FREED_WITHIN: Duration = Duration::from_secs(3);

/// The request timeout of the server whose requests time out.
const SHORT_TIMEOUT: Duration = Duration::from_millis(400);

#[derive(Debug, Clone, Copy)]
enum Change {
    Cancel,
    Delete,
}

impl Change {
    fn request_line(self, id: &str) -> String {
        match self {
            Change::Cancel => format!("POST /v1/tasks/{id}/cancel"),
            Change::Delete => format!("DELETE /v1/tasks/{id}"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The client closes its connection.
    Disconnect,
    /// The server's request timeout answers 503.
    Timeout,
}

/// The test's lock on the events table, in a transaction of its own.
struct EventsLock(sqlx::PgConnection);

impl EventsLock {
    async fn take(db: &Db) -> Self {
        let mut conn = db.pg_connection().await.unwrap();
        sqlx::raw_sql("BEGIN; LOCK TABLE events IN EXCLUSIVE MODE")
            .execute(&mut conn)
            .await
            .unwrap();
        Self(conn)
    }

    /// Waits until a write waits for this lock.
    async fn wait_for_a_writer(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE relation = 'events'::regclass AND NOT granted",
            )
            .fetch_one(&mut self.0)
            .await
            .unwrap();
            if waiting > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no write came to the events table"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn release(mut self) {
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut self.0)
            .await
            .unwrap();
        self.0.close().await.unwrap();
    }
}

/// Sends `change` of task `id` as raw HTTP/1.1 on a connection of its own, which the caller
/// may drop at any moment.
async fn send_raw(base: &str, key: &str, change: Change, id: &str) -> tokio::net::TcpStream {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "{} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\nContent-Length: 0\r\n\r\n",
        change.request_line(id)
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

/// Reads `stream` to its end: the response's head and body.
async fn read_all(mut stream: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut chunk))
            .await
            .expect("the server answers")
            .unwrap();
        if read == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..read]);
        // One response: the connection stays open (keep-alive), so stop at its end.
        let text = String::from_utf8_lossy(&bytes);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                break;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Waits until nobody holds `id`'s lease (or the task is gone); how long that took.
async fn lease_freed(store: &dyn Store, id: &str) -> Duration {
    let started = Instant::now();
    loop {
        match store.lease(id).await {
            Ok(None) | Err(StoreError::NotFound(_)) => return started.elapsed(),
            Ok(Some(lease)) => {
                assert!(
                    started.elapsed() < FREED_WITHIN,
                    "the server's hold on {id} outlived its cut-off request: {lease:?}"
                );
            }
            Err(other) => panic!("{other}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create(api: &dyn Transport, key: &str) -> String {
    let body =
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 9, "events": 2}});
    let reply = api.send(Call::post("/v1/tasks", &body).key(key)).await;
    reply.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The change was made whole: a cancelled task failed with reason `canceled` and said so in
/// one status event; a deleted one is gone with its events.
async fn made_whole(store: &dyn Store, change: Change, id: &str) {
    match change {
        Change::Cancel => {
            let task = store.task(id).await.unwrap();
            assert_eq!(task.status, TaskStatus::Failed);
            assert_eq!(task.outcome.unwrap()["reason"], "canceled");
            let events = store
                .events_after(&EventQuery {
                    task: Some(id.to_owned()),
                    limit: 100,
                    ..EventQuery::default()
                })
                .await
                .unwrap();
            let statuses: Vec<_> = events
                .iter()
                .filter(|e| e.kind == EventKind::Status)
                .collect();
            assert_eq!(statuses.len(), 1, "{events:?}");
            assert_eq!(statuses[0].data["outcome"]["reason"], "canceled");
        }
        Change::Delete => {
            assert!(
                matches!(store.task(id).await, Err(StoreError::NotFound(_))),
                "task {id} is still there"
            );
            assert_eq!(
                store
                    .events_after(&EventQuery {
                        task: Some(id.to_owned()),
                        limit: 100,
                        ..EventQuery::default()
                    })
                    .await
                    .unwrap(),
                Vec::new()
            );
        }
    }
}

async fn cut_off(harness: &Harness, change: Change, cut: Cut) {
    let (key, _) = harness.key("acme").await;
    let state = match cut {
        Cut::Disconnect => harness.state.clone(),
        Cut::Timeout => AppState::with_config(
            harness.store(),
            Arc::new(EnvFactory {
                skills_dir: skills_dir(),
            }),
            ServerConfig {
                request_timeout: SHORT_TIMEOUT,
                ..ServerConfig::default()
            },
        ),
    };
    let socket = Socket::start(state).await;
    let store = harness.store();
    let id = create(&socket, &key).await;

    let mut lock = EventsLock::take(&harness.db).await;
    let stream = send_raw(&socket.base, &key, change, &id).await;
    lock.wait_for_a_writer().await;
    // The change waits on the lock, the server's hold taken.
    let lease = store
        .lease(&id)
        .await
        .unwrap()
        .expect("the server holds the task");
    assert!(lease.holder.contains("skillstate server"), "{lease:?}");
    match cut {
        Cut::Disconnect => {
            drop(stream);
            // Time for the server to see the connection closed and drop the request.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Cut::Timeout => {
            let response = read_all(stream).await;
            assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        }
    }
    // The request is gone; the lease is still held while the change waits.
    assert!(store.lease(&id).await.unwrap().is_some());
    lock.release().await;

    let took = lease_freed(store.as_ref(), &id).await;
    eprintln!(
        "{change:?} cut by {cut:?}: the lease was free {took:?} after the change could go on"
    );
    made_whole(store.as_ref(), change, &id).await;
    socket.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_cancel_or_delete_finishes_and_frees_the_lease_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    for change in [Change::Cancel, Change::Delete] {
        for cut in [Cut::Disconnect, Cut::Timeout] {
            cut_off(&harness, change, cut).await;
        }
    }
    harness.db.destroy().await;
}
