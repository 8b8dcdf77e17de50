//! SIGKILL a real `skillstate run` at many points: the database must always open cleanly and
//! its last committed step must be intact (journal, state, version and hash agree).
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::*;
use skillstate_core::json::state_hash;
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous, Verdict, state_at};

const KILLS: u64 = 12;

#[tokio::test]
async fn a_killed_run_leaves_a_consistent_database() {
    let tmp = tempfile::tempdir().unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 3, 400);
    let model = format!("scripted:{}", script.display());

    // Each run kills itself with SIGKILL at a chosen crash point and step, spread over the
    // whole 400-step run; the points cycle through the runtime's crash points (a kill inside
    // the tool needs its audit log and is covered by durability.rs).
    const POINTS: [&str; 4] = ["before_model", "after_model", "after_commit", "after_tool"];
    for kill in 0..KILLS {
        let db = tmp.path().join(format!("kill-{kill}.db"));
        let point = POINTS[kill as usize % POINTS.len()];
        let hit = 1 + kill * 399 / KILLS;
        let status = Command::new(binary())
            .args([
                "--db",
                db.to_str().unwrap(),
                "run",
                skill.to_str().unwrap(),
                "--model",
                &model,
                "--quiet",
            ])
            .env("SKILLSTATE_FAILPOINT", format!("{point}:{hit}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "kill {kill}: the run must die by SIGKILL at {point}:{hit}"
        );

        let store = SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap();
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(integrity, "ok", "kill {kill}");
        let tasks = store.list_tasks().await.unwrap();
        let task = store.task(&tasks[0].id).await.unwrap();
        assert!(task.version < 400, "kill {kill}: the run was cut short");
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
}
