//! `skillstate run` and `skillstate bench` against a fake OpenAI-compatible server on
//! 127.0.0.1 whose answers come from the oracle: the whole path over a real socket, token
//! accounting and cost, and no secret in the database, the output or the errors.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::json;
use support::{FakeServer, Reply, openai_answer};

const SECRET: &str = "sk-e2e-TOPSECRET-9999";

async fn oracle_server() -> FakeServer {
    FakeServer::with_responder(|body| {
        let prompt = format!(
            "{}{}",
            body["messages"][0]["content"].as_str().unwrap_or(""),
            body["messages"][1]["content"].as_str().unwrap_or("")
        );
        let answer = skillstate_envs::oracle::answer("warehouse", &prompt).unwrap();
        Reply::json(200, openai_answer(&answer, "stop"))
    })
    .await
}

async fn cli(dir: &Path, args: Vec<String>) -> Output {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        Command::new(binary())
            .current_dir(repo_root())
            .env("OPENAI_API_KEY", SECRET)
            .env("SKILLSTATE_DB", dir.join("skillstate.db"))
            .env("SKILLSTATE_CONFIG", dir.join("skillstate.toml"))
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// No file in `dir` (the database and its WAL included) and no output contains the key.
fn assert_no_secret(dir: &Path, outputs: &[&Output]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            // A -wal or -shm file SQLite removes as the last connection closes holds nothing.
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => panic!("{}: {error}", path.display()),
            };
            let found = bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes());
            assert!(!found, "the key leaked into {}", path.display());
        }
    }
    for output in outputs {
        assert!(!text(&output.stdout).contains(SECRET) && !text(&output.stderr).contains(SECRET));
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_against_an_openai_compatible_server() {
    let tmp = tempfile::tempdir().unwrap();
    let server = oracle_server().await;
    std::fs::write(
        tmp.path().join("skillstate.toml"),
        "[model]\nmax_tokens = 300\n[prices.\"openai:fake-model\"]\ninput = 2.0\noutput = 8.0\ncached_input = 0.5\n",
    )
    .unwrap();
    let base_url = format!("{}/v1", server.base_url);
    let run = cli(
        tmp.path(),
        args(&[
            "run",
            "skills/warehouse",
            "--model",
            "openai:fake-model",
            "--base-url",
            &base_url,
        ]),
    )
    .await;
    assert!(
        run.status.success(),
        "{}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert!(
        text(&run.stdout).contains("completed after 10 step(s)")
            && text(&run.stdout).contains("score 1.00"),
        "{}",
        text(&run.stdout)
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 10);
    assert!(
        requests
            .iter()
            .all(|r| r.headers["authorization"] == format!("Bearer {SECRET}"))
    );
    assert_eq!(requests[0].body["response_format"]["type"], "json_schema");
    assert_eq!(requests[0].body["max_tokens"], 300);
    let schema = &requests[0].body["response_format"]["json_schema"]["schema"];
    assert_eq!(
        schema["required"],
        json!(["reasoning", "state_patch", "action"])
    );

    let tasks = cli(tmp.path(), args(&["tasks"])).await;
    assert!(text(&tasks.stdout).contains("openai:fake-model"));
    let id = text(&tasks.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let show = cli(tmp.path(), args(&["show", &id])).await;
    let shown = text(&show.stdout);
    // 10 calls × (1200 in, 1024 of them cached, 60 out) at the configured prices.
    assert!(
        shown.contains("provider 12000 in (10240 cached) + 600 out"),
        "{shown}"
    );
    let cost = (1760.0 * 2.0 + 10240.0 * 0.5 + 600.0 * 8.0) / 1_000_000.0;
    assert!(shown.contains(&format!("cost ≈ ${cost:.4}")), "{shown}");
    assert!(
        shown.contains("1200/60"),
        "the per-step table shows provider usage: {shown}"
    );
    assert_no_secret(tmp.path(), &[&run, &tasks, &show]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_key_fails_the_task_with_the_reason_and_no_secret() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    let server = FakeServer::with_replies(vec![Reply::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {SECRET}")}}),
    )])
    .await;

    let base_url = format!("{}/v1", server.base_url);
    let run = cli(
        tmp.path(),
        args(&[
            "run",
            "skills/warehouse",
            "--model",
            "openai:fake-model",
            "--base-url",
            &base_url,
        ]),
    )
    .await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{}\n{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert!(
        text(&run.stdout).contains("failed after 0 step(s)")
            && text(&run.stdout).contains("authentication failed"),
        "{}",
        text(&run.stdout)
    );
    assert!(
        text(&run.stdout).contains("set OPENAI_API_KEY"),
        "{}",
        text(&run.stdout)
    );
    let tasks = cli(tmp.path(), args(&["tasks"])).await;
    let id = text(&tasks.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let show = cli(tmp.path(), args(&["show", &id])).await;
    assert!(
        text(&show.stdout).contains("failed - openai: authentication failed"),
        "{}",
        text(&show.stdout)
    );
    assert_no_secret(tmp.path(), &[&run, &tasks, &show]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bench_takes_a_real_provider_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let server = oracle_server().await;
    std::fs::write(
        tmp.path().join("skillstate.toml"),
        "[prices.\"openai:fake-model\"]\ninput = 1.0\noutput = 1.0\n",
    )
    .unwrap();
    let base_url = format!("{}/v1", server.base_url);
    let out = tmp.path().join("out");
    let bench = cli(
        tmp.path(),
        args(&[
            "bench",
            "warehouse",
            "--horizons",
            "5",
            "--seeds",
            "1",
            "--strategies",
            "state,history",
            "--model",
            "openai:fake-model",
            "--base-url",
            &base_url,
            "--out",
            out.to_str().unwrap(),
        ]),
    )
    .await;
    assert!(bench.status.success(), "{}", text(&bench.stderr));
    let table = text(&bench.stdout);
    assert!(
        table.contains("model openai:fake-model") && table.contains("provider 6.0k+300"),
        "{table}"
    );
    assert!(table.contains("1.00±0.00"), "{table}");
    assert_eq!(
        server.requests().len(),
        10,
        "one request per step of 2 runs of 5 steps; stderr: {}",
        text(&bench.stderr)
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["runs"][0]["provider_usage"]["input_tokens"], 6000);
    assert!(results["groups"][0]["cost_usd"].as_f64().unwrap() > 0.0);
    assert_no_secret(tmp.path(), &[&bench]);
}
