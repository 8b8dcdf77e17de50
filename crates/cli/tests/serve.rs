//! `skillstate serve` as a user runs it: a real process on 127.0.0.1 with its embedded workers,
//! a key made by `skillstate keys create`, a task created over HTTP and run to the end, a key
//! revoked while the server runs, SIGTERM shutting it down cleanly.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{binary, repo_root, skillstate};
use serde_json::{Value, json};

/// A running `skillstate serve`, killed if the test fails.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(db: &std::path::Path) -> Server {
    let mut child = Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .args(["serve", "--addr", "127.0.0.1:0", "--skills", "skills"])
        .args(["--workers", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("serving ") {
                let base = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = sender.send(base);
            }
        }
    });
    let base = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("the server says where it listens");
    Server { child, base }
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn new_key(db: &std::path::Path, tenant: &str) -> String {
    let out = skillstate(
        db,
        &["keys", "create", "--tenant", tenant, "--label", "test"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(secret.starts_with("sk_"), "{secret}");
    secret
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_task_runs_to_the_end_and_a_revoked_key_stops_working() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("service.db");
    let key = new_key(&db, "acme");
    let other = new_key(&db, "globex");
    let server = start(&db);
    let http = client();

    let created = http
        .post(format!("{}/v1/tasks", server.base))
        .bearer_auth(&key)
        .json(&json!({"skill": "warehouse", "model": "oracle", "labels": {"team": "ops"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let id = created["task"]["id"].as_str().unwrap().to_owned();

    // The embedded workers run it: wait for the end.
    let deadline = Instant::now() + Duration::from_secs(120);
    let task = loop {
        let task: Value = http
            .get(format!("{}/v1/tasks/{id}", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if task["status"] != "running" {
            break task;
        }
        assert!(Instant::now() < deadline, "the task never finished: {task}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(task["status"], "completed", "{task}");
    let version = task["version"].as_u64().unwrap();
    assert!(version >= 10, "{task}");

    let state = http
        .get(format!("{}/v1/tasks/{id}/state", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(state.status(), 200);
    assert_eq!(
        state.headers()["etag"].to_str().unwrap(),
        format!("\"{version}\"")
    );
    // Another tenant does not see it.
    let foreign = http
        .get(format!("{}/v1/tasks/{id}", server.base))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 404);

    // Revoked while the server runs: refused at once.
    let listed = skillstate(&db, &["keys", "list", "--tenant", "acme"]);
    let key_id = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let revoked = skillstate(&db, &["keys", "revoke", &key_id]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let refused = http
        .get(format!("{}/v1/tasks/{id}", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(
        refused.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );

    // SIGTERM: the server and its workers stop and the process exits 0.
    let mut server = server;
    let pid = server.child.id();
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
}
