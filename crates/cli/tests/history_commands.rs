//! `replay`, `fork`, `gc` and storage size on real databases, through the CLI.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn only_task(db: &Path) -> String {
    let tasks = skillstate(db, &["tasks"]);
    text(&tasks.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn replay_names_the_first_corrupted_step() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let (skill, script) = warehouse_copy(tmp.path(), 5, 30);
    let run = skillstate(
        &db,
        &[
            "run",
            skill.to_str().unwrap(),
            "--model",
            &format!("scripted:{}", script.display()),
            "-q",
        ],
    );
    assert!(run.status.success());
    let id = only_task(&db);
    let ok = skillstate(&db, &["replay", &id]);
    assert!(ok.status.success());
    assert!(
        text(&ok.stdout).contains("re-derived 30 step(s)"),
        "{}",
        text(&ok.stdout)
    );

    let store = skillstate_store::SqliteStore::open(
        db.to_str().unwrap(),
        skillstate_store::Synchronous::Full,
    )
    .await
    .unwrap();
    sqlx::query("UPDATE journal SET patch = '{\"inventory\": {\"shelf_1\": \"item_1\"}}' WHERE task_id = ? AND step = 17 AND verdict = 'accepted'")
        .bind(&id)
        .execute(store.pool())
        .await
        .unwrap();
    drop(store);
    let bad = skillstate(&db, &["replay", &id]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stdout).contains("journal mismatch at step 17"),
        "{}",
        text(&bad.stdout)
    );
}

#[tokio::test]
async fn fork_gc_and_storage_per_step() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let (skill, script) = warehouse_copy(tmp.path(), 9, 200);
    let run = skillstate(
        &db,
        &[
            "run",
            skill.to_str().unwrap(),
            "--model",
            &format!("scripted:{}", script.display()),
            "-q",
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let id = only_task(&db);

    let store = skillstate_store::open(db.to_str().unwrap()).await.unwrap();
    let stats = store.storage_stats(&id).await.unwrap();
    eprintln!(
        "sqlite storage after 200 warehouse steps: {stats:?}, {:.0} journal bytes/step",
        stats.journal_bytes_per_step()
    );
    assert_eq!(stats.steps, 200);
    assert!(stats.journal_bytes_per_step() <= 1024.0, "{stats:?}");
    let parent = store.task(&id).await.unwrap();
    drop(store);

    // A fork continues from step 120 with its own history; the parent is untouched.
    let fork = skillstate(&db, &["fork", &id, "--step", "120"]);
    assert!(fork.status.success(), "{}", text(&fork.stderr));
    let fork_id = text(&fork.stdout).trim().to_owned();
    let resumed = skillstate(&db, &["resume", &fork_id]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stdout).contains("completed after 200 step(s)")
            && text(&resumed.stdout).contains("score 1.00"),
        "{}",
        text(&resumed.stdout)
    );
    let store = skillstate_store::open(db.to_str().unwrap()).await.unwrap();
    let forked = store.task(&fork_id).await.unwrap();
    assert_eq!(forked.parent, Some((id.clone(), 120)));
    assert_eq!(
        forked.state, parent.state,
        "the same script from step 120 reaches the same state"
    );
    assert_eq!(store.task(&id).await.unwrap(), parent);
    drop(store);

    // gc: compaction keeps the last steps rebuildable and drops the rest.
    let gc = skillstate(&db, &["gc", "--keep-last", "50"]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        text(&gc.stdout).contains("compact 2 journal(s)"),
        "{}",
        text(&gc.stdout)
    );
    let late = skillstate(&db, &["show", &id, "--step", "180"]);
    assert!(late.status.success());
    let early = skillstate(&db, &["show", &id, "--step", "10"]);
    assert_eq!(early.status.code(), Some(1));
    assert!(
        text(&early.stderr).contains("compacted"),
        "{}",
        text(&early.stderr)
    );
    assert!(skillstate(&db, &["replay", &id]).status.success());
    let store = skillstate_store::open(db.to_str().unwrap()).await.unwrap();
    assert!(store.storage_stats(&id).await.unwrap().journal_bytes < stats.journal_bytes / 3);
    drop(store);

    // Deleting old finished tasks.
    let kept = skillstate(&db, &["gc", "--older-than", "1d"]);
    assert!(
        text(&kept.stdout).contains("delete 0 task(s)"),
        "{}",
        text(&kept.stdout)
    );
    let all = skillstate(&db, &["gc", "--older-than", "0s"]);
    assert!(
        text(&all.stdout).contains("did delete 2 task(s)"),
        "{}",
        text(&all.stdout)
    );
    assert!(text(&skillstate(&db, &["tasks"]).stdout).contains("no tasks"));
}

#[tokio::test]
async fn postgres_journal_bytes_per_step() {
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
    let schema = format!("bytes_{}", std::process::id());
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut connection)
        .await
        .unwrap();
    let location = format!("{url}?options=-c%20search_path%3D{schema}");
    let tmp = tempfile::tempdir().unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 9, 200);
    let run = std::process::Command::new(binary())
        .args([
            "--db",
            &location,
            "run",
            skill.to_str().unwrap(),
            "--model",
            &format!("scripted:{}", script.display()),
            "-q",
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run.stderr));
    let store = skillstate_store::open(&location).await.unwrap();
    let id = store.list_tasks().await.unwrap()[0].id.clone();
    let stats = store.storage_stats(&id).await.unwrap();
    eprintln!(
        "postgres storage after 200 warehouse steps: {stats:?}, {:.0} journal bytes/step",
        stats.journal_bytes_per_step()
    );
    assert_eq!(stats.steps, 200);
    assert!(stats.journal_bytes_per_step() <= 1024.0, "{stats:?}");
    let replay = std::process::Command::new(binary())
        .args(["--db", &location, "replay", &id])
        .output()
        .unwrap();
    assert!(
        replay.status.success() && text(&replay.stdout).contains("re-derived 200 step(s)"),
        "{}",
        text(&replay.stdout)
    );
    drop(store);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut connection)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_snapshot_interval_comes_from_the_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let config = tmp.path().join("skillstate.toml");
    std::fs::write(&config, "[store]\nsnapshot_every = 3\n").unwrap();
    let run = skillstate(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "skills/warehouse",
            "--model",
            "scripted:skills/warehouse/examples/demo.jsonl",
            "-q",
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let store = skillstate_store::SqliteStore::open(
        db.to_str().unwrap(),
        skillstate_store::Synchronous::Full,
    )
    .await
    .unwrap();
    let steps: Vec<i64> = sqlx::query_scalar("SELECT step FROM snapshots ORDER BY step")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(
        steps,
        vec![0, 3, 6, 9],
        "the initial state and every third step"
    );
    let bad = std::fs::write(&config, "[store]\nsnapshot_evry = 3\n");
    bad.unwrap();
    let refused = skillstate(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "skills/warehouse",
            "--model",
            "scripted:skills/warehouse/examples/demo.jsonl",
        ],
    );
    assert!(
        text(&refused.stderr).contains("skillstate.toml:2"),
        "{}",
        text(&refused.stderr)
    );
}
