//! Helpers for the batch and worker tests: batch files, warehouse inputs with an audit ledger,
//! worker processes, signals and waiting with a deadline.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{binary, warehouse_copy};

/// Runs `skillstate <args>` in `dir` with `config` as its skillstate.toml; SKILLSTATE_DB is
/// unset so a batch file's `store:` applies unless `--db` is given.
pub fn cli(dir: &Path, config: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(dir)
        .env_remove("SKILLSTATE_DB")
        .env("SKILLSTATE_CONFIG", config)
        .env("OPENAI_API_KEY", "sk-batch-test")
        .args(args)
        .output()
        .unwrap()
}

/// Starts `skillstate --db <db> worker <args>` with its output in `log`.
pub fn spawn_worker(
    dir: &Path,
    config: &Path,
    db: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Child {
    let log = std::fs::File::create(log).unwrap();
    let mut command = Command::new(binary());
    command
        .current_dir(dir)
        .env_remove("SKILLSTATE_DB")
        .env("SKILLSTATE_CONFIG", config)
        .env("OPENAI_API_KEY", "sk-batch-test")
        .args(["--db", db, "worker"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(log);
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Fails the test with both streams when `output` did not exit with `code`.
pub fn expect_exit(output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// A warehouse skill copy in `root` and a .jsonl of `tasks` lines, each its own seed with
/// `events` events, all appending effectful calls to `ledger`.
pub fn warehouse_batch(
    root: &Path,
    tasks: usize,
    events: u32,
    ledger: &Path,
) -> (PathBuf, PathBuf) {
    let (skill, _) = warehouse_copy(root, 1, events);
    let inputs = root.join("inputs.jsonl");
    let lines: Vec<String> = (0..tasks)
        .map(|i| {
            json!({
                "environment": {"seed": 100 + i, "events": events, "audit_log": ledger},
                "labels": {"n": i}
            })
            .to_string()
        })
        .collect();
    std::fs::write(&inputs, lines.join("\n") + "\n").unwrap();
    (skill, inputs)
}

/// A submitted warehouse batch on SQLite: `tasks` tasks of `events` events writing `ledger`, an
/// empty skillstate.toml, queued in `root/queue.db` by `skillstate batch submit`.
pub struct SubmittedBatch {
    pub config: PathBuf,
    pub db: String,
    pub batch: String,
    /// The skill directory the batch runs.
    pub skill: PathBuf,
}

/// Writes a warehouse batch file in `root` and submits it (see [`SubmittedBatch`]).
pub fn submit_warehouse_batch(
    root: &Path,
    tasks: usize,
    events: u32,
    ledger: &Path,
) -> SubmittedBatch {
    let db = root.join("queue.db").display().to_string();
    submit_warehouse_batch_to(root, &db, tasks, events, ledger)
}

/// [`submit_warehouse_batch`] into the database `db` (a SQLite path or a PostgreSQL URL).
pub fn submit_warehouse_batch_to(
    root: &Path,
    db: &str,
    tasks: usize,
    events: u32,
    ledger: &Path,
) -> SubmittedBatch {
    let (skill, inputs) = warehouse_batch(root, tasks, events, ledger);
    let config = root.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    std::fs::write(
        root.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: oracle\ninputs: {}\n",
            skill.display(),
            inputs.display()
        ),
    )
    .unwrap();
    let submit = cli(
        root,
        &config,
        &["--db", db, "batch", "submit", "batch.yaml"],
    );
    expect_exit(&submit, 0, "batch submit");
    let batch = text(&submit.stdout).trim().to_owned();
    SubmittedBatch {
        config,
        db: db.to_owned(),
        batch,
        skill,
    }
}

/// The idempotency keys of the ledger's lines, in order.
pub fn ledger_keys(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

/// Every key once.
pub fn assert_no_duplicate(keys: &[String]) {
    let mut seen = std::collections::HashSet::new();
    for key in keys {
        assert!(
            seen.insert(key),
            "effectful call {key} ran twice (ledger has it more than once)"
        );
    }
}

pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} failed");
}

/// Waits for `child` to exit, at most `limit`; kills it and fails the test past that.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `check` until it returns `Some`, at most `limit` (then fails with `what`).
pub async fn wait_for<T>(
    limit: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills every child still running (for test failures).
pub struct Reaper(pub Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A JSON report's `counts`.
pub fn counts(report: &Value) -> (u64, u64, u64) {
    let c = &report["counts"];
    (
        c["total"].as_u64().unwrap(),
        c["completed"].as_u64().unwrap(),
        c["failed"].as_u64().unwrap(),
    )
}

/// The PostgreSQL test server, or `None` (a visible skip) when SKILLSTATE_TEST_POSTGRES_URL=off.
pub fn postgres_url() -> Option<String> {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if url == "off" {
        crate::common::skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
        );
        return None;
    }
    Some(url)
}

/// A fresh schema on `url`; returns the URL that selects it. Drop it with `drop_schema`.
pub async fn fresh_schema(url: &str, name: &str) -> String {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {name} CASCADE"
    )))
    .execute(&mut connection)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
        .execute(&mut connection)
        .await
        .unwrap();
    format!("{url}?options=-c%20search_path%3D{name}")
}

pub async fn drop_schema(url: &str, name: &str) {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {name} CASCADE"
    )))
    .execute(&mut connection)
    .await
    .unwrap();
}
