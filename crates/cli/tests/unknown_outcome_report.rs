//! An action whose outcome a crash left unknown is reported as its own figure ("outcome
//! unknown"), not as a tool error: a real worker SIGKILLed between committing an effectful
//! action and recording its result, a second worker that settles it, then `batch report`.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use batch_support::*;
use serde_json::Value;
use skillstate_store::{ActionOutcome, TaskStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_a_crash_left_unknown_is_its_own_figure_in_batch_report() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ledger = dir.join("ledger.tsv");
    let SubmittedBatch {
        config, db, batch, ..
    } = submit_warehouse_batch(dir, 1, 4, &ledger);

    // Killed right after committing step 2, before its (effectful) action's result is stored.
    let mut killed = spawn_worker(
        dir,
        &config,
        &db,
        &["--batch", &batch],
        &[("SKILLSTATE_FAILPOINT", "after_commit:2")],
        &dir.join("killed.log"),
    );
    let status = wait_exit(&mut killed, Duration::from_secs(120), "the killed worker");
    assert_eq!(status.signal(), Some(9), "the worker dies at the failpoint");

    // The next worker takes the task over: the action is not repeated, its outcome is unknown.
    let mut second = spawn_worker(
        dir,
        &config,
        &db,
        &["--batch", &batch, "--until-idle"],
        &[],
        &dir.join("second.log"),
    );
    let status = wait_exit(&mut second, Duration::from_secs(120), "the second worker");
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(dir.join("second.log")).unwrap_or_default()
    );
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    let task = store.batch_tasks(&batch).await.unwrap().remove(0);
    assert_eq!(task.status, Some(TaskStatus::Completed), "{task:?}");
    let intents = store.intents(&task.id).await.unwrap();
    let unknown: Vec<_> = intents
        .iter()
        .filter(|i| i.outcome() == ActionOutcome::Unknown)
        .collect();
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    // Tool calls that really returned an error (the episode goes on after the unknown one).
    let failed = intents
        .iter()
        .filter(|i| i.outcome() == ActionOutcome::Failed)
        .count() as u64;
    assert!(
        unknown[0]
            .result
            .as_deref()
            .unwrap_or("")
            .starts_with("Outcome unknown")
    );

    let json = cli(
        dir,
        &config,
        &["--db", &db, "batch", "report", &batch, "--format", "json"],
    );
    expect_exit(&json, 0, "batch report --format json");
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    let metrics = &report["metrics"];
    assert_eq!(metrics["outcome_unknown"], 1, "{metrics}");
    assert_eq!(metrics["tool_errors"], failed, "{metrics}");
    // The unknown outcome is not in the invalid-tool-call rate.
    let answers = metrics["answers"].as_u64().unwrap();
    let rejections = metrics["tool_call_rejections"].as_u64().unwrap();
    assert_eq!(
        metrics["invalid_tool_call_rate"].as_f64(),
        Some((rejections + failed) as f64 / answers as f64),
        "{metrics}"
    );
    assert_eq!(report["tasks"][0]["outcome_unknown"], 1);

    let md = cli(
        dir,
        &config,
        &["--db", &db, "batch", "report", &batch, "--format", "md"],
    );
    expect_exit(&md, 0, "batch report --format md");
    let md = text(&md.stdout);
    assert!(md.contains("outcome unknown"), "{md}");
    assert!(
        md.contains("1 (actions whose outcome a crash left unknown"),
        "{md}"
    );
    assert!(md.contains(&format!("{failed} tool errors)")), "{md}");

    let csv = cli(
        dir,
        &config,
        &["--db", &db, "batch", "report", &batch, "--format", "csv"],
    );
    expect_exit(&csv, 0, "batch report --format csv");
    assert!(
        text(&csv.stdout)
            .lines()
            .next()
            .unwrap()
            .contains(",tool_errors,outcome_unknown,")
    );
}
