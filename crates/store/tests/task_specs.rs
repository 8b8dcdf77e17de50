//! SQLite keeps a task's skill and tool list out of the `tasks` row that every step rewrites
//! (`task_specs` from schema 7, a skill version stored once from schema 13): a database of schema 6 is migrated with every task reading the
//! same (and still reads, unmigrated, when opened read-only), and a state write costs the same
//! WAL pages whatever the size of the task's skill and tools.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/store_steps.rs"]
mod store_steps;

use std::path::Path;

use anyhow::{Context, ensure};
use serde_json::{Map, Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::tool::control_specs;
use skillstate_core::{ContextStrategy, SideEffect, SkillDefinition, ToolSpec};
use skillstate_store::prelude::*;
use skillstate_store::*;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{Connection, SqliteConnection};

/// The first six SQLite migrations as they ship: a database as the previous version left it.
const SCHEMA_SIX: [(i64, &str, &str); 6] = [
    (
        1,
        "init",
        include_str!("../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "leases",
        include_str!("../migrations/sqlite/0002_leases.sql"),
    ),
    (
        3,
        "queue",
        include_str!("../migrations/sqlite/0003_queue.sql"),
    ),
    (
        4,
        "output_tokens",
        include_str!("../migrations/sqlite/0004_output_tokens.sql"),
    ),
    (
        5,
        "service",
        include_str!("../migrations/sqlite/0005_service.sql"),
    ),
    (
        6,
        "inbox",
        include_str!("../migrations/sqlite/0006_inbox.sql"),
    ),
];

/// A skill and tools of the size real ones have (about 4.4 KB of JSON together).
fn big_skill() -> (SkillDefinition, Vec<ToolSpec>) {
    let skill = SkillDefinition {
        name: "warehouse".into(),
        description: "Keep the warehouse's inventory in order".into(),
        metadata: None,
        procedure: "Read the observation, move one item per step, and note why. ".repeat(40),
        schema: json!({
            "type": "object",
            "properties": {
                "inventory": {"type": "object", "additionalProperties": {"type": "string"}},
                "notes": {"type": "array", "items": {"type": "string"}}
            }
        }),
        initial_state: json!({"inventory": {}, "notes": []}),
        settings: Default::default(),
        migrations: Vec::new(),
    };
    let mut tools = control_specs();
    for name in ["store", "fetch", "count", "inspect"] {
        tools.push(ToolSpec {
            name: name.into(),
            description: format!("{name} one item on a shelf; ").repeat(6),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "item": {"type": "string", "pattern": "^item_[0-9]+$"},
                    "shelf": {"type": "string", "pattern": "^shelf_[0-9]+$"}
                },
                "required": ["item", "shelf"],
                "additionalProperties": false
            }),
            side_effect: SideEffect::Effectful,
            source: "warehouse".into(),
            needs_approval: false,
        });
    }
    (skill, tools)
}

fn small_skill() -> (SkillDefinition, Vec<ToolSpec>) {
    (store_steps::free_skill(), Vec::new())
}

fn new_task((skill, tools): (SkillDefinition, Vec<ToolSpec>)) -> NewTask {
    NewTask {
        skill,
        tools,
        context: ContextStrategy::State,
        context_budget: None,
        model: "scripted:test".into(),
        environment: None,
        env_checkpoint: None,
        opening_observation: "start".into(),
    }
}

/// A state write as the service makes it (`PATCH …/state`): a step without action, its author
/// recorded, the pending observation carried over.
fn state_write(step: u64, new_state: Value) -> StepCommit {
    StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: "{}".into(),
            patch: Some(new_state.clone()),
            action: None,
            errors: None,
            state_hash: Some(state_hash(&new_state)),
            prompt_tokens: 0,
            output_tokens: None,
            prompt_hash: "-".into(),
            usage: None,
            latency_ms: 0,
            created_at: 0,
            author: Some("key-1".into()),
            board_version: None,
        },
        new_state,
        intent: None,
        status: None,
        previous_result: None,
        next_observation: Some(NextObservation::Text("start".into())),
        world: None,
        upgrade: None,
    }
}

async fn connect(path: &Path) -> anyhow::Result<SqliteConnection> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .foreign_keys(true);
    Ok(SqliteConnection::connect_with(&options).await?)
}

async fn count(conn: &mut SqliteConnection, sql: &'static str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(conn).await?)
}

/// Applies the first six migrations the way `migrate_sqlite` does.
async fn create_schema_six(conn: &mut SqliteConnection) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .execute(&mut *conn)
    .await?;
    for (version, name, sql) in SCHEMA_SIX {
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(sql).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, 0)")
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Writes `task` as a schema-6 database holds it (skill and tools in its `tasks` row), with its
/// step-0 snapshot and opening observation.
async fn insert_schema_six_task(
    conn: &mut SqliteConnection,
    task: &TaskRecord,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, outcome, parent_task, parent_step, created_at, updated_at, labels, tenant, idempotency_key) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
    )
    .bind(&task.id)
    .bind(&task.skill.name)
    .bind(serde_json::to_string(&task.skill)?)
    .bind(serde_json::to_string(&task.tools)?)
    .bind(task.context.as_str())
    .bind(task.context_budget.map(|b| b as i64))
    .bind(&task.model)
    .bind(task.environment.as_ref().map(Value::to_string))
    .bind(task.env_checkpoint.as_ref().map(Value::to_string))
    .bind(task.status.as_str())
    .bind(task.state.to_string())
    .bind(task.version as i64)
    .bind(task.outcome.as_ref().map(Value::to_string))
    .bind(task.parent.as_ref().map(|(id, _)| id.clone()))
    .bind(task.parent.as_ref().map(|(_, step)| *step as i64))
    .bind(task.created_at)
    .bind(task.updated_at)
    .bind((!task.labels.is_empty()).then(|| Value::Object(task.labels.clone()).to_string()))
    .bind(&task.tenant)
    .execute(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, ?, ?, ?)")
        .bind(&task.id)
        .bind(task.version as i64)
        .bind(task.state.to_string())
        .bind(state_hash(&task.state))
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO observations (task_id, step, text) VALUES (?, ?, 'start')")
        .bind(&task.id)
        .bind(task.version as i64 + 1)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Tasks as a previous version could have written them: big and small skills, every optional
/// field set on one, a fork of another.
fn schema_six_tasks() -> Vec<TaskRecord> {
    let (skill, tools) = big_skill();
    let mut labels = Map::new();
    labels.insert("team".into(), json!("ops"));
    let owned = TaskRecord {
        id: "01900000-0000-7000-8000-a00000000001".into(),
        skill,
        tools,
        context: ContextStrategy::Window,
        context_budget: Some(2_000),
        model: "openai:gpt-test".into(),
        environment: Some(json!({"seed": 7, "noise": 0.1})),
        env_checkpoint: Some(json!({"tick": 3})),
        env_checkpoint_step: None,
        status: TaskStatus::AwaitingInput,
        state: json!({"inventory": {"item_1": "shelf_2"}, "notes": ["moved item_1"]}),
        version: 0,
        outcome: Some(json!({"question": "which shelf?"})),
        parent: None,
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_005_000,
        tenant: Some("acme".into()),
        labels,
        upgrade_to: None,
    };
    let (skill, tools) = small_skill();
    let plain = TaskRecord {
        id: "01900000-0000-7000-8000-b00000000002".into(),
        skill,
        tools,
        context: ContextStrategy::State,
        context_budget: None,
        model: "scripted:test".into(),
        environment: None,
        env_checkpoint: None,
        env_checkpoint_step: None,
        status: TaskStatus::Running,
        state: json!({}),
        version: 0,
        outcome: None,
        parent: None,
        created_at: 1_700_000_001_000,
        updated_at: 1_700_000_001_000,
        tenant: None,
        labels: Map::new(),
        upgrade_to: None,
    };
    let fork = TaskRecord {
        id: "01900000-0000-7000-8000-c00000000003".into(),
        parent: Some((owned.id.clone(), 0)),
        tenant: None,
        labels: Map::new(),
        upgrade_to: None,
        outcome: None,
        status: TaskStatus::Running,
        created_at: 1_700_000_006_000,
        updated_at: 1_700_000_006_000,
        ..owned.clone()
    };
    vec![owned, plain, fork]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_six_database_is_migrated_and_every_task_reads_the_same() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("old.db");
    let location = path.to_str().context("temporary path is not UTF-8")?;
    let tasks = schema_six_tasks();
    let mut conn = connect(&path).await?;
    create_schema_six(&mut conn).await?;
    for task in &tasks {
        insert_schema_six_task(&mut conn, task).await?;
    }
    conn.close().await?;

    // Opened read-only, it is read as it is, twice (the second read may come from what the
    // first kept), and left at schema 6.
    let reader = SqliteStore::open_mode(location, Synchronous::Full, OpenMode::Existing).await?;
    for _ in 0..2 {
        for task in &tasks {
            assert_eq!(&reader.task(&task.id).await?, task);
            assert_eq!(reader.task_state(&task.id).await?, TaskState::of(task));
        }
        assert_eq!(reader.task(&tasks[0].id[..26]).await?, tasks[0]);
    }
    assert_eq!(reader.list_tasks().await?.len(), 3);
    let mut conn = connect(&path).await?;
    assert_eq!(
        count(&mut conn, "SELECT MAX(version) FROM schema_migrations").await?,
        6
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'task_specs'"
        )
        .await?,
        0
    );
    conn.close().await?;

    // Opened to write, it is migrated; every task reads the same, through the point reads and
    // the pool (by prefix).
    let store = SqliteStore::open(location, Synchronous::Full).await?;
    for _ in 0..2 {
        for task in &tasks {
            assert_eq!(&store.task(&task.id).await?, task);
            assert_eq!(&store.task(&task.id[..26]).await?, task);
            assert_eq!(store.task_state(&task.id).await?, TaskState::of(task));
        }
    }
    // ... to the version a database created now has, whatever migrations come later.
    let fresh = dir.path().join("fresh.db");
    SqliteStore::open(fresh.to_str().unwrap_or_default(), Synchronous::Full)
        .await?
        .release()
        .await;
    let newest = count(
        &mut connect(&fresh).await?,
        "SELECT MAX(version) FROM schema_migrations",
    )
    .await?;
    assert!(newest >= 8, "the newest schema is {newest}");
    let mut conn = connect(&path).await?;
    assert_eq!(
        count(&mut conn, "SELECT MAX(version) FROM schema_migrations").await?,
        newest
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM pragma_table_info('tasks') WHERE name IN ('skill', 'tools')"
        )
        .await?,
        0
    );
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM task_versions").await?,
        3
    );
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM pragma_foreign_key_check").await?,
        0
    );
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(integrity, "ok");
    conn.close().await?;

    // A read-only open of the migrated file reads the same too.
    let reader = open_existing(location, &StoreOptions::default()).await?;
    for task in &tasks {
        assert_eq!(&reader.task(&task.id).await?, task);
    }

    // The migrated tasks go on: a step, a fork, a delete (which takes their skill and tools).
    let plain = &tasks[1];
    store
        .commit_unleased_step(&plain.id, 0, &state_write(1, json!({"a": 1})))
        .await?;
    let stepped = store.task(&plain.id).await?;
    assert_eq!((stepped.version, &stepped.skill), (1, &plain.skill));
    let fork = store
        .fork_task(&tasks[0].id, 0, &json!({"forked": true}), None)
        .await?;
    assert_eq!(
        (&fork.skill, &fork.tools),
        (&tasks[0].skill, &tasks[0].tools)
    );
    store.delete_task(&tasks[0].id).await?;
    let mut conn = connect(&path).await?;
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM task_versions").await?,
        3
    );
    conn.close().await?;
    assert_eq!(store.task(&fork.id).await?.skill, tasks[0].skill);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_and_tools_live_apart_and_go_with_their_task() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store.db");
    let location = path.to_str().context("temporary path is not UTF-8")?;
    let store = SqliteStore::open(location, Synchronous::Normal).await?;
    let task = store.create_task(new_task(big_skill()), &json!({})).await?;
    let mut conn = connect(&path).await?;
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM pragma_table_info('tasks') WHERE name IN ('skill', 'tools')"
        )
        .await?,
        0
    );
    let stored: (String, String) =
        sqlx::query_as("SELECT v.skill, v.tools FROM tasks t JOIN skill_versions v ON v.hash = t.spec_hash WHERE t.id = ?")
            .bind(&task.id)
            .fetch_one(&mut conn)
            .await?;
    assert_eq!(
        (
            serde_json::from_str::<SkillDefinition>(&stored.0)?,
            serde_json::from_str::<Vec<ToolSpec>>(&stored.1)?
        ),
        (task.skill.clone(), task.tools.clone())
    );
    ensure!(
        stored.0.len() + stored.1.len() > 4_000,
        "the skill and tools are meant to be as big as real ones"
    );
    // Frozen: the point reads keep them once read.
    let changed = sqlx::query(
        "UPDATE skill_versions SET tools = '[]' WHERE hash = (SELECT spec_hash FROM tasks WHERE id = ?)",
    )
    .bind(&task.id)
    .execute(&mut conn)
    .await;
    let refused = changed.err().context("the tools were changed")?.to_string();
    assert!(
        refused.contains("a skill version never changes"),
        "{refused}"
    );
    conn.close().await?;

    // A batch's tasks and a fork have theirs; a deleted task's go with it.
    let batch = store
        .create_batch(&NewBatch {
            name: "b".into(),
            spec: json!({}),
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: Default::default(),
        })
        .await?;
    let queued = store
        .enqueue_tasks(
            &batch.id,
            vec![QueuedTask {
                task: new_task(small_skill()),
                initial_state: json!({}),
                labels: json!({"file": "a.txt"}),
                tenant: None,
            }],
        )
        .await?;
    let fork = store.fork_task(&task.id, 0, &json!({"f": 1}), None).await?;
    assert_eq!(fork.tools, task.tools);
    assert_eq!(store.task(&queued[0]).await?.skill, small_skill().0);
    store.delete_task(&task.id).await?;
    let mut conn = connect(&path).await?;
    let left: Vec<String> =
        sqlx::query_scalar("SELECT task_id FROM task_versions ORDER BY task_id")
            .fetch_all(&mut conn)
            .await?;
    let mut expected = vec![queued[0].clone(), fork.id.clone()];
    expected.sort();
    assert_eq!(left, expected);
    conn.close().await?;
    assert!(matches!(
        store.task(&task.id).await,
        Err(StoreError::NotFound(_))
    ));
    Ok(())
}

/// WAL frames written since the log was empty: the log only grows while a reader holds the
/// snapshot it began with (no checkpoint may copy a frame back, so none is written over).
fn wal_frames(db: &Path, page_size: u64) -> anyhow::Result<u64> {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let len = std::fs::metadata(&wal)?.len();
    Ok(len.saturating_sub(32) / (page_size + 24))
}

/// Empties the WAL (copied back into the database) and begins a read transaction that keeps
/// it from being copied back or started over until the returned connection ends it.
async fn hold_an_empty_wal(path: &Path) -> anyhow::Result<SqliteConnection> {
    let mut conn = connect(path).await?;
    for _ in 0..100 {
        let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut conn)
            .await?;
        if busy == 0 && wal_frames(path, 4096)? == 0 {
            sqlx::raw_sql("BEGIN; SELECT COUNT(*) FROM tasks;")
                .execute(&mut conn)
                .await?;
            return Ok(conn);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    anyhow::bail!("the WAL of {} did not empty", path.display())
}

/// The state after write `step`: a little longer each time, as a task's state is after most
/// writes (an UPDATE that leaves a record the same size writes only the pages it changes).
fn grown(step: u64) -> Value {
    json!({ "notes": "n".repeat(step as usize) })
}

/// WAL frames that `writes` state writes to one task of `skill` add, on the store's own write
/// path.
async fn frames_of_state_writes(
    dir: &Path,
    skill: (SkillDefinition, Vec<ToolSpec>),
    writes: u64,
) -> anyhow::Result<u64> {
    let path = dir.join(format!("{}.db", skill.0.name));
    let location = path.to_str().context("temporary path is not UTF-8")?;
    let store = SqliteStore::open(location, Synchronous::Normal).await?;
    let task = store.create_task(new_task(skill), &json!({})).await?;
    // The first write creates what every later one only changes (its journal and events).
    store
        .commit_unleased_step(&task.id, 0, &state_write(1, grown(1)))
        .await?;
    let mut reader = hold_an_empty_wal(&path).await?;
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut reader)
        .await?;
    for step in 2..writes + 2 {
        store
            .commit_unleased_step(&task.id, step - 1, &state_write(step, grown(step)))
            .await?;
    }
    let frames = wal_frames(&path, page_size as u64)?;
    sqlx::raw_sql("COMMIT").execute(&mut reader).await?;
    // The row that every write rewrote holds no overflow page.
    let overflow = count(
        &mut reader,
        "SELECT COUNT(*) FROM dbstat WHERE name = 'tasks' AND pagetype = 'overflow'",
    )
    .await?;
    assert_eq!(overflow, 0, "{location}");
    reader.close().await?;
    store.close().await;
    Ok(frames)
}

/// The point of `task_specs`: a state write rewrites the task's row, and what it costs in the
/// WAL does not depend on the size of the task's skill and tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_write_costs_the_same_whatever_the_size_of_skill_and_tools() -> anyhow::Result<()> {
    const WRITES: u64 = 40;
    let dir = tempfile::tempdir()?;

    // The measure sees what the columns cost in the row: schema 6 (skill and tools in `tasks`)
    // and the UPDATE a state write makes, on a big and on a small task.
    let mut old_frames = Vec::new();
    for skill in [big_skill(), small_skill()] {
        let path = dir.path().join(format!("old-{}.db", skill.0.name));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let mut conn = SqliteConnection::connect_with(&options).await?;
        create_schema_six(&mut conn).await?;
        let mut task = schema_six_tasks().remove(1);
        (task.skill, task.tools) = skill;
        insert_schema_six_task(&mut conn, &task).await?;
        sqlx::raw_sql("PRAGMA wal_autocheckpoint = 0; PRAGMA wal_checkpoint(TRUNCATE);")
            .execute(&mut conn)
            .await?;
        for step in 1..=WRITES as i64 {
            sqlx::query("UPDATE tasks SET state = ?, version = ?, updated_at = ? WHERE id = ?")
                .bind(grown(step as u64).to_string())
                .bind(step)
                .bind(1_800_000_000_000 + step)
                .bind(&task.id)
                .execute(&mut conn)
                .await?;
        }
        old_frames.push(wal_frames(&path, 4096)?);
        conn.close().await?;
    }
    let [old_big, old_small] = old_frames[..] else {
        unreachable!()
    };
    ensure!(
        old_big >= old_small + 2 * WRITES,
        "schema 6: {old_big} frames for a big skill, {old_small} for a small one"
    );

    // Now, on the store's write path.
    let big = frames_of_state_writes(dir.path(), big_skill(), WRITES).await?;
    let small = frames_of_state_writes(dir.path(), small_skill(), WRITES).await?;
    println!(
        "WAL frames per state write: {:.2} (big skill and tools), {:.2} (small); \
         the row's UPDATE alone at schema 6: {:.2} (big), {:.2} (small)",
        big as f64 / WRITES as f64,
        small as f64 / WRITES as f64,
        old_big as f64 / WRITES as f64,
        old_small as f64 / WRITES as f64,
    );
    assert_eq!(big, small, "WAL frames of {WRITES} state writes");
    Ok(())
}
