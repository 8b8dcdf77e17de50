//! `skillstate upgrade --skill … --apply` over 1,000 queued warehouse tasks while a worker
//! process runs them, on SQLite and on PostgreSQL (real processes): every task is reported
//! once, either moved (a step of its journal, the new version from there on) or refused and
//! kept whole; every task completes; no effectful action is run twice (the tasks' audit ledger);
//! a moved task's journal replays with every hash.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use batch_support::*;
use serde_json::Value;

const TASKS: usize = 1_000;
const EVENTS: u32 = 2;

/// Version 2.0.0 of the batch's warehouse skill: the same state, one more sentence of
/// procedure.
fn second_version(skill: &Path, root: &Path) -> std::path::PathBuf {
    let to = root.join("v2").join("warehouse");
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(skill).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    let settings = std::fs::read_to_string(to.join("skill.toml")).unwrap();
    std::fs::write(
        to.join("skill.toml"),
        format!("version = \"2.0.0\"\n{settings}"),
    )
    .unwrap();
    let procedure = std::fs::read_to_string(to.join("SKILL.md")).unwrap();
    std::fs::write(
        to.join("SKILL.md"),
        format!("{procedure}\nDouble-check the shelf before every move.\n"),
    )
    .unwrap();
    to
}

async fn upgrade_while_a_worker_runs(root: &Path, db: &str) {
    let ledger = root.join("ledger.tsv");
    let SubmittedBatch { config, skill, .. } =
        submit_warehouse_batch_to(root, db, TASKS, EVENTS, &ledger);
    let target = second_version(&skill, root);

    let log = root.join("worker.log");
    let mut worker = spawn_worker(
        root,
        &config,
        db,
        &["--until-idle", "--concurrency", "16"],
        &[],
        &log,
    );
    let upgrade = cli(
        root,
        &config,
        &[
            "--db",
            db,
            "upgrade",
            "--skill",
            "warehouse",
            "--to",
            target.to_str().unwrap(),
            "--apply",
            "--json",
        ],
    );
    let status = wait_exit(&mut worker, Duration::from_secs(300), "worker");
    assert!(
        status.success(),
        "worker: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // Every task reported once: moved, or refused with the reason.
    let mut outcomes: HashMap<String, Value> = HashMap::new();
    for line in text(&upgrade.stdout).lines() {
        let outcome: Value = serde_json::from_str(line).unwrap();
        let task = outcome["task"].as_str().unwrap().to_owned();
        assert!(outcomes.insert(task, outcome).is_none(), "reported twice");
    }
    assert_eq!(outcomes.len(), TASKS, "{}", text(&upgrade.stderr));
    let moved: Vec<&String> = outcomes
        .iter()
        .filter(|(_, o)| o["outcome"] == "moved")
        .map(|(task, _)| task)
        .collect();
    for (task, outcome) in &outcomes {
        if outcome["outcome"] != "moved" {
            assert_eq!(outcome["outcome"], "refused", "{outcome}");
            let error = outcome["error"].as_str().unwrap();
            assert!(
                error.contains("being run by")
                    || error.contains("settle it first")
                    || error.contains("moved on to version"),
                "{task}: {error}"
            );
        }
    }
    assert!(!moved.is_empty(), "no task was moved");
    let expected_code = if moved.len() == TASKS { 0 } else { 1 };
    expect_exit(&upgrade, expected_code, "upgrade");

    // Every task completed, each effectful action recorded once.
    let store = skillstate_store::open_existing(db, &Default::default())
        .await
        .unwrap();
    let tasks = store.list_tasks().await.unwrap();
    assert_eq!(tasks.len(), TASKS);
    for summary in &tasks {
        let task = store.task(&summary.id).await.unwrap();
        assert_eq!(task.status.as_str(), "completed", "{}", summary.id);
        let versions = store.task_versions(&summary.id).await.unwrap();
        let was_moved = moved.contains(&&summary.id);
        assert_eq!(
            versions.len(),
            if was_moved { 2 } else { 1 },
            "{}",
            summary.id
        );
        assert_eq!(
            task.skill.settings.version.is_some(),
            was_moved,
            "{}",
            summary.id
        );
    }
    let keys = ledger_keys(&ledger);
    assert_no_duplicate(&keys);
    assert_eq!(keys.len(), TASKS * EVENTS as usize);
    // One skill version stored per version, whatever the number of tasks.
    let versions = store.skill_versions().await.unwrap();
    assert_eq!(versions.len(), 2, "{versions:?}");
    store.release().await;
    // `show` names the version a moved task runs and the step each version began at.
    let show = cli(root, &config, &["--db", db, "show", moved[0]]);
    expect_exit(&show, 0, "show");
    let shown = text(&show.stdout);
    let versions_line = shown
        .lines()
        .find(|line| line.starts_with("versions "))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        versions_line.contains(" from step 0, ") && versions_line.contains("2.0.0 ("),
        "{versions_line}"
    );
    for task in moved.iter().take(5) {
        let replay = cli(root, &config, &["--db", db, "replay", task]);
        expect_exit(&replay, 0, "replay");
        assert!(
            text(&replay.stdout).contains("every recorded state hash matches"),
            "{}",
            text(&replay.stdout)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_are_upgraded_while_a_worker_runs_them_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("queue.db").display().to_string();
    upgrade_while_a_worker_runs(dir.path(), &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_are_upgraded_while_a_worker_runs_them_on_postgres() {
    let Some(url) = postgres_url() else {
        return;
    };
    let schema = format!("upgrade_queue_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    let dir = tempfile::tempdir().unwrap();
    upgrade_while_a_worker_runs(dir.path(), &db).await;
    drop_schema(&url, &schema).await;
}
