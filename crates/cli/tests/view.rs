//! `skillstate view` as a user runs it: a real process on 127.0.0.1 that prints the viewer's
//! address, serves the page without a key (under its Content-Security-Policy) and the bench
//! results it was given; a non-loopback address and a file that is not a bench report are
//! refused by name. (The page itself is tested in a real browser by the server's `viewer` test.)
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{binary, repo_root, skillstate};
use serde_json::Value;

struct Viewer {
    child: Child,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_serves_the_page_and_the_bench_results() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("view.db");
    let out = tmp.path().join("bench-out");
    let bench = skillstate(
        &db,
        &[
            "bench",
            "warehouse",
            "--horizons",
            "3",
            "--seeds",
            "1",
            "--strategies",
            "state,history",
            "--jobs",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let results = out.join("results.json");

    let mut child = Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", &db)
        .args(["view", "--addr", "127.0.0.1:0", "--bench"])
        .arg(&results)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let viewer = Viewer { child };
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("web viewer: ") {
                let url = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = sender.send(url);
            }
        }
    });
    let url = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("view prints the viewer's address");
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with('/'),
        "{url}"
    );

    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let page = http.get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"));
    assert!(page.text().await.unwrap().contains("/viewer/app.js"));
    let served: Value = http
        .get(format!("{url}viewer/bench.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let written: Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    assert_eq!(served, written);
    // The API still needs a key.
    let tasks = http.get(format!("{url}v1/tasks")).send().await.unwrap();
    assert_eq!(tasks.status(), 401);
    drop(viewer);

    let public = skillstate(&db, &["view", "--addr", "0.0.0.0:0"]);
    assert!(!public.status.success());
    assert!(String::from_utf8_lossy(&public.stderr).contains("use `skillstate serve`"));
    let wrong = tmp.path().join("not-bench.json");
    std::fs::write(&wrong, "{\"tasks\": []}").unwrap();
    let refused = skillstate(
        &db,
        &[
            "view",
            "--addr",
            "127.0.0.1:0",
            "--bench",
            wrong.to_str().unwrap(),
        ],
    );
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("not-bench.json") && message.contains("not a results.json"),
        "{message}"
    );
}
