//! Retention by partition on PostgreSQL (docs/storage.md, "PostgreSQL: retention by
//! partition"): the per-step tables are partitioned by task id after migration 18, a step lands
//! in its task's partition, `retire_partitions` drops a partition whose tasks are all finished
//! and old and keeps one that holds a live task, and a database migrated from schema 17 with
//! rows in its tables keeps every row readable through the store.
//!
//! Each test works in a schema of its own in the database of `SKILLSTATE_TEST_POSTGRES_URL`
//! (the conformance suite's server when unset; skipped, visibly, when `off`). Periods of two seconds let a test see a
//! period end; the tests wait for that.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/skip.rs"]
mod skip;
#[path = "../../../test-support/store_steps.rs"]
mod store_steps;

use std::str::FromStr;
use std::time::Duration;

use serde_json::{Value, json};
use skillstate_core::recall::RecallQuery;
use skillstate_store::prelude::*;
use skillstate_store::{
    ActionResult, EventQuery, NewTask, PostgresStore, StepCommit, StoreError, TaskStatus,
    migrate_postgres_to, state_at,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgPool};

const TABLES: [&str; 6] = [
    "intents",
    "observations",
    "journal",
    "recall_entries",
    "snapshots",
    "events",
];

/// The server the conformance suite uses (its default when the variable is unset); only
/// `SKILLSTATE_TEST_POSTGRES_URL=off` skips, saying so.
fn postgres_url() -> Option<String> {
    match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => {
            skip::skip_test(
                "SKILLSTATE_TEST_POSTGRES_URL=off",
                "unset it, or set it to a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/test",
            );
            None
        }
        Ok(url) if !url.is_empty() => Some(url),
        _ => Some("postgres://postgres@127.0.0.1:5432/test".to_owned()),
    }
}

/// A fresh schema, a pool of plain connections in it, and its name. With `period_ms`, the
/// partitioning settings are made first with that period (as an operator would).
async fn schema(url: &str, period_ms: Option<i64>) -> (String, PgPool) {
    let name = format!("partitions_{}", uuid::Uuid::now_v7().simple());
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    if let Some(period) = period_ms {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {name}.skillstate_partitioning (period_ms BIGINT NOT NULL); \
             INSERT INTO {name}.skillstate_partitioning VALUES ({period})"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    conn.close().await.unwrap();
    let options = PgConnectOptions::from_str(url)
        .unwrap()
        .options([("search_path", name.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    (name, pool)
}

/// Drops a test's schema once it passed.
async fn drop_schema(url: &str, name: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {name} CASCADE")))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

fn new_task() -> NewTask {
    store_steps::free_task("start of the shelf count".into())
}

fn step_commit(step: u64, state: &Value, patch: Value) -> StepCommit {
    let output = format!("counting shelf {step}: {patch}");
    store_steps::accepted_step(step, state, patch, output, json!({"shelf": step}), 0)
}

/// A task with `steps` accepted steps, each with its action's result; finished when asked.
async fn task_with_steps(store: &PostgresStore, steps: u64, finish: bool) -> String {
    let task = store.create_task(new_task(), &json!({})).await.unwrap();
    let mut state = json!({});
    for step in 1..=steps {
        let commit = step_commit(step, &state, json!({ format!("shelf_{step}"): step }));
        store
            .commit_step(&task.id, step - 1, &commit)
            .await
            .unwrap();
        state = commit.new_state;
        store
            .record_action_result(
                &task.id,
                &ActionResult {
                    step,
                    ok: true,
                    outcome_unknown: false,
                    result: format!("stored on shelf {step}"),
                    next_observation: format!("shelf {} waits", step + 1),
                    env_checkpoint: None,
                    delivered: Vec::new(),
                },
            )
            .await
            .unwrap();
    }
    if finish {
        store
            .set_status(
                &task.id,
                TaskStatus::Completed,
                Some(&json!({"done": true})),
            )
            .await
            .unwrap();
    }
    task.id
}

/// The partition (table name) holding each of `task`'s rows in `table`.
async fn partitions_of(pool: &PgPool, table: &str, task: &str) -> Vec<String> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE task_id = $1"
    )))
    .bind(task)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The suffix of the store's partition holding `task` (`skillstate_partitions`).
async fn suffix_of(pool: &PgPool, task: &str) -> (String, i64) {
    sqlx::query_as(
        "SELECT suffix, to_ms FROM skillstate_partitions WHERE $1 >= COALESCE(lo, '') AND $1 < hi",
    )
    .bind(task)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn table_exists(pool: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn server_now(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Sleeps until the server's clock passes `ms`.
async fn wait_until(pool: &PgPool, ms: i64) {
    loop {
        let now = server_now(pool).await;
        if now > ms {
            return;
        }
        tokio::time::sleep(Duration::from_millis((ms - now).clamp(10, 500) as u64)).await;
    }
}

/// Everything the store reads of `task`, to compare before and after.
async fn readable(store: &PostgresStore, pool: &PgPool, task: &str) -> Value {
    let record = store.task(task).await.unwrap();
    let journal = store.journal(task).await.unwrap();
    let observations = store.observations(task).await.unwrap();
    let intents = store.intents(task).await.unwrap();
    // Events are readable once every older transaction of the server has ended (events.rs):
    // another test's open transaction holds them back for a moment.
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM events WHERE task_id = $1")
        .bind(task)
        .fetch_one(pool)
        .await
        .unwrap();
    let mut events = Vec::new();
    for _ in 0..300 {
        events = store
            .events_after(&EventQuery {
                tenant: None,
                task: Some(task.to_owned()),
                after: None,
                limit: 1000,
            })
            .await
            .unwrap();
        if events.len() as i64 == stored {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        events.len() as i64,
        stored,
        "every event of {task} readable"
    );
    let replayed = state_at(store, task, record.version, record.version)
        .await
        .unwrap();
    assert_eq!(replayed, record.state, "replay rebuilds the stored state");
    let query = RecallQuery::new(Some("shelf"), None).unwrap();
    let hits = store.search_journal(task, &query, None, 100).await.unwrap();
    json!({
        "version": record.version,
        "state": record.state,
        "journal": journal.iter().map(|e| json!([e.step, e.attempt, e.output, e.state_hash])).collect::<Vec<_>>(),
        "observations": observations,
        "intents": intents.iter().map(|i| json!([i.step, i.tool, format!("{:?}", i.result)])).collect::<Vec<_>>(),
        "events": events.iter().map(|e| json!([e.position, e.kind, e.step])).collect::<Vec<_>>(),
        "hits": hits.iter().map(|h| format!("{h:?}")).collect::<Vec<_>>(),
    })
}

#[tokio::test]
async fn after_migration_the_tables_are_partitioned_and_a_step_lands_in_its_partition() {
    let Some(url) = postgres_url() else { return };
    let (name, pool) = schema(&url, None).await;
    let store = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    for table in TABLES {
        let kind: String =
            sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
                .bind(table)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(kind, "p", "{table} is partitioned");
        assert!(table_exists(&pool, &format!("{table}_default")).await);
    }
    let task = task_with_steps(&store, 2, false).await;
    let (suffix, _) = suffix_of(&pool, &task).await;
    assert_ne!(suffix, "legacy", "a new store has no legacy partition");
    for table in TABLES {
        assert_eq!(
            partitions_of(&pool, table, &task).await,
            vec![format!("{table}_{suffix}")],
            "{table}: every row of the task in the partition of its period"
        );
    }
    // The current and the next period exist.
    let periods: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM skillstate_partitions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(periods, 2);
    store.release().await;
    pool.close().await;
    drop_schema(&url, &name).await;
}

#[tokio::test]
async fn gc_drops_a_partition_of_finished_old_tasks_and_keeps_the_others() {
    let Some(url) = postgres_url() else { return };
    let (name, pool) = schema(&url, Some(2_000)).await;
    let store = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    let old = task_with_steps(&store, 3, true).await;
    let old_too = task_with_steps(&store, 1, true).await;
    let (old_suffix, old_end) = suffix_of(&pool, &old).await;
    assert_eq!(suffix_of(&pool, &old_too).await.0, old_suffix);
    // The next period: a live task and a fork of the old one, also live.
    wait_until(&pool, old_end).await;
    store.ensure_partitions().await.unwrap();
    let live = task_with_steps(&store, 4, false).await;
    let old_state = store.task(&old).await.unwrap().state;
    let fork = store.fork_task(&old, 3, &old_state, None).await.unwrap();
    let (live_suffix, _) = suffix_of(&pool, &live).await;
    assert_ne!(live_suffix, old_suffix);
    assert_eq!(suffix_of(&pool, &fork.id).await.0, live_suffix);
    let live_before = readable(&store, &pool, &live).await;
    let fork_before = readable(&store, &pool, &fork.id).await;
    // A period is retired a period (at most a minute) after it ended.
    wait_until(&pool, old_end + 2_000).await;
    let now = server_now(&pool).await;

    let preview = store.retire_partitions(now, true).await.unwrap();
    let previewed = preview.iter().find(|p| p.name == old_suffix).unwrap();
    assert_eq!(previewed.tasks.len(), 2);
    assert!(
        table_exists(&pool, &format!("journal_{old_suffix}")).await,
        "a dry run drops nothing"
    );

    let retired = store.retire_partitions(now, false).await.unwrap();
    let dropped = retired.iter().find(|p| p.name == old_suffix).unwrap();
    let mut expected = vec![old.clone(), old_too.clone()];
    expected.sort();
    assert_eq!(dropped.tasks, expected);
    assert!(retired.iter().all(|p| p.name != live_suffix));
    for table in TABLES {
        assert!(
            !table_exists(&pool, &format!("{table}_{old_suffix}")).await,
            "{table}_{old_suffix} dropped"
        );
        let attached: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1) AND c.relname = $2",
        )
        .bind(table)
        .bind(format!("{table}_{old_suffix}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(attached, 0);
        assert!(table_exists(&pool, &format!("{table}_{live_suffix}")).await);
    }
    for task in [&old, &old_too] {
        assert!(matches!(
            store.task(task).await,
            Err(StoreError::NotFound(_))
        ));
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM journal WHERE task_id = $1) + (SELECT COUNT(*) FROM events WHERE task_id = $1) \
             + (SELECT COUNT(*) FROM task_versions WHERE task_id = $1)",
        )
        .bind(task)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 0);
    }
    // The live task and the fork are intact; the fork lost its parent link only.
    assert_eq!(readable(&store, &pool, &live).await, live_before);
    assert_eq!(readable(&store, &pool, &fork.id).await, fork_before);
    let fork_record = store.task(&fork.id).await.unwrap();
    assert_eq!(fork_record.parent, None);
    // The skill version is still named by the live tasks.
    let versions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM skill_versions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(versions, 1);
    // New steps still commit.
    let record = store.task(&live).await.unwrap();
    let commit = step_commit(5, &record.state, json!({"shelf_5": 5}));
    store.commit_step(&live, 4, &commit).await.unwrap();
    store.release().await;
    pool.close().await;
    drop_schema(&url, &name).await;
}

#[tokio::test]
async fn a_partition_holding_a_live_task_is_kept() {
    let Some(url) = postgres_url() else { return };
    let (name, pool) = schema(&url, Some(2_000)).await;
    let store = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    let finished = task_with_steps(&store, 2, true).await;
    let live = task_with_steps(&store, 2, false).await;
    let (suffix, end) = suffix_of(&pool, &finished).await;
    if suffix_of(&pool, &live).await.0 != suffix {
        // The period ended between the two creations: nothing to learn this time.
        eprintln!("the two tasks fell in different periods; the test proves nothing this run");
        return;
    }
    wait_until(&pool, end + 2_000).await;
    let now = server_now(&pool).await;
    let retired = store.retire_partitions(now, false).await.unwrap();
    assert!(retired.iter().all(|p| p.name != suffix));
    for table in TABLES {
        assert!(table_exists(&pool, &format!("{table}_{suffix}")).await);
    }
    assert_eq!(store.journal(&finished).await.unwrap().len(), 2);
    assert_eq!(store.journal(&live).await.unwrap().len(), 2);
    // Per-task deletion is what is left for the finished one.
    store.delete_task(&finished).await.unwrap();
    assert_eq!(store.journal(&live).await.unwrap().len(), 2);
    store.release().await;
    pool.close().await;
    drop_schema(&url, &name).await;
}

/// Copies every row of the store tables of schema `from` into `to` (the columns `to` has; a
/// later schema may have added some), through `pool`, whose `search_path` is `to` (the tables
/// triggers write).
async fn copy_rows(pool: &PgPool, from: &str, to: &str) {
    for table in [
        "skill_versions",
        "tasks",
        "task_versions",
        "snapshots",
        "observations",
        "journal",
        "intents",
    ] {
        let columns: String = sqlx::query_scalar(
            "SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position) \
             FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
        )
        .bind(to)
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO {to}.{table} ({columns}) SELECT {columns} FROM {from}.{table}"
        )))
        .execute(pool)
        .await
        .unwrap();
    }
    // The observation trigger indexed the copied observations already.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DELETE FROM {to}.recall_entries; \
         INSERT INTO {to}.recall_entries (id, task_id, step, kind, pointer, text) \
         SELECT id, task_id, step, kind, pointer, text FROM {from}.recall_entries; \
         INSERT INTO {to}.events SELECT * FROM {from}.events; \
         SELECT setval('{to}.events_id_seq', (SELECT MAX(id) FROM {to}.events)); \
         SELECT setval('{to}.recall_entries_id_seq', (SELECT MAX(id) FROM {to}.recall_entries))"
    )))
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_database_at_schema_17_with_rows_migrates_online_and_reads_the_same() {
    let Some(url) = postgres_url() else { return };
    // The rows, written by the store itself.
    let (source, source_pool) = schema(&url, None).await;
    let store = PostgresStore::open_in_schema(&url, &source).await.unwrap();
    let mut tasks = Vec::new();
    for n in 0..4 {
        tasks.push(task_with_steps(&store, 3 + n, n % 2 == 0).await);
    }
    let mut before = Vec::new();
    for task in &tasks {
        before.push(readable(&store, &source_pool, task).await);
    }
    store.release().await;

    // A database at schema 17 holding them.
    let (name, pool) = schema(&url, None).await;
    migrate_postgres_to(&pool, 17).await.unwrap();
    copy_rows(&pool, &source, &name).await;
    let old_events: i64 = sqlx::query_scalar("SELECT MAX(id) FROM events")
        .fetch_one(&pool)
        .await
        .unwrap();

    let store = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    let version: i64 = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(version >= 18, "schema {version}");
    for table in TABLES {
        let parent: Option<String> = sqlx::query_scalar(
            "SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = to_regclass($1)",
        )
        .bind(format!("{table}_legacy"))
        .fetch_optional(&pool)
        .await
        .unwrap();
        assert_eq!(
            parent.as_deref(),
            Some(table),
            "{table}_legacy is a partition of {table}"
        );
        for task in &tasks {
            assert_eq!(
                partitions_of(&pool, table, task).await,
                vec![format!("{table}_legacy")]
            );
        }
    }
    for (task, expected) in tasks.iter().zip(&before) {
        assert_eq!(
            &readable(&store, &pool, task).await,
            expected,
            "task {task} reads the same"
        );
    }
    // Writes go on: a step of an old task, a new task; ids continue.
    let record = store.task(&tasks[1]).await.unwrap();
    let commit = step_commit(record.version + 1, &record.state, json!({"after": true}));
    store
        .commit_step(&tasks[1], record.version, &commit)
        .await
        .unwrap();
    let new_events: i64 = sqlx::query_scalar("SELECT MAX(id) FROM events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(new_events > old_events);
    let fresh = task_with_steps(&store, 1, false).await;
    assert_eq!(store.journal(&fresh).await.unwrap().len(), 1);
    // Opening again does not migrate again.
    store.release().await;
    let again = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    assert_eq!(
        again.journal(&tasks[1]).await.unwrap().len() as u64,
        record.version + 1
    );
    again.release().await;
    pool.close().await;
    source_pool.close().await;
    drop_schema(&url, &name).await;
    drop_schema(&url, &source).await;
}

/// The measurement of docs/storage.md ("PostgreSQL: retention by partition"): opens the
/// database of `SKILLSTATE_PARTITION_BENCH_URL` (at schema 17, filled as the docs say), which
/// runs the online migration, printing the time of each of its steps.
#[tokio::test]
#[ignore = "a measurement on a database prepared by hand"]
async fn measure_online_migration() {
    let Ok(url) = std::env::var("SKILLSTATE_PARTITION_BENCH_URL") else {
        skip::skip_test(
            "SKILLSTATE_PARTITION_BENCH_URL is unset",
            "prepare a database as docs/storage.md says and point it there",
        );
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter("skillstate_store=info")
        .try_init();
    let started = std::time::Instant::now();
    let store = PostgresStore::open(&url).await.unwrap();
    println!("migrated in {:.1} s", started.elapsed().as_secs_f64());
    store.release().await;
}

/// Writes `n` finished tasks of 100 steps each (journal, intents, events; a snapshot and an
/// observation) whose ids lie in [from_ms, to_ms), straight in SQL. Returns their ids.
async fn fill_period(pool: &PgPool, from_ms: i64, to_ms: i64, n: i64, tag: &str) -> Vec<String> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "INSERT INTO skill_versions (hash, name, version, skill, tools, created_at) \
         VALUES ('bench', 'bench', NULL, '{{}}', '[]', 0) ON CONFLICT DO NOTHING; \
         CREATE TABLE bench_ids_{tag} AS SELECT i, \
           lpad(to_hex(ms >> 16), 8, '0') || '-' || lpad(to_hex(ms & 65535), 4, '0') || '-7' \
           || substr(md5('{tag}' || i), 1, 3) || '-8' || substr(md5('{tag}' || i), 4, 3) || '-' \
           || substr(md5('{tag}' || i), 7, 12) AS id \
         FROM (SELECT i, {from_ms} + (i * ({to_ms} - {from_ms} - 1)) / {n} AS ms FROM generate_series(0, {n} - 1) i) s; \
         INSERT INTO tasks (id, skill_name, spec_hash, context, model, status, state, version, created_at, updated_at) \
           SELECT id, 'bench', 'bench', 'state', 'scripted:bench', 'completed', '{{}}', 100, 0, 0 FROM bench_ids_{tag}; \
         INSERT INTO task_versions (task_id, from_step, spec_hash) SELECT id, 0, 'bench' FROM bench_ids_{tag}; \
         INSERT INTO snapshots (task_id, step, state, state_hash) SELECT id, 0, '{{}}', md5(id) FROM bench_ids_{tag}; \
         INSERT INTO observations (task_id, step, text) SELECT id, 1, 'start' FROM bench_ids_{tag}; \
         INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, state_hash, prompt_tokens, prompt_hash, latency_ms, created_at) \
           SELECT id, s, 1, 'accepted', '{{\"reasoning\": \"step ' || s || ' of a bench task\"}}', '{{\"n\": ' || s || '}}', \
                  '{{\"tool\": \"wait\", \"args\": {{}}}}', md5(id || s), 100, 'x', 5, s \
           FROM bench_ids_{tag}, generate_series(1, 100) s; \
         INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, ok, result, created_at, finished_at) \
           SELECT id, s, 'wait', '{{}}', id || ':' || s, 'read_only', 'done', true, 'waited', s, s FROM bench_ids_{tag}, generate_series(1, 100) s; \
         INSERT INTO events (task_id, kind, step, data, created_at) \
           SELECT id, 'step', s, '{{}}', s FROM bench_ids_{tag}, generate_series(1, 100) s"
    )))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM bench_ids_{tag} ORDER BY id"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Dead tuples in the tables (and partitions) named `like`, once the statistics are flushed.
async fn dead_tuples(pool: &PgPool, schema: &str, like: &str) -> i64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    sqlx::query_scalar(
        "SELECT COALESCE(SUM(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE $2",
    )
    .bind(schema)
    .bind(like)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The gc measurement of docs/storage.md: `SKILLSTATE_GC_BENCH_TASKS` (10,000 by default)
/// finished tasks of 100 steps deleted one by one with `delete_task`, against as many in a
/// partition of their own retired by `retire_partitions`: wall time and dead tuples left.
/// Periods of a minute; the run waits about two of them.
#[tokio::test]
#[ignore = "a measurement; takes minutes"]
async fn measure_gc() {
    let Some(url) = postgres_url() else { return };
    let n: i64 = std::env::var("SKILLSTATE_GC_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (name, pool) = schema(&url, Some(60_000)).await;
    let store = PostgresStore::open_in_schema(&url, &name).await.unwrap();
    let periods: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT suffix, from_ms, to_ms FROM skillstate_partitions ORDER BY from_ms")
            .fetch_all(&pool)
            .await
            .unwrap();
    let (dropped, deleted) = (&periods[0], &periods[1]);
    // Autovacuum would reclaim the dead tuples before they are counted.
    for (suffix, ..) in &periods {
        for table in TABLES {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "ALTER TABLE {table}_{suffix} SET (autovacuum_enabled = false)"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    }
    for table in ["tasks", "task_versions"] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    let started = std::time::Instant::now();
    fill_period(&pool, dropped.1, dropped.2, n, "dropped").await;
    let one_by_one = fill_period(&pool, deleted.1, deleted.2, n, "deleted").await;
    println!(
        "wrote 2 x {n} tasks x 100 steps in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    sqlx::raw_sql("ANALYZE").execute(&pool).await.unwrap();
    let size: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pg_size_pretty(SUM(pg_total_relation_size(c.oid))) FROM pg_class c WHERE c.relname IN ({}) AND c.relnamespace = $1::regnamespace",
        TABLES.iter().map(|t| format!("'{t}_{}'", deleted.0)).collect::<Vec<_>>().join(", ")
    )))
    .bind(&name)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("one period's partitions: {size}");

    let started = std::time::Instant::now();
    for id in &one_by_one {
        store.delete_task(id).await.unwrap();
    }
    let took = started.elapsed().as_secs_f64();
    let dead = dead_tuples(&pool, &name, &format!("%{}", deleted.0)).await;
    let dead_tasks = dead_tuples(&pool, &name, "task%").await;
    println!(
        "delete_task x {n}: {took:.1} s, dead tuples: {dead} in the period's partitions, {dead_tasks} in tasks and task_versions"
    );

    wait_until(&pool, dropped.2 + 60_000).await;
    let now = server_now(&pool).await;
    let started = std::time::Instant::now();
    let retired = store.retire_partitions(now, false).await.unwrap();
    let took = started.elapsed().as_secs_f64();
    let gone = retired.iter().find(|p| p.name == dropped.0).unwrap();
    assert_eq!(gone.tasks.len() as i64, n);
    let dead_after = dead_tuples(&pool, &name, "task%").await;
    println!(
        "retire_partitions ({n} tasks): {took:.1} s, dead tuples: 0 in the dropped partitions (gone), {} more in tasks and task_versions",
        dead_after - dead_tasks
    );
    store.release().await;
    pool.close().await;
    drop_schema(&url, &name).await;
}
