//! SIGKILL a real `skillstate run` at many points: the database must always open cleanly and
//! its last committed step must be intact (journal, state, version and hash agree).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Instant;

use common::*;
use skillstate_core::json::state_hash;
use skillstate_store::{SqliteStore, Store, Synchronous, Verdict, state_at};

const KILLS: u64 = 12;

#[tokio::test]
async fn a_killed_run_leaves_a_consistent_database() {
    let tmp = tempfile::tempdir().unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 3, 400);
    let model = format!("scripted:{}", script.display());

    // One uninterrupted run tells how long a whole run takes, so kills spread over all of it.
    let full_db = tmp.path().join("full.db");
    let started = Instant::now();
    let out = skillstate(
        &full_db,
        &["run", skill.to_str().unwrap(), "--model", &model, "--quiet"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full_run = started.elapsed();

    let mut killed_mid_run = 0;
    for kill in 0..KILLS {
        let db = tmp.path().join(format!("kill-{kill}.db"));
        let mut child = Command::new(binary())
            .args([
                "--db",
                db.to_str().unwrap(),
                "run",
                skill.to_str().unwrap(),
                "--model",
                &model,
                "--quiet",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Spread the kill points evenly over the run, from start-up to the last steps.
        let delay = full_run.mul_f64((kill as f64 + 0.5) / KILLS as f64);
        tokio::time::sleep(delay).await;
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        if !db.exists() {
            continue;
        }

        let store = SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap();
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(integrity, "ok", "kill {kill}");
        let tasks = store.list_tasks().await.unwrap();
        let Some(summary) = tasks.first() else {
            continue;
        };
        let task = store.task(&summary.id).await.unwrap();
        if task.version > 0 && task.version < 400 {
            killed_mid_run += 1;
        }
        let journal = store.journal(&task.id).await.unwrap();
        let accepted: Vec<_> = journal
            .iter()
            .filter(|e| e.verdict == Verdict::Accepted)
            .collect();
        assert_eq!(
            accepted.len() as u64,
            task.version,
            "kill {kill}: version and journal disagree"
        );
        let rebuilt = state_at(&store, &task.id, task.version, task.version)
            .await
            .unwrap();
        assert_eq!(
            rebuilt, task.state,
            "kill {kill}: stored state differs from the journal"
        );
        if let Some(last) = accepted.last() {
            assert_eq!(
                last.state_hash.as_deref(),
                Some(state_hash(&task.state).as_str())
            );
        }
        let intents = store.intents(&task.id).await.unwrap();
        assert_eq!(
            intents.len() as u64,
            task.version,
            "kill {kill}: every committed step has its intent"
        );
        for step in 1..=task.version {
            assert!(
                store.observation(&task.id, step).await.unwrap().is_some(),
                "kill {kill}: step {step} lost its observation"
            );
        }
        let pending = intents.iter().filter(|i| !i.done).count();
        assert!(
            pending <= 1,
            "kill {kill}: at most the last action can be in flight"
        );
        drop(store);

        // The database stays usable by the CLI.
        let show = skillstate(&db, &["show", &task.id]);
        assert!(
            show.status.success(),
            "kill {kill}: {}",
            String::from_utf8_lossy(&show.stderr)
        );
    }
    assert!(
        killed_mid_run >= KILLS / 2,
        "only {killed_mid_run} kills landed mid-run (full run took {full_run:?})"
    );
}
