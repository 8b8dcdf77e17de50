//! The recall index is written in the transaction of what it indexes (docs/recall.md, "Recall and
//! provenance"): a run SIGKILLed at any point — right after a step's commit, inside a tool,
//! before a model call — leaves an index that is exactly what the journal it left rebuilds,
//! and so does the run resumed to its end. Real `skillstate` processes, a real SQLite file.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::*;
use skillstate_core::recall::{RECALL_TOOL, RecallQuery, step_entries};
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous, Verdict};
use sqlx::Connection;

type Entry = (u64, String, Option<String>, String);

fn command(db: &Path) -> Command {
    let mut command = Command::new(binary());
    command
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .env_remove("SKILLSTATE_FAILPOINT");
    command
}

/// The index as stored.
async fn indexed(db: &Path, task: &str) -> Vec<Entry> {
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(db);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let rows: Vec<(i64, String, Option<String>, String)> = sqlx::query_as(
        "SELECT step, kind, pointer, text FROM recall_entries WHERE task_id = ? ORDER BY step, id",
    )
    .bind(task)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let mut rows: Vec<Entry> = rows
        .into_iter()
        .map(|(step, kind, pointer, text)| (step as u64, kind, pointer, text))
        .collect();
    rows.sort();
    rows
}

/// The index the journal rebuilds: every accepted step's entries and every observation that
/// is not a recall result.
async fn replayed(store: &SqliteStore, task: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    for row in store.journal(task).await.unwrap() {
        if row.verdict != Verdict::Accepted {
            continue;
        }
        for e in step_entries(&row.output, row.patch.as_ref(), row.action.as_ref()) {
            entries.push((row.step, e.kind.as_str().to_owned(), e.pointer, e.text));
        }
    }
    let intents = store.intents(task).await.unwrap();
    for (step, text) in store.observations(task).await.unwrap() {
        let after_recall = intents
            .iter()
            .any(|i| i.step + 1 == step && i.tool == RECALL_TOOL);
        if !text.is_empty() && !after_recall {
            entries.push((
                step,
                "observation".into(),
                None,
                text.chars().take(16384).collect(),
            ));
        }
    }
    entries.sort();
    entries
}

async fn open(db: &Path) -> SqliteStore {
    SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_index_is_what_its_journal_rebuilds() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 3, 14);
    let model = format!("scripted:{}", script.display());

    let killed = command(&db)
        .args(["run", skill.to_str().unwrap(), "--model", &model, "--quiet"])
        .env("SKILLSTATE_FAILPOINT", "after_commit:3")
        .output()
        .unwrap();
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "the run dies right after a commit"
    );
    let task = open(&db).await.list_tasks().await.unwrap()[0].id.clone();

    let mut checked = Vec::new();
    for failpoint in ["after_tool:2", "before_model:3", "after_commit:2", ""] {
        let store = open(&db).await;
        let index = indexed(&db, &task).await;
        assert_eq!(
            index,
            replayed(&store, &task).await,
            "after the kill before {failpoint:?}"
        );
        // The last committed step is found: its writes are in the index.
        let version = store.task(&task).await.unwrap().version;
        assert!(
            index
                .iter()
                .any(|(step, kind, _, _)| *step == version && kind == "action")
        );
        checked.push(index.len());
        store.release().await;
        drop(store);

        let mut resume = command(&db);
        resume.args(["resume", &task]);
        if !failpoint.is_empty() {
            resume.env("SKILLSTATE_FAILPOINT", failpoint);
        }
        let output = resume.output().unwrap();
        if failpoint.is_empty() {
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
        } else {
            assert_eq!(
                output.status.signal(),
                Some(9),
                "killed at {failpoint}: {:?} {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let store = open(&db).await;
    let index = indexed(&db, &task).await;
    assert_eq!(index, replayed(&store, &task).await, "at the end");
    assert!(
        checked.windows(2).all(|w| w[0] < w[1]),
        "every resume added steps: {checked:?}"
    );
    // And search finds what the run did, through the store.
    let query = RecallQuery::new(None, Some("/inventory")).unwrap();
    let hits = store
        .search_journal(&task, &query, None, 1000)
        .await
        .unwrap();
    let writes = index
        .iter()
        .filter(|(_, kind, _, _)| kind == "state")
        .count();
    assert_eq!(hits.len(), writes);
}
