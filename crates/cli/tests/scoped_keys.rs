//! Keys limited to board pointers, as a user makes them: `skillstate keys create --reads …
//! --writes …` checks the scope by the rules of a skill's `[board]` table, `keys list` shows
//! it, and `skillstate serve` enforces it — the key sees only its reads of a board, a write
//! outside its writes is refused with the pointer, other routes are 403.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{binary, repo_root, skillstate};
use serde_json::{Value, json};

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
        .args(["--workers", "0"])
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

fn key(db: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["keys", "create", "--tenant", "acme"];
    all.extend_from_slice(args);
    let out = skillstate(db, &all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limited_to_board_pointers_reads_and_writes_only_those() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("keys.db");
    let full = key(&db, &["--label", "admin"]);
    let limited = key(
        &db,
        &[
            "--label", "api-svc", "--reads", "/plan", "--reads", "/api", "--writes", "/api",
        ],
    );

    // A scope that breaks the rules is refused, naming the entry and the fix.
    let refused = skillstate(
        &db,
        &[
            "keys", "create", "--tenant", "acme", "--reads", "/plan", "--writes", "/api",
        ],
    );
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("--writes #1") && message.contains("/api"),
        "{message}"
    );

    // `keys list` shows each key's scope.
    let listed = skillstate(&db, &["keys", "list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains("SCOPE"), "{listed}");
    assert!(listed.contains("reads /plan /api; writes /api"), "{listed}");

    let server = start(&db);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/v1/boards", server.base))
        .bearer_auth(&full)
        .json(&json!({
            "name": "release-42",
            "schema": {"type": "object"},
            "initial_state": {"plan": {"goal": "ship"}, "api": {"v": 1}, "secret_notes": "x"}
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let state = format!(
        "{}/v1/boards/{}/state",
        server.base,
        created["id"].as_str().unwrap()
    );
    let seen = http.get(&state).bearer_auth(&limited).send().await.unwrap();
    assert_eq!(seen.status(), 200);
    let seen: Value = seen.json().await.unwrap();
    assert_eq!(seen, json!({"plan": {"goal": "ship"}, "api": {"v": 1}}));
    let outside = http
        .patch(&state)
        .bearer_auth(&limited)
        .header("if-match", "\"0\"")
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"plan": {"goal": "mine"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(outside.status(), 422);
    let problem: Value = outside.json().await.unwrap();
    assert_eq!(problem["errors"][0]["pointer"], "/plan");
    assert_eq!(problem["errors"][0]["kind"], "outside_write_scope");
    let inside = http
        .patch(&state)
        .bearer_auth(&limited)
        .header("if-match", "\"0\"")
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"api": {"v": 2}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(inside.status(), 200);
    let tasks = http
        .get(format!("{}/v1/tasks", server.base))
        .bearer_auth(&limited)
        .send()
        .await
        .unwrap();
    assert_eq!(tasks.status(), 403);
}
