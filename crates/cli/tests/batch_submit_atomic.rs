//! `batch submit` is all or nothing: killed (SIGKILL) half-way through writing its tasks, it
//! leaves neither the batch nor any task, on SQLite and on PostgreSQL. Real child processes.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use batch_support::*;
use common::binary;

const TASKS: usize = 1_000;

/// Writes a warehouse batch of `TASKS` tasks in `dir`; returns the config path.
fn batch_file(dir: &Path) -> std::path::PathBuf {
    let ledger = dir.join("ledger.tsv");
    let (skill, inputs) = warehouse_batch(dir, TASKS, 2, &ledger);
    let config = dir.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: oracle\ninputs: {}\n",
            skill.display(),
            inputs.display()
        ),
    )
    .unwrap();
    config
}

async fn killed_submit_leaves_nothing(dir: &Path, db: &str) {
    let config = batch_file(dir);
    // Killed inside the transaction, after several chunks of tasks were written.
    let killed = Command::new(binary())
        .current_dir(dir)
        .env_remove("SKILLSTATE_DB")
        .env("SKILLSTATE_CONFIG", &config)
        .env("SKILLSTATE_FAILPOINT", "submit_task:700")
        .args(["--db", db, "batch", "submit", "batch.yaml"])
        .output()
        .unwrap();
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "the submit dies at its 700th task: {}",
        text(&killed.stderr)
    );
    let store = skillstate_store::open_existing(db, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.list_batches().await.unwrap(),
        Vec::new(),
        "a batch was left"
    );
    assert!(
        store.list_tasks().await.unwrap().is_empty(),
        "tasks were left"
    );

    // The same submit, not killed, queues every task.
    let submitted = cli(dir, &config, &["--db", db, "batch", "submit", "batch.yaml"]);
    expect_exit(&submitted, 0, "batch submit");
    let batch = text(&submitted.stdout).trim().to_owned();
    assert_eq!(store.batch_tasks(&batch).await.unwrap().len(), TASKS);
    assert_eq!(store.list_batches().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_killed_half_way_leaves_no_batch_on_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("queue.db");
    killed_submit_leaves_nothing(tmp.path(), db.to_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_killed_half_way_leaves_no_batch_on_postgres() {
    let Some(url) = postgres_url() else { return };
    let schema = format!("submit_killed_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    let tmp = tempfile::tempdir().unwrap();
    killed_submit_leaves_nothing(tmp.path(), &db).await;
    drop_schema(&url, &schema).await;
}

/// A bad input line refuses the whole submit before anything is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_late_in_the_inputs_stores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = batch_file(dir);
    let inputs = dir.join("inputs.jsonl");
    let mut text_in = std::fs::read_to_string(&inputs).unwrap();
    text_in.push_str("{\"inptu\": 1}\n");
    std::fs::write(&inputs, text_in).unwrap();
    let db = dir.join("queue.db").display().to_string();
    let refused = cli(
        dir,
        &config,
        &["--db", &db, "batch", "submit", "batch.yaml"],
    );
    expect_exit(&refused, 1, "batch submit with a bad line");
    assert!(
        text(&refused.stderr).contains(&format!(
            "inputs.jsonl:{}: unknown field `inptu`",
            TASKS + 1
        )),
        "{}",
        text(&refused.stderr)
    );
    if let Ok(store) = skillstate_store::open_existing(&db, &Default::default()).await {
        assert!(store.list_batches().await.unwrap().is_empty());
    }
}
