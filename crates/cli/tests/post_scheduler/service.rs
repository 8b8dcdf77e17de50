//! The same orders of events through the service: tasks created with `POST /v1/tasks`, the
//! user's corrections posted to `POST /v1/tasks/{id}/messages`, decisions to
//! `POST /v1/tasks/{id}/approve`. The server serves the API only (`--workers 0`) and a
//! `skillstate worker --until-idle` process runs what is queued between two requests, so which
//! entries wait together in a task's inbox is decided by the test, not by timing.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::common;
use super::{FIRST, MOVE, REQUEST, SECOND, asked, assert_settled, assert_waiting, look, ok, text};

/// A running `skillstate serve` with no embedded worker, killed when dropped.
struct Server {
    child: std::process::Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(db: &Path) -> Server {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(common::binary())
        .current_dir(common::repo_root())
        .env("SKILLSTATE_DB", db)
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--skills",
            "skills",
            "--workers",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("serving ") {
                let base = rest.split_whitespace().next().unwrap_or_default();
                let _ = sender.send(base.to_owned());
            }
        }
    });
    let base = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("the server says where it listens");
    Server { child, base }
}

/// A client of the server with one tenant's key.
struct Api {
    server: Server,
    key: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    db: std::path::PathBuf,
}

impl Api {
    fn start(db: &Path) -> Self {
        let key = ok(
            db,
            &["keys", "create", "--tenant", "acme", "--label", "test"],
        )
        .trim()
        .to_owned();
        let server = serve(db);
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Self {
            server,
            key,
            http,
            runtime: tokio::runtime::Runtime::new().unwrap(),
            db: db.to_owned(),
        }
    }

    /// One request; a success status is required.
    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.server.base))
            .bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.runtime.block_on(async {
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {body}");
            body
        })
    }

    fn create(&self) -> String {
        let created = self.call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(json!({"skill": "post-scheduler", "model": "oracle", "environment": {"request": REQUEST}})),
        );
        created["task"]["id"].as_str().unwrap().to_owned()
    }

    fn message(&self, id: &str, text: &str) {
        let posted = self.call(
            reqwest::Method::POST,
            &format!("/v1/tasks/{id}/messages"),
            Some(json!({"text": text})),
        );
        assert_eq!(posted["delivered_step"], Value::Null, "{posted}");
    }

    fn approve(&self, id: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/tasks/{id}/approve"),
            Some(json!({})),
        );
    }

    /// The task's status as the service reports it.
    fn status(&self, id: &str) -> String {
        let task = self.call(reqwest::Method::GET, &format!("/v1/tasks/{id}"), None);
        task["status"].as_str().unwrap().to_owned()
    }

    /// A worker process runs every queued task until nothing is left to claim.
    fn work(&self) {
        let out = common::skillstate(&self.db, &["worker", "--until-idle"]);
        assert!(
            out.status.success(),
            "worker failed:\n{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn the_service_applies_a_users_message_first_in_every_order() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("service.db");
    let api = Api::start(&db);

    // The correction in the same observation as the request: posted before any worker ran
    // the task, it opens the first step's observation and its date is the one saved.
    let with_request = api.create();
    api.message(&with_request, MOVE);

    // The correction with the approval: the approval posted first, the message after it,
    // both waiting when a worker comes. The message comes first: the old date is not saved.
    let with_approval = api.create();

    // The correction instead of the approval, while the save waits.
    let instead = api.create();

    // The correction after the post was saved and scheduled: the article's follow-up.
    let after = api.create();

    api.work();
    for id in [&with_approval, &instead, &after] {
        assert_eq!(api.status(id), "awaiting_approval");
        assert_waiting(&look(&db, id), &asked("save_post", FIRST, None), None);
    }
    assert_waiting(
        &look(&db, &with_request),
        &asked("save_post", SECOND, None),
        None,
    );
    api.approve(&with_approval);
    api.message(&with_approval, MOVE);
    api.message(&instead, MOVE);
    api.approve(&after);
    api.work();

    for id in [&with_approval, &instead] {
        assert_eq!(api.status(id), "awaiting_approval");
        let seen = look(&db, id);
        assert_waiting(&seen, &asked("save_post", SECOND, None), None);
        assert_eq!(seen.asked[0], asked("save_post", FIRST, Some(false)));
    }
    assert_eq!(api.status(&after), "completed");
    assert_eq!(look(&db, &after).saved[0]["publish_at"], FIRST);
    api.message(&after, MOVE);
    api.work();
    assert_waiting(
        &look(&db, &after),
        &asked("schedule_post", SECOND, None),
        Some(FIRST),
    );

    for id in [&with_request, &with_approval, &instead, &after] {
        api.approve(id);
    }
    api.work();
    for id in [&with_request, &with_approval, &instead, &after] {
        assert_eq!(api.status(id), "completed");
    }
    assert_settled(
        &look(&db, &with_request),
        SECOND,
        &[asked("save_post", SECOND, Some(true))],
    );
    for id in [&with_approval, &instead] {
        assert_settled(
            &look(&db, id),
            SECOND,
            &[
                asked("save_post", FIRST, Some(false)),
                asked("save_post", SECOND, Some(true)),
            ],
        );
    }
    let moved = look(&db, &after);
    assert_settled(
        &moved,
        SECOND,
        &[
            asked("save_post", FIRST, Some(true)),
            asked("schedule_post", SECOND, Some(true)),
        ],
    );

    // What the service shows: each message delivered at the step whose observation it opens,
    // and after the change the old date nowhere in the prompt.
    let messages = api.call(
        reqwest::Method::GET,
        &format!("/v1/tasks/{with_request}/messages"),
        None,
    );
    assert_eq!(messages["messages"][0]["delivered_step"], 1, "{messages}");
    let first = api.call(
        reqwest::Method::GET,
        &format!("/v1/tasks/{with_request}/steps/1/prompt"),
        None,
    );
    let first = first["text"].as_str().unwrap();
    assert!(
        first.contains(&format!(
            "# Latest observation\nMessage from the user: {MOVE}\n\nAdmin panel of "
        )),
        "{first}"
    );
    let prompt = api.call(
        reqwest::Method::GET,
        &format!("/v1/tasks/{after}/steps/{}/prompt", moved.version),
        None,
    );
    let prompt = prompt["text"].as_str().unwrap();
    assert!(prompt.contains(SECOND), "{prompt}");
    assert!(!prompt.contains("2026-10-15"), "{prompt}");
    assert!(!prompt.contains("October 15"), "{prompt}");
}
