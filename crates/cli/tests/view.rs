//! `skillstate view` as a user runs it: a real process on 127.0.0.1 that prints the viewer's
//! address, serves the page without a key (under its Content-Security-Policy) and the bench
//! results it was given; a non-loopback address and a file that is not a bench report are
//! refused by name. Over a database made by `skillstate run`, the link it prints carries a key
//! of that process only: a real headless Chromium opened on it shows the run's task with no key
//! typed, the key never stored and refused once the process is gone. (The page itself is tested
//! at length in a real browser by the server's `viewer` test.)
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../server/tests/viewer_webdriver/mod.rs"]
mod viewer_webdriver;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{binary, repo_root, skillstate};
use serde_json::{Value, json};
use viewer_webdriver::Driver;

/// How long any one thing may take to show in the browser.
const WAIT: Duration = Duration::from_secs(20);

struct Viewer {
    child: Child,
    /// The address on standard error's `web viewer:` line.
    url: String,
    /// The link on standard output (with the process's key in its fragment).
    link: String,
    /// Every line of standard error read so far.
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `skillstate view` on a free port with `args` and waits for its address and link.
fn start_view(db: &Path, args: &[&str]) -> Viewer {
    start_view_logging(db, args, "warn")
}

/// [`start_view`] with `SKILLSTATE_LOG` set to `level`.
fn start_view_logging(db: &Path, args: &[&str], level: &str) -> Viewer {
    let mut child = Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .env("SKILLSTATE_LOG", level)
        .args(["view", "--addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (sender, receiver) = std::sync::mpsc::channel();
    let kept = lines.clone();
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
            kept.lock().unwrap().push(line);
        }
    });
    let (link_sender, link_receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = link_sender.send(line);
        }
    });
    let url = receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("view prints the viewer's address");
    let link = link_receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("view prints the viewer's link on standard output");
    Viewer {
        child,
        url,
        link,
        stderr: lines,
    }
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    target.join("viewer-screenshots")
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

    let viewer = start_view(&db, &["--bench", results.to_str().unwrap()]);
    let url = viewer.url.clone();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with('/'),
        "{url}"
    );
    assert!(
        viewer.link.starts_with(&format!("{url}#key=sk_")),
        "{}",
        viewer.link
    );

    let http = http();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_shows_a_cli_run_through_its_own_key() {
    // The browser first: without Chromium this fails at once, naming the install command.
    let driver = Driver::start().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("run.db");
    let run = skillstate(
        &db,
        &[
            "run",
            "skills/warehouse",
            "--model",
            "scripted:skills/warehouse/examples/demo.jsonl",
        ],
    );
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let listed = skillstate(&db, &["tasks"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let prefix = listed
        .lines()
        .nth(1)
        .and_then(|line| line.split_whitespace().next())
        .unwrap()
        .to_owned();

    let viewer = start_view_logging(&db, &[], "debug");
    let (url, link) = (viewer.url.clone(), viewer.link.clone());
    let key = link
        .strip_prefix(&format!("{url}#key="))
        .unwrap_or_else(|| panic!("{link}"))
        .to_owned();
    assert!(key.starts_with("sk_") && key.len() == 67, "{key}");
    // The key is not in the database.
    let keys = skillstate(&db, &["keys", "list"]);
    assert!(keys.status.success());
    let keys = String::from_utf8_lossy(&keys.stdout).into_owned();
    assert!(!keys.contains("local") && !keys.contains(&key), "{keys}");

    // Through the API: the task of no tenant, with this key.
    let http = http();
    let page: Value = http
        .get(format!("{url}v1/tasks"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = page["tasks"][0]["id"].as_str().unwrap().to_owned();
    assert!(task.starts_with(&prefix), "{task} {prefix}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let version = page["tasks"][0]["version"].as_u64().unwrap();
    assert!(version > 0);

    // In the browser: the link opens the list with the task, no key asked for, and the key
    // is gone from the address bar; the task's page opens from it.
    let browser = driver.session(1400, 1000).await.unwrap();
    let result = async {
        browser.goto(&link).await?;
        browser
            .wait(&format!("#task-table tr[data-task='{task}']"), WAIT)
            .await?;
        assert!(browser.find("#key-input").await?.is_none());
        let address = browser.script("return location.href", json!([])).await?;
        assert_eq!(address, json!(format!("{url}#/")));
        let open = browser
            .wait(
                &format!("#task-table tr[data-task='{task}'] a.task-link"),
                WAIT,
            )
            .await?;
        browser.click(&open).await?;
        let steps = browser.wait("#task-steps", WAIT).await?;
        assert_eq!(browser.text(&steps).await?, version.to_string());
        browser
            .wait("#timeline tr.step[data-step='1']", WAIT)
            .await?;
        browser
            .screenshot(&screenshots().join("view-cli-task.png"))
            .await?;
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        let _ = browser
            .screenshot(&screenshots().join("view-cli-failure.png"))
            .await;
    }
    let _ = browser.quit().await;
    result.unwrap();
    // The key is on standard output only: no line of the debug log (which logged the
    // requests) holds it.
    let log = viewer.stderr.lock().unwrap().join("\n");
    assert!(log.contains("DEBUG"), "debug logging was on: {log}");
    assert!(!log.contains(&key) && !log.contains(&key[3..]), "{log}");

    // The key ends with the process: a new `view` of the same database refuses it, and has
    // a key of its own.
    drop(viewer);
    let again = start_view(&db, &[]);
    assert_ne!(again.link, link);
    let refused = http
        .get(format!("{}v1/tasks", again.url))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
}
