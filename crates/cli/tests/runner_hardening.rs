//! Real `skillstate` processes against real SQLite files: one runner per task (execution
//! leases), a journal with a missing step, failures worth retrying, and secrets echoed by a
//! model server. Each test is named after the defect class it closes.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous};
use support::{FakeServer, Reply, openai_answer};

const SECRET: &str = "sk-hardening-SECRET-31337";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn command(dir: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .current_dir(repo_root())
        .env("OPENAI_API_KEY", SECRET)
        .env("SKILLSTATE_DB", dir.join("skillstate.db"))
        .env("SKILLSTATE_CONFIG", dir.join("skillstate.toml"))
        .env_remove("SKILLSTATE_FAILPOINT");
    command
}

async fn cli(dir: &Path, args: &[&str]) -> Output {
    let mut command = command(dir);
    command.args(args);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

async fn store(dir: &Path) -> SqliteStore {
    SqliteStore::open(
        dir.join("skillstate.db").to_str().unwrap(),
        Synchronous::Full,
    )
    .await
    .unwrap()
}

async fn only_task(dir: &Path) -> String {
    store(dir).await.list_tasks().await.unwrap()[0].id.clone()
}

type Outage = Arc<dyn Fn(usize) -> bool + Send + Sync>;

/// A fake OpenAI-compatible server answering like the warehouse oracle, each answer after
/// `delay`, or with HTTP 503 while `down(call number)` says so.
async fn oracle_server(delay: Duration, down: Outage) -> FakeServer {
    let calls = AtomicUsize::new(0);
    FakeServer::with_responder(move |body| {
        if down(calls.fetch_add(1, Ordering::SeqCst)) {
            return Reply::json(503, json!({"error": {"message": "overloaded"}}));
        }
        let prompt = format!(
            "{}{}",
            body["messages"][0]["content"].as_str().unwrap_or(""),
            body["messages"][1]["content"].as_str().unwrap_or("")
        );
        let answer = skillstate_envs::oracle::answer("warehouse", &prompt).unwrap();
        Reply::json(200, openai_answer(&answer, "stop")).delayed(delay)
    })
    .await
}

/// `run <skill>` against the fake model server at `base_url`.
fn run_args<'a>(skill: &'a Path, base_url: &'a str) -> [&'a str; 7] {
    [
        "run",
        skill.to_str().unwrap(),
        "--model",
        "openai:fake",
        "--base-url",
        base_url,
        "--quiet",
    ]
}

/// Waits (bounded) until `check` holds, polling the database.
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a scripted warehouse task (a copy under `root` with `seed` and `events`) that SIGKILLs
/// itself at `failpoint`, in the database of `dir`.
fn killed_run(dir: &Path, root: &Path, (seed, events): (u64, u32), failpoint: &str) {
    let (skill, script) = warehouse_copy(root, seed, events);
    let model = format!("scripted:{}", script.display());
    let killed = command(dir)
        .args(["run", skill.to_str().unwrap(), "--model", &model, "--quiet"])
        .env("SKILLSTATE_FAILPOINT", failpoint)
        .output()
        .unwrap();
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "the run dies at {failpoint}"
    );
}

fn finish(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runner_per_task_a_second_process_is_refused_while_the_first_runs() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    let (skill, _) = warehouse_copy(tmp.path(), 5, 6);
    let server = oracle_server(Duration::from_millis(700), Arc::new(|_| false)).await;
    let base_url = format!("{}/v1", server.base_url);
    let first = command(tmp.path())
        .args(run_args(&skill, &base_url))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Mid-step: the task exists, holds a lease, and step 2's model call is in flight.
    let dir = tmp.path().to_path_buf();
    wait_for("the first run to be mid-task", || {
        let dir = dir.clone();
        async move {
            if !dir.join("skillstate.db").exists() {
                return false;
            }
            let store = store(&dir).await;
            let Some(task) = store.list_tasks().await.unwrap().first().cloned() else {
                return false;
            };
            task.version >= 1 && store.lease(&task.id).await.unwrap().is_some()
        }
    })
    .await;
    let id = only_task(tmp.path()).await;
    for args in [
        vec!["resume", id.as_str()],
        vec!["resume", id.as_str(), "--retry"],
        vec!["reply", id.as_str(), "hello"],
        vec!["approve", id.as_str()],
    ] {
        let second = cli(tmp.path(), &args).await;
        let stderr = text(&second.stderr);
        assert_eq!(second.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("is being run by `skillstate run` (pid")
                && stderr.contains("since")
                && stderr.contains("only one process may drive a task"),
            "{args:?}: {stderr}"
        );
    }

    let first = finish(first);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(text(&first.stdout).contains("completed after 6 step(s)"));
    // Nothing the refused processes did touched the journal; the lease is given back.
    let replay = cli(tmp.path(), &["replay", &id]).await;
    assert!(replay.status.success(), "{}", text(&replay.stdout));
    assert_eq!(store(tmp.path()).await.lease(&id).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runner_per_task_takes_over_from_a_dead_holder_at_once_and_from_a_live_one_after_expiry()
 {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    killed_run(tmp.path(), tmp.path(), (9, 12), "after_commit:4");
    let id = only_task(tmp.path()).await;
    let lease = store(tmp.path()).await.lease(&id).await.unwrap();
    assert!(
        lease.is_some_and(|l| l.holder.contains("skillstate run")),
        "the killed run left its lease behind"
    );
    // Its holder is a dead process of this machine: resume takes over at once.
    let resumed = cli(tmp.path(), &["resume", &id]).await;
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(text(&resumed.stdout).contains("completed after 12 step(s)"));

    // A holder this machine cannot check (another host) blocks until its lease expires.
    killed_run(tmp.path(), &tmp.path().join("b"), (9, 12), "after_tool:3");
    let store = store(tmp.path()).await;
    let second = store.list_tasks().await.unwrap()[1].id.clone();
    let far_future = 4_102_444_800_000_i64; // 2100-01-01
    sqlx::query(
        "UPDATE tasks SET lease_holder = '`skillstate worker` (pid 77 on other-host)', lease_process = 'linux other-boot pid:[1] 77 1', lease_expires_at = ? WHERE id = ?",
    )
    .bind(far_future)
    .bind(&second)
    .execute(store.pool())
    .await
    .unwrap();
    let refused = cli(tmp.path(), &["resume", &second]).await;
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`skillstate worker` (pid 77 on other-host)")
            && stderr.contains("2100-01-01"),
        "{stderr}"
    );
    // Once it has expired, anyone may take the task over.
    sqlx::query("UPDATE tasks SET lease_expires_at = 1 WHERE id = ?")
        .bind(&second)
        .execute(store.pool())
        .await
        .unwrap();
    let resumed = cli(tmp.path(), &["resume", &second]).await;
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_continuity_a_missing_step_stops_resume_and_shows_in_show() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    killed_run(tmp.path(), tmp.path(), (4, 10), "after_tool:5");
    let id = only_task(tmp.path()).await;
    let store = store(tmp.path()).await;
    sqlx::query("DELETE FROM journal WHERE task_id = ? AND step = 2")
        .bind(&id)
        .execute(store.pool())
        .await
        .unwrap();
    let before = store.task(&id).await.unwrap();

    let resumed = cli(tmp.path(), &["resume", &id]).await;
    let stderr = text(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("inconsistent at step 2") && stderr.contains("no accepted journal entry"),
        "{stderr}"
    );
    let after = store.task(&id).await.unwrap();
    assert_eq!(
        (after.version, after.state.clone()),
        (before.version, before.state)
    );

    let show = cli(tmp.path(), &["show", &id]).await;
    assert_eq!(show.status.code(), Some(1));
    let stdout = text(&show.stdout);
    let missing_row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap_or_default();
    assert!(missing_row.contains("MISSING"), "{stdout}");
    assert!(
        text(&show.stderr).contains("step 2"),
        "{}",
        text(&show.stderr)
    );

    // A stored current state that is not the one the last step recorded is refused too.
    sqlx::query("UPDATE tasks SET state = '{\"inventory\": {}}' WHERE id = ?")
        .bind(&id)
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at) SELECT task_id, 2, attempt, verdict, output, patch, action, errors, state_hash, prompt_tokens, prompt_hash, usage, latency_ms, created_at FROM journal WHERE task_id = ? AND step = 3",
    )
    .bind(&id)
    .execute(store.pool())
    .await
    .unwrap();
    let resumed = cli(tmp.path(), &["resume", &id]).await;
    let stderr = text(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stored current state"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_failure_a_provider_outage_is_resumable_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("skillstate.toml"),
        "[model]\nmax_retries = 0\n",
    )
    .unwrap();
    let (skill, _) = warehouse_copy(tmp.path(), 2, 5);
    // The server answers two calls, then is down until `restored`.
    let restored = Arc::new(AtomicBool::new(false));
    let flag = restored.clone();
    let server = oracle_server(
        Duration::ZERO,
        Arc::new(move |call| call >= 2 && !flag.load(Ordering::SeqCst)),
    )
    .await;
    let base_url = format!("{}/v1", server.base_url);
    let run = cli(tmp.path(), &run_args(&skill, &base_url)).await;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let id = only_task(tmp.path()).await;

    // A plain resume does nothing, says how to retry, and fails.
    let plain = cli(tmp.path(), &["resume", &id]).await;
    assert_eq!(plain.status.code(), Some(1));
    assert!(
        text(&plain.stderr).contains(&format!("skillstate resume {id} --retry")),
        "{}",
        text(&plain.stderr)
    );
    // The server is back: the retry continues from the journal and completes.
    restored.store(true, Ordering::SeqCst);
    let retried = cli(
        tmp.path(),
        &["resume", &id, "--retry", "--base-url", &base_url],
    )
    .await;
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    assert!(
        text(&retried.stdout).contains("completed after 5 step(s)"),
        "{}",
        text(&retried.stdout)
    );
    // A completed task has nothing to resume: non-zero, with the reason.
    let again = cli(tmp.path(), &["resume", &id]).await;
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("nothing to resume: the task is completed"));
    let retry_done = cli(tmp.path(), &["resume", &id, "--retry"]).await;
    assert_eq!(retry_done.status.code(), Some(1));
    assert!(
        text(&retry_done.stderr).contains("failed tasks only"),
        "{}",
        text(&retry_done.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_failure_exhausted_rejections_get_a_fresh_budget() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 6, 4);
    // Step 1: three unusable answers (the default budget), then the right ones.
    let good = std::fs::read_to_string(&script).unwrap();
    // (A scripted line is a JSON string holding the raw model text.)
    let bad = [
        "not json at all",
        "{\"reasoning\": 1}",
        "{\"state_patch\": {}, \"action\": {\"tool\": \"nope\"}}",
    ]
    .map(|raw| format!("{}\n", json!(raw)))
    .concat();
    std::fs::write(&script, format!("{bad}{good}")).unwrap();
    let model = format!("scripted:{}", script.display());
    let run = cli(
        tmp.path(),
        &["run", skill.to_str().unwrap(), "--model", &model, "--quiet"],
    )
    .await;
    assert_eq!(run.status.code(), Some(1));
    assert!(
        text(&run.stdout).contains("every one of 3 answers was rejected"),
        "{}",
        text(&run.stdout)
    );
    let id = only_task(tmp.path()).await;
    let retried = cli(tmp.path(), &["resume", &id, "--retry"]).await;
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    assert!(text(&retried.stdout).contains("completed after 4 step(s)"));
    let show = cli(tmp.path(), &["show", &id]).await;
    assert!(
        text(&show.stdout).contains("accepted after 3 rejected"),
        "{}",
        text(&show.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_echoed_by_the_model_or_split_by_a_cut_never_reach_the_database_or_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("skillstate.toml"),
        "[model]\nmax_retries = 0\n",
    )
    .unwrap();
    let (skill, _) = warehouse_copy(tmp.path(), 3, 4);
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let server = FakeServer::with_responder(move |body| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let prompt = format!(
            "{}{}",
            body["messages"][0]["content"].as_str().unwrap_or(""),
            body["messages"][1]["content"].as_str().unwrap_or("")
        );
        if n < 2 {
            // A 200 answer that echoes the key in its reasoning and in a state value.
            let mut answer: serde_json::Value = serde_json::from_str(
                &skillstate_envs::oracle::answer("warehouse", &prompt).unwrap(),
            )
            .unwrap();
            answer["reasoning"] = json!(format!("my key is {SECRET}, noted"));
            return Reply::json(200, openai_answer(&answer.to_string(), "stop"));
        }
        // An error body long enough that a 500-character cut falls inside the key.
        let padding = "x".repeat(500 - 10);
        Reply::json(
            500,
            json!({"error": {"message": format!("{padding}{SECRET} trailing")}}),
        )
    })
    .await;
    let base_url = format!("{}/v1", server.base_url);
    let run = cli(tmp.path(), &run_args(&skill, &base_url)).await;
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let id = only_task(tmp.path()).await;
    let show = cli(tmp.path(), &["show", &id]).await;
    let prompt = cli(tmp.path(), &["show", &id, "--step", "2", "--prompt"]).await;
    // The echoed key was replaced, not the answer dropped.
    let journal = store(tmp.path()).await.journal(&id).await.unwrap();
    assert!(
        journal[0].output.contains("my key is [redacted], noted"),
        "{}",
        journal[0].output
    );
    let piece = &SECRET[..10];
    for output in [&run, &show, &prompt] {
        for stream in [text(&output.stdout), text(&output.stderr)] {
            assert!(!stream.contains(SECRET), "{stream}");
        }
    }
    for entry in std::fs::read_dir(tmp.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            // SQLite removes a database's -wal and -shm files when its last connection closes,
            // which a store's threads may do while this loop runs: a file gone holds nothing.
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => panic!("{}: {error}", path.display()),
            };
            for needle in [SECRET.as_bytes(), piece.as_bytes()] {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "the key (or its first part) leaked into {}",
                    path.display()
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_escapes_in_answers_and_results_are_printed_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 8, 3);
    let good = std::fs::read_to_string(&script).unwrap();
    // A tool name and reasoning full of escape sequences (clear screen, window title, 8-bit
    // CSI, a bidirectional override), rejected as an unknown tool, then the right answers.
    let hostile = json!({
        "reasoning": "\u{1b}[2J\u{1b}]0;pwned\u{7}",
        "state_patch": {},
        "action": {"tool": "ship\u{1b}[31m\u{9b}1m\u{202e}", "args": {}}
    });
    std::fs::write(&script, format!("{}\n{good}", json!(hostile.to_string()))).unwrap();
    let model = format!("scripted:{}", script.display());
    let run = cli(
        tmp.path(),
        &["run", skill.to_str().unwrap(), "--model", &model],
    )
    .await;
    assert!(run.status.success(), "{}", text(&run.stderr));
    let id = only_task(tmp.path()).await;
    let show = cli(tmp.path(), &["show", &id]).await;
    let all = [&run, &show]
        .iter()
        .flat_map(|o| [text(&o.stdout), text(&o.stderr)])
        .collect::<Vec<_>>()
        .join("\n");
    for forbidden in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'] {
        assert!(
            !all.contains(forbidden),
            "{forbidden:?} reached the terminal:\n{all}"
        );
    }
    assert!(
        all.contains("ship\\x1b[31m\\x9b1m\\u{202e}"),
        "the name should be shown escaped:\n{all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_commands_never_create_tables_in_postgresql() {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if url == "off" {
        common::skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
        );
        return;
    }
    use sqlx::Connection;
    let schema = format!("readonly_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    let db = format!("{url}{separator}options=-c%20search_path%3D{schema}");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("skillstate.toml"), "").unwrap();
    let mut outputs = Vec::new();
    for args in [
        vec!["--db", db.as_str(), "tasks"],
        vec!["--db", db.as_str(), "pending"],
        vec!["--db", db.as_str(), "show", "0190"],
        vec!["--db", db.as_str(), "replay", "0190"],
    ] {
        let output = cli(tmp.path(), &args).await;
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            text(&output.stderr).contains("holds no skillstate database yet"),
            "{args:?}: {}",
            text(&output.stderr)
        );
        outputs.push(output);
    }
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = $1",
    )
    .bind(&schema)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(tables, 0, "a read-only command created tables");
    // A command that writes creates them; then the read-only ones read.
    let (skill, script) = warehouse_copy(tmp.path(), 1, 2);
    let model = format!("scripted:{}", script.display());
    let run = cli(
        tmp.path(),
        &[
            "--db",
            &db,
            "run",
            skill.to_str().unwrap(),
            "--model",
            &model,
            "--quiet",
        ],
    )
    .await;
    assert!(run.status.success(), "{}", text(&run.stderr));
    let tasks = cli(tmp.path(), &["--db", &db, "tasks"]).await;
    assert!(tasks.status.success());
    assert!(text(&tasks.stdout).contains("completed"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut admin)
        .await
        .unwrap();
}
