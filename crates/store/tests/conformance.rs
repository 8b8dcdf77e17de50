//! One conformance suite for every `Store` backend. Each test runs the same scenario on a real
//! SQLite file, on PostgreSQL (in a schema of its own, dropped afterwards) and on PostgreSQL
//! through PgBouncer in transaction mode, so the backends cannot drift apart.
//!
//! PostgreSQL is reached at `SKILLSTATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). Setting it to `off` runs the SQLite part only and
//! says so; an unreachable server is a test failure, not a silent skip.
//!
//! The third backend goes through the PgBouncer at `SKILLSTATE_TEST_PGBOUNCER_URL` (`scripts/test`
//! starts one for the whole run), else through one each test starts for itself
//! (`test-support/pgbouncer.rs`); `off` skips it, visibly. Its settings are docs/storage.md's
//! (`pool_mode = transaction`, `server_reset_query = DEALLOCATE ALL`,
//! `server_reset_query_always = 1`), checked on PgBouncer's admin console, and the store is
//! opened with `transaction_pooler`. A scenario's schema cannot come from startup `options`
//! through the pooler, so each scenario gets a role of its own whose `search_path` is its schema
//! (PgBouncer pools server connections per database and user); both are dropped afterwards.
//! The operator's helpers (`Db::execute`, `Db::count`) connect to PostgreSQL directly.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/skip.rs"]
mod skip;

#[path = "../../../test-support/pgbouncer.rs"]
mod pgbouncer;

#[path = "../../../test-support/store_steps.rs"]
mod store_steps;
use store_steps::free_skill;

#[path = "conformance/boards.rs"]
mod boards;

#[path = "conformance/inbox.rs"]
mod inbox;

#[path = "conformance/queue.rs"]
mod queue;

#[path = "conformance/recall.rs"]
mod recall;

#[path = "conformance/service.rs"]
mod service;

#[path = "conformance/spec_hash.rs"]
mod spec_hash;

#[path = "conformance/state_writes.rs"]
mod state_writes;

#[path = "conformance/versions.rs"]
mod versions;

use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Once};

use anyhow::{Context, bail, ensure};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::tool::control_specs;
use skillstate_core::{ContextStrategy, SkillDefinition, StatePatch};
use skillstate_store::*;
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::Barrier;

const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

// ---------------------------------------------------------------------------------------------
// Backends and isolated databases

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
    /// PostgreSQL through PgBouncer in transaction mode, the store opened with
    /// `transaction_pooler`.
    PgBouncer,
}

impl Backend {
    /// PostgreSQL, directly or through the pooler: the same schema and SQL.
    fn is_postgres(self) -> bool {
        matches!(self, Self::Postgres | Self::PgBouncer)
    }
}

fn postgres_url() -> Option<String> {
    match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => None,
        Ok(url) if !url.is_empty() => Some(url),
        _ => Some(DEFAULT_POSTGRES_URL.to_owned()),
    }
}

fn backends() -> Vec<Backend> {
    if postgres_url().is_none() {
        static NOTICE: Once = Once::new();
        NOTICE.call_once(|| {
            skip::skip_part(
                "the PostgreSQL part of every test (directly and through PgBouncer)",
                "SKILLSTATE_TEST_POSTGRES_URL=off",
                "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
            )
        });
        return vec![Backend::Sqlite];
    }
    if !pgbouncer::Pooler::enabled() {
        static NOTICE: Once = Once::new();
        NOTICE.call_once(|| {
            skip::skip_part(
                "the PgBouncer (transaction mode) part of every test",
                &format!("{}=off", pgbouncer::POOLER_ENV),
                pgbouncer::ENABLE,
            )
        });
        return vec![Backend::Sqlite, Backend::Postgres];
    }
    vec![Backend::Sqlite, Backend::Postgres, Backend::PgBouncer]
}

/// One empty database for one scenario: a temporary SQLite file, or a fresh PostgreSQL schema.
#[derive(Clone)]
struct Db {
    backend: Backend,
    target: Target,
}

#[derive(Clone)]
enum Target {
    Sqlite {
        path: String,
        _dir: Arc<tempfile::TempDir>,
    },
    /// `url` and `schema` reach the database directly; the operator's helpers use them.
    Postgres {
        url: String,
        schema: String,
        /// Set on `Backend::PgBouncer`: the store goes through the pooler.
        pooled: Option<Arc<Pooled>>,
    },
}

/// A scenario's way through PgBouncer: its role (whose `search_path` is its schema) and the
/// pooler, kept running while the scenario uses it.
struct Pooled {
    /// The database through the pooler as the scenario's role, without `transaction_pooler`.
    url: String,
    role: pgbouncer::RoleSchema,
    _pooler: pgbouncer::Pooler,
}

impl Db {
    async fn create(backend: Backend) -> anyhow::Result<Self> {
        let target = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let path = dir
                    .path()
                    .join("store.db")
                    .to_str()
                    .context("temporary path is not UTF-8")?
                    .to_owned();
                Target::Sqlite {
                    path,
                    _dir: Arc::new(dir),
                }
            }
            Backend::Postgres | Backend::PgBouncer => {
                let url = postgres_url().context("PostgreSQL is switched off")?;
                // Fail early, with the way out, rather than deep inside a scenario.
                let connection = sqlx::PgConnection::connect(&url).await.with_context(|| {
                    format!(
                        "cannot reach PostgreSQL at {url}; start it with \
                         `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, \
                         point SKILLSTATE_TEST_POSTGRES_URL elsewhere, or set it to `off`"
                    )
                })?;
                connection.close().await?;
                if backend == Backend::PgBouncer {
                    let pooler = pgbouncer::Pooler::get(&url)
                        .await?
                        .context("PgBouncer is switched off")?;
                    let role = pgbouncer::RoleSchema::create(&url, "conformance_pooled").await?;
                    let pooled = Pooled {
                        url: pooler.url_as(&role.name, "")?,
                        role,
                        _pooler: pooler,
                    };
                    Target::Postgres {
                        url,
                        schema: pooled.role.name.clone(),
                        pooled: Some(Arc::new(pooled)),
                    }
                } else {
                    let schema = format!("conformance_{}", uuid::Uuid::now_v7().simple());
                    Target::Postgres {
                        url,
                        schema,
                        pooled: None,
                    }
                }
            }
        };
        Ok(Self { backend, target })
    }

    async fn open(&self) -> Result<Arc<dyn Store>> {
        self.open_with(DEFAULT_SNAPSHOT_EVERY).await
    }

    async fn open_with(&self, snapshot_every: u64) -> Result<Arc<dyn Store>> {
        Ok(match &self.target {
            Target::Sqlite { path, .. } => Arc::new(
                SqliteStore::open(path, Synchronous::Normal)
                    .await?
                    .with_snapshot_every(snapshot_every),
            ),
            Target::Postgres {
                pooled: Some(pooled),
                ..
            } => Arc::new(
                PostgresStore::open_with(&pooled.url, OpenMode::ReadWrite, true)
                    .await?
                    .with_snapshot_every(snapshot_every),
            ),
            Target::Postgres { url, schema, .. } => Arc::new(
                PostgresStore::open_in_schema(url, schema)
                    .await?
                    .with_snapshot_every(snapshot_every),
            ),
        })
    }

    /// What `skillstate_store::open` takes for this database.
    fn location(&self) -> String {
        match &self.target {
            Target::Sqlite { path, .. } => path.clone(),
            // Through the pooler the URL says so; the role brings the schema.
            Target::Postgres {
                pooled: Some(pooled),
                ..
            } => format!("{}?transaction_pooler=true", pooled.url),
            Target::Postgres { url, schema, .. } => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}options=-c%20search_path%3D{schema}")
            }
        }
    }

    /// Runs `sql` outside any store, as an operator (or an attacker) would.
    async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        let sql = AssertSqlSafe(sql.to_owned());
        Ok(match &self.target {
            Target::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
                let done = sqlx::raw_sql(sql).execute(&mut conn).await?;
                conn.close().await?;
                done.rows_affected()
            }
            Target::Postgres { url, schema, .. } => {
                let mut conn = self.pg_connection(url, schema).await?;
                let done = sqlx::raw_sql(sql).execute(&mut conn).await?;
                conn.close().await?;
                done.rows_affected()
            }
        })
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        let sql = AssertSqlSafe(sql.to_owned());
        Ok(match &self.target {
            Target::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
                let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
                conn.close().await?;
                n
            }
            Target::Postgres { url, schema, .. } => {
                let mut conn = self.pg_connection(url, schema).await?;
                let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
                conn.close().await?;
                n
            }
        })
    }

    async fn pg_connection(&self, url: &str, schema: &str) -> anyhow::Result<sqlx::PgConnection> {
        let options = sqlx::postgres::PgConnectOptions::from_str(url)?
            .options([("search_path", schema.to_owned())]);
        Ok(sqlx::PgConnection::connect_with(&options).await?)
    }

    async fn destroy(&self) -> anyhow::Result<()> {
        if let Target::Postgres {
            pooled: Some(pooled),
            ..
        } = &self.target
        {
            return pooled.role.drop_now().await;
        }
        if let Target::Postgres { url, schema, .. } = &self.target {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE"
            )))
            .execute(&mut conn)
            .await?;
            conn.close().await?;
        }
        Ok(())
    }
}

/// Runs `scenario` once per backend, each time on a fresh database that is removed afterwards,
/// also when the scenario panics.
async fn on_each_backend<F, Fut>(scenario: F) -> anyhow::Result<()>
where
    F: Fn(Db) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    for backend in backends() {
        let db = Db::create(backend).await?;
        let outcome = tokio::spawn(scenario(db.clone())).await;
        db.destroy().await?;
        match outcome {
            Ok(result) => result.with_context(|| format!("scenario failed on {backend:?}"))?,
            Err(error) if error.is_panic() => {
                eprintln!("scenario panicked on {backend:?}");
                std::panic::resume_unwind(error.into_panic());
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Test data

fn new_task() -> NewTask {
    store_steps::free_task("start".into())
}

fn accepted(step: u64, patch: &Value, hash: &str) -> JournalEntry {
    JournalEntry {
        step,
        attempt: 1,
        verdict: Verdict::Accepted,
        output: patch.to_string(),
        patch: Some(patch.clone()),
        action: Some(json!({"tool": "wait", "args": {}})),
        errors: None,
        state_hash: Some(hash.to_owned()),
        prompt_tokens: 1,
        output_tokens: Some(7),
        prompt_hash: "x".into(),
        usage: None,
        latency_ms: 0,
        created_at: 0,
        author: None,
        board_version: None,
    }
}

fn rejected(step: u64, attempt: u32) -> JournalEntry {
    JournalEntry {
        step,
        attempt,
        verdict: Verdict::Rejected,
        output: format!("not JSON, attempt {attempt}"),
        patch: None,
        action: None,
        errors: Some(json!([{"kind": "parse", "message": "expected a JSON object"}])),
        state_hash: None,
        prompt_tokens: 20,
        output_tokens: None,
        prompt_hash: "p".into(),
        usage: Some(json!({"input_tokens": 20, "output_tokens": 5})),
        latency_ms: 12,
        created_at: 1_700_000_000_000,
        author: None,
        board_version: None,
    }
}

/// The commit of step `step` that applies the merge patch `patch` to `state`.
fn step_commit(step: u64, state: &Value, patch: Value, with_intent: bool) -> StepCommit {
    let new_state = StatePatch::from_value(&patch)
        .unwrap()
        .apply(state)
        .unwrap();
    StepCommit {
        entry: accepted(step, &patch, &state_hash(&new_state)),
        new_state,
        intent: with_intent.then(|| NewIntent {
            tool: "store".into(),
            args: json!({"item": format!("item_{step}"), "shelf": format!("shelf_{step}")}),
            idempotency_key: format!("key-{step}"),
            side_effect: "effectful".into(),
        }),
        status: None,
        previous_result: None,
        next_observation: None,
        world: None,
        upgrade: None,
    }
}

fn action_result(step: u64) -> ActionResult {
    ActionResult {
        step,
        ok: step % 2 == 1,
        outcome_unknown: false,
        result: format!("result of step {step}"),
        next_observation: format!("observation {}", step + 1),
        env_checkpoint: Some(json!({"tick": step})),
        delivered: Vec::new(),
    }
}

/// Commits steps `1..=steps`, each with an intent and its result, and returns the state after
/// every step (index = step). At the steps in `rejected_first` a rejected attempt 1 precedes the
/// accepted attempt 2.
async fn run_steps(
    store: &dyn Store,
    task: &str,
    steps: u64,
    rejected_first: &[u64],
) -> anyhow::Result<Vec<Value>> {
    let mut states = vec![store.task(task).await?.state];
    for step in 1..=steps {
        let mut commit = step_commit(
            step,
            &states[step as usize - 1],
            json!({ format!("k{step}"): step }),
            true,
        );
        if rejected_first.contains(&step) {
            store.record_rejection(task, &rejected(step, 1)).await?;
            commit.entry.attempt = 2;
        }
        store.commit_step(task, step - 1, &commit).await?;
        store
            .record_action_result(task, &action_result(step))
            .await?;
        states.push(commit.new_state);
    }
    Ok(states)
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

// ---------------------------------------------------------------------------------------------
// Tasks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_found_by_id_and_unique_prefix() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let spec = NewTask {
            tools: control_specs(),
            context: ContextStrategy::Window,
            context_budget: Some(1234),
            environment: Some(json!({"kind": "warehouse", "seed": 7})),
            env_checkpoint: Some(json!({"tick": 0})),
            opening_observation: "alert: shelf_3 is empty — restock".into(),
            ..new_task()
        };
        let initial = json!({"shelf_count": 500, "inventory": {"shelf_1": "item_1"}});
        let first = store.create_task(spec.clone(), &initial).await?;
        assert_eq!(first.version, 0);
        assert_eq!(first.status, TaskStatus::Running);
        assert_eq!(first.state, initial);
        assert_eq!(first.skill, spec.skill);
        assert_eq!(first.tools, spec.tools);
        assert_eq!(first.context, ContextStrategy::Window);
        assert_eq!(first.context_budget, Some(1234));
        assert_eq!(first.model, spec.model);
        assert_eq!(first.environment, spec.environment);
        assert_eq!(first.env_checkpoint, spec.env_checkpoint);
        assert_eq!(first.outcome, None);
        assert_eq!(first.parent, None);
        assert_eq!(
            store.observation(&first.id, 1).await?.as_deref(),
            Some(spec.opening_observation.as_str())
        );
        assert_eq!(
            store.snapshot_before(&first.id, 0).await?,
            Some((0, initial.clone()))
        );

        let second = store.create_task(new_task(), &json!({})).await?;
        let third = store.create_task(new_task(), &json!({})).await?;
        assert_eq!(store.task(&first.id).await?, first);

        // Time-ordered ids made moments apart share their leading characters.
        let shared = common_prefix_len(&first.id, &second.id)
            .min(common_prefix_len(&first.id, &third.id))
            .min(common_prefix_len(&second.id, &third.id));
        assert!(shared > 0, "{} {} {}", first.id, second.id, third.id);
        match store.task(&first.id[..shared]).await {
            Err(StoreError::Ambiguous { count, .. }) => assert_eq!(count, 3),
            other => bail!("expected an ambiguous prefix, got {other:?}"),
        }
        let unique = common_prefix_len(&third.id, &second.id)
            .max(common_prefix_len(&third.id, &first.id))
            + 1;
        assert_eq!(store.task(&third.id[..unique]).await?.id, third.id);
        let upper = third.id[..unique].to_ascii_uppercase();
        assert_eq!(store.task(&upper).await?.id, third.id);
        assert_eq!(store.task(&format!("  {}  ", third.id)).await?.id, third.id);

        for missing in ["0000", "", "not-hex", "%", "_"] {
            match store.task(missing).await {
                Err(StoreError::NotFound(what)) => assert_eq!(what, missing),
                other => bail!("`{missing}` should match nothing, got {other:?}"),
            }
        }

        let listed = store.list_tasks().await?;
        let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
        let mut expected = [&first, &second, &third];
        expected.sort_by_key(|t| (t.created_at, t.id.clone()));
        let expected: Vec<&str> = expected.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, expected);
        assert!(listed.iter().all(|t| t.version == 0
            && t.skill_name == "free"
            && t.status == Some(TaskStatus::Running)
            && t.problem.is_none()));
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Steps

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_commits_journal_state_and_intent_and_its_result_the_next_observation()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(2).await?;
        let initial = json!({"inventory": {}});
        let task = store.create_task(new_task(), &initial).await?;

        let mut first = step_commit(
            1,
            &initial,
            json!({"inventory": {"shelf_1": "item_1"}}),
            true,
        );
        first.entry.usage = Some(json!({"input_tokens": 1100, "output_tokens": 40}));
        first.entry.latency_ms = 850;
        first.entry.prompt_tokens = 1100;
        first.entry.created_at = 1_700_000_000_123;
        store.commit_step(&task.id, 0, &first).await?;

        let stored = store.task(&task.id).await?;
        assert_eq!(stored.version, 1);
        assert_eq!(stored.state, first.new_state);
        assert_eq!(stored.status, TaskStatus::Running);
        assert_eq!(store.journal(&task.id).await?, [first.entry.clone()]);
        let intent = first.intent.clone().unwrap();
        let pending = IntentRecord {
            step: 1,
            tool: intent.tool,
            args: intent.args,
            idempotency_key: intent.idempotency_key,
            side_effect: intent.side_effect,
            done: false,
            ok: None,
            result: None,
        };
        assert_eq!(
            store.intents(&task.id).await?,
            std::slice::from_ref(&pending)
        );
        // The point read agrees, and finds nothing where no intent is.
        assert_eq!(store.intent(&task.id, 1).await?, Some(pending.clone()));
        assert_eq!(store.intent(&task.id, 0).await?, None);
        assert_eq!(store.intent(&task.id, 2).await?, None);
        assert_eq!(store.intent("no-such-task", 1).await?, None);
        // Step 1 is not a multiple of 2: no snapshot yet.
        assert_eq!(
            store.snapshot_before(&task.id, 1).await?,
            Some((0, initial.clone()))
        );

        store
            .record_action_result(&task.id, &action_result(1))
            .await?;
        let done = IntentRecord {
            done: true,
            ok: Some(true),
            result: Some("result of step 1".into()),
            ..pending
        };
        assert_eq!(store.intents(&task.id).await?, std::slice::from_ref(&done));
        assert_eq!(store.intent(&task.id, 1).await?, Some(done.clone()));
        assert_eq!(
            store.observations(&task.id).await?,
            [(1, "start".to_owned()), (2, "observation 2".to_owned())]
        );
        assert_eq!(
            store.observation(&task.id, 2).await?.as_deref(),
            Some("observation 2")
        );
        assert_eq!(store.observation(&task.id, 3).await?, None);
        assert_eq!(
            store.task(&task.id).await?.env_checkpoint,
            Some(json!({"tick": 1}))
        );

        // A result can be recorded once; the second attempt changes nothing.
        let mut again = action_result(1);
        again.next_observation = "a second observation 2".into();
        match store.record_action_result(&task.id, &again).await {
            Err(StoreError::Corrupt { step: 1, .. }) => {}
            other => bail!("expected Corrupt at step 1, got {other:?}"),
        }
        assert_eq!(store.intents(&task.id).await?, [done]);
        assert_eq!(store.observations(&task.id).await?.len(), 2);

        // A finishing step sets status and outcome with the state, and snapshots step 2.
        let mut finish = step_commit(2, &first.new_state, json!({"done": true}), false);
        finish.status = Some((TaskStatus::Completed, Some(json!({"result": "ok"}))));
        store.commit_step(&task.id, 1, &finish).await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.version, 2);
        assert_eq!(stored.status, TaskStatus::Completed);
        assert_eq!(stored.outcome, Some(json!({"result": "ok"})));
        assert_eq!(store.intents(&task.id).await?.len(), 1);
        assert_eq!(
            store.snapshot_before(&task.id, 5).await?,
            Some((2, finish.new_state.clone()))
        );
        assert_eq!(
            store.accepted_patches(&task.id, 1, 2).await?,
            [
                (
                    1,
                    first.entry.patch.clone().unwrap(),
                    first.entry.state_hash.clone().unwrap()
                ),
                (
                    2,
                    json!({"done": true}),
                    finish.entry.state_hash.clone().unwrap()
                ),
            ]
        );

        // set_status keeps the outcome unless it is given a new one.
        store
            .set_status(&task.id, TaskStatus::AwaitingInput, None)
            .await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.status, TaskStatus::AwaitingInput);
        assert_eq!(stored.outcome, Some(json!({"result": "ok"})));
        store
            .set_status(&task.id, TaskStatus::Failed, Some(&json!({"error": "x"})))
            .await?;
        assert_eq!(
            store.task(&task.id).await?.outcome,
            Some(json!({"error": "x"}))
        );
        match store.set_status("0000", TaskStatus::Failed, None).await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

/// A step commit may carry the previous step's action result: both land in one transaction,
/// and a commit refused for its version writes neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_result_lands_with_the_next_step_or_not_at_all() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let task = store.create_task(new_task(), &initial).await?;
        let first = step_commit(1, &initial, json!({"a": 1}), true);
        store.commit_step(&task.id, 0, &first).await?;

        // Stale version: the step is refused, and the result it carried is not written.
        let mut stale = step_commit(2, &first.new_state, json!({"b": 2}), true);
        stale.previous_result = Some(action_result(1));
        match store.commit_step(&task.id, 0, &stale).await {
            Err(StoreError::Conflict { .. }) => {}
            other => bail!("expected Conflict, got {other:?}"),
        }
        assert!(!store.intents(&task.id).await?[0].done);
        assert_eq!(store.observation(&task.id, 2).await?, None);
        assert_eq!(store.journal(&task.id).await?.len(), 1);

        // A result for a step with no pending intent is refused, and the step with it.
        let mut orphan = step_commit(2, &first.new_state, json!({"b": 2}), true);
        orphan.previous_result = Some(action_result(7));
        match store.commit_step(&task.id, 1, &orphan).await {
            Err(StoreError::Corrupt { step: 7, .. }) => {}
            other => bail!("expected Corrupt at step 7, got {other:?}"),
        }
        assert_eq!(store.task(&task.id).await?.version, 1);
        assert_eq!(store.journal(&task.id).await?.len(), 1);

        // The right version: result and step land together.
        let mut second = step_commit(2, &first.new_state, json!({"b": 2}), true);
        second.previous_result = Some(action_result(1));
        store.commit_step(&task.id, 1, &second).await?;
        let intents = store.intents(&task.id).await?;
        assert_eq!(intents.len(), 2);
        assert!(intents[0].done && !intents[1].done);
        assert_eq!(intents[0].result.as_deref(), Some("result of step 1"));
        assert_eq!(
            store.observation(&task.id, 2).await?.as_deref(),
            Some("observation 2")
        );
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.version, 2);
        assert_eq!(stored.state, second.new_state);
        assert_eq!(stored.env_checkpoint, Some(json!({"tick": 1})));
        Ok(())
    })
    .await
}

/// A held-back result's world checkpoint and the step's own world land in the task's row with
/// the step: the step's world wins, a result without a checkpoint keeps the stored one and its
/// step. (PostgreSQL writes the row once for both since schema 20.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_back_checkpoint_and_the_steps_world_land_in_one_write() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let task = store.create_task(new_task(), &initial).await?;
        let mut state = initial;
        let mut commit_with = |step: u64, result: Option<ActionResult>| {
            let mut commit = step_commit(step, &state, json!({"n": step}), true);
            commit.previous_result = result;
            state = commit.new_state.clone();
            commit
        };
        store
            .commit_step(&task.id, 0, &commit_with(1, None))
            .await?;
        // The result of step 1 carries a checkpoint: it is the task's, taken at step 1.
        store
            .commit_step(&task.id, 1, &commit_with(2, Some(action_result(1))))
            .await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(
            (stored.env_checkpoint, stored.env_checkpoint_step),
            (Some(json!({"tick": 1})), Some(1))
        );
        // A result without one keeps it.
        let plain = ActionResult {
            env_checkpoint: None,
            ..action_result(2)
        };
        store
            .commit_step(&task.id, 2, &commit_with(3, Some(plain)))
            .await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(
            (stored.env_checkpoint, stored.env_checkpoint_step),
            (Some(json!({"tick": 1})), Some(1))
        );
        // A stop that carries the world and a result with a checkpoint: the world wins.
        let mut stop = commit_with(4, Some(action_result(3)));
        stop.intent = None;
        stop.status = Some((TaskStatus::Completed, None));
        stop.world = Some(json!({"final": true}));
        store.commit_step(&task.id, 3, &stop).await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.status, TaskStatus::Completed);
        assert_eq!(stored.version, 4);
        assert_eq!(
            (stored.env_checkpoint, stored.env_checkpoint_step),
            (Some(json!({"final": true})), Some(3))
        );
        // Every result landed, each with its observation.
        let intents = store.intents(&task.id).await?;
        assert_eq!(intents.len(), 3);
        assert!(intents.iter().all(|i| i.done));
        assert_eq!(
            store.observation(&task.id, 4).await?.as_deref(),
            Some("observation 4")
        );
        Ok(())
    })
    .await
}

/// The environment checkpoint records the step whose result it includes: a result without one
/// keeps the stored checkpoint and its step, and a step that stops the task may carry the
/// world as of the step before it. A refused commit writes neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_checkpoint_keeps_the_step_it_was_taken_at() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let task = store.create_task(new_task(), &initial).await?;
        assert_eq!(store.task(&task.id).await?.env_checkpoint_step, None);
        let mut state = initial;
        for step in 1..=3 {
            let commit = step_commit(step, &state, json!({"n": step}), true);
            store.commit_step(&task.id, step - 1, &commit).await?;
            state = commit.new_state;
            let result = ActionResult {
                // Only the first result carries a checkpoint.
                env_checkpoint: (step == 1).then(|| json!({"tick": step})),
                ..action_result(step)
            };
            store.record_action_result(&task.id, &result).await?;
        }
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.version, 3);
        assert_eq!(stored.env_checkpoint, Some(json!({"tick": 1})));
        assert_eq!(stored.env_checkpoint_step, Some(1));

        // A stop refused for its version leaves the checkpoint as it was.
        let mut stop = step_commit(4, &state, json!({"n": 4}), false);
        stop.status = Some((TaskStatus::Completed, None));
        stop.world = Some(json!({"tick": 3}));
        match store.commit_step(&task.id, 2, &stop).await {
            Err(StoreError::Conflict { .. }) => {}
            other => bail!("expected Conflict, got {other:?}"),
        }
        assert_eq!(store.task(&task.id).await?.env_checkpoint_step, Some(1));
        store.commit_step(&task.id, 3, &stop).await?;
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.status, TaskStatus::Completed);
        assert_eq!(stored.env_checkpoint, Some(json!({"tick": 3})));
        assert_eq!(stored.env_checkpoint_step, Some(3));
        Ok(())
    })
    .await
}

/// A step with no action (state written through the service) may carry the observation the
/// step after it starts from; it is written with the step, or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_without_an_action_carries_the_next_observation() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({});
        let task = store.create_task(new_task(), &initial).await?;
        let mut write = step_commit(1, &initial, json!({"a": 1}), false);
        write.entry.author = Some("key-7".into());
        write.next_observation = Some(NextObservation::Text("start, carried".into()));
        let mut stale = write.clone();
        stale.next_observation = Some(NextObservation::Text("never".into()));
        match store.commit_step(&task.id, 5, &stale).await {
            Err(StoreError::Conflict { .. }) => {}
            other => bail!("expected Conflict, got {other:?}"),
        }
        assert_eq!(store.observation(&task.id, 2).await?, None);
        store.commit_step(&task.id, 0, &write).await?;
        assert_eq!(
            store.observation(&task.id, 2).await?.as_deref(),
            Some("start, carried")
        );
        assert_eq!(
            store.journal(&task.id).await?[0].author.as_deref(),
            Some("key-7")
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_journaled_and_leave_the_state_untouched() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let first = step_commit(1, &json!({}), json!({"a": 1}), false);
        store.commit_step(&task.id, 0, &first).await?;
        let before = store.task(&task.id).await?;

        store.record_rejection(&task.id, &rejected(2, 1)).await?;
        store.record_rejection(&task.id, &rejected(2, 2)).await?;
        let after = store.task(&task.id).await?;
        assert_eq!(after.state, before.state);
        assert_eq!(after.version, 1);
        assert_eq!(
            store.journal(&task.id).await?,
            [first.entry.clone(), rejected(2, 1), rejected(2, 2)]
        );
        assert_eq!(store.accepted_patches(&task.id, 1, 5).await?.len(), 1);
        assert_eq!(
            state_at(store.as_ref(), &task.id, 1, 1).await?,
            json!({"a": 1})
        );
        match state_at(store.as_ref(), &task.id, 2, 1).await {
            Err(StoreError::NoSuchStep {
                step: 2,
                version: 1,
                ..
            }) => {}
            other => bail!("expected NoSuchStep, got {other:?}"),
        }

        // The third attempt at step 2 is accepted against the untouched version.
        let mut second = step_commit(2, &first.new_state, json!({"b": 2}), false);
        second.entry.attempt = 3;
        store.commit_step(&task.id, 1, &second).await?;
        let journal = store.journal(&task.id).await?;
        let keys: Vec<(u64, u32, Verdict)> = journal
            .iter()
            .map(|e| (e.step, e.attempt, e.verdict))
            .collect();
        assert_eq!(
            keys,
            [
                (1, 1, Verdict::Accepted),
                (2, 1, Verdict::Rejected),
                (2, 2, Verdict::Rejected),
                (2, 3, Verdict::Accepted)
            ]
        );
        assert_eq!(
            state_at(store.as_ref(), &task.id, 2, 2).await?,
            json!({"a": 1, "b": 2})
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_gets_a_conflict() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let first = step_commit(1, &json!({}), json!({"a": 1}), true);
        store.commit_step(&task.id, 0, &first).await?;

        let mut stale = step_commit(1, &json!({}), json!({"a": 2}), true);
        stale.entry.attempt = 2;
        stale.status = Some((TaskStatus::Failed, None));
        for expected in [0, 5] {
            match store.commit_step(&task.id, expected, &stale).await {
                Err(StoreError::Conflict {
                    expected: e,
                    actual: 1,
                    ..
                }) if e == expected => {}
                other => bail!("expected a conflict at version {expected}, got {other:?}"),
            }
        }
        let stored = store.task(&task.id).await?;
        assert_eq!(stored.state, first.new_state);
        assert_eq!(stored.version, 1);
        assert_eq!(stored.status, TaskStatus::Running);
        assert_eq!(
            store.journal(&task.id).await?,
            std::slice::from_ref(&first.entry)
        );
        assert_eq!(store.intents(&task.id).await?.len(), 1);

        match store.commit_step("0000", 0, &first).await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_writers_one_wins_every_round_and_the_rest_conflict() -> anyhow::Result<()> {
    const WRITERS: usize = 8;
    const ROUNDS: u64 = 25;
    on_each_backend(|db| async move {
        // Two independent stores (pools) stand for two processes sharing the database.
        let stores = [db.open().await?, db.open().await?];
        let task = stores[0].create_task(new_task(), &json!({})).await?;
        let mut states = vec![json!({})];
        let mut wins = [0u32; WRITERS];
        for round in 0..ROUNDS {
            let version = stores[1].task(&task.id).await?.version;
            assert_eq!(version, round);
            let barrier = Arc::new(Barrier::new(WRITERS));
            let mut handles = Vec::new();
            for writer in 0..WRITERS {
                let store = Arc::clone(&stores[writer % 2]);
                let barrier = Arc::clone(&barrier);
                let id = task.id.clone();
                let mut commit = step_commit(
                    version + 1,
                    &states[round as usize],
                    json!({"last": {"round": round, "writer": writer}, format!("w{writer}"): round}),
                    true,
                );
                commit.entry.output = format!("writer {writer}");
                if let Some(intent) = commit.intent.as_mut() {
                    intent.idempotency_key = format!("round {round} writer {writer}");
                }
                handles.push(tokio::spawn(async move {
                    barrier.wait().await;
                    let outcome = store.commit_step(&id, version, &commit).await;
                    (writer, commit, outcome)
                }));
            }
            let mut winner = None;
            for handle in handles {
                let (writer, commit, outcome) = handle.await?;
                match outcome {
                    Ok(()) => {
                        ensure!(winner.is_none(), "round {round}: two writers won");
                        winner = Some((writer, commit));
                    }
                    Err(StoreError::Conflict {
                        expected, actual, ..
                    }) => {
                        assert_eq!((expected, actual), (version, version + 1), "round {round}");
                    }
                    Err(other) => bail!("round {round}, writer {writer}: {other}"),
                }
            }
            let (writer, commit) = winner.context("no writer won")?;
            wins[writer] += 1;

            let stored = stores[0].task(&task.id).await?;
            assert_eq!(stored.version, version + 1);
            assert_eq!(stored.state, commit.new_state, "round {round}");
            let journal = stores[1].journal(&task.id).await?;
            let rows: Vec<&JournalEntry> =
                journal.iter().filter(|e| e.step == version + 1).collect();
            assert_eq!(rows, [&commit.entry], "round {round}");
            let intents = stores[0].intents(&task.id).await?;
            let keys: Vec<&str> = intents
                .iter()
                .filter(|i| i.step == version + 1)
                .map(|i| i.idempotency_key.as_str())
                .collect();
            assert_eq!(keys, [format!("round {round} writer {writer}")]);
            states.push(commit.new_state);
        }
        assert_eq!(wins.iter().sum::<u32>(), ROUNDS as u32);
        // The winners' patches, replayed, give the winners' states.
        for (step, state) in states.iter().enumerate() {
            assert_eq!(
                &state_at(stores[0].as_ref(), &task.id, step as u64, ROUNDS).await?,
                state
            );
        }
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Time travel

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i16>().prop_map(|n| json!(n)),
        "[a-z]{0,5}".prop_map(Value::String),
        any::<bool>().prop_map(Value::Bool)
    ]
}

/// A patch candidate: merge patches over a few keys (nested objects and null deletes included),
/// or JSON Patch operations. Candidates that do not apply are skipped by the test.
fn patch() -> impl Strategy<Value = Value> {
    let key = prop_oneof![Just("a"), Just("b"), Just("c"), Just("d")];
    let merge_value = prop_oneof![
        3 => scalar(),
        1 => Just(Value::Null),
        1 => prop::collection::btree_map("[xyz]", prop_oneof![scalar(), Just(Value::Null)], 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
    ];
    let merge = prop::collection::btree_map(key.clone(), merge_value, 0..3)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    let op = prop_oneof![
        (key.clone(), scalar())
            .prop_map(|(k, v)| json!({"op": "add", "path": format!("/{k}"), "value": v})),
        key.clone()
            .prop_map(|k| json!({"op": "remove", "path": format!("/{k}")})),
        (key, scalar())
            .prop_map(|(k, v)| json!({"op": "replace", "path": format!("/{k}"), "value": v})),
    ];
    prop_oneof![
        merge,
        prop::collection::vec(op, 1..3).prop_map(Value::Array)
    ]
}

async fn rebuild_every_step(db: &Db, patches: Vec<Value>, every: u64) -> Result<(), TestCaseError> {
    let fail = |e: StoreError| TestCaseError::fail(e.to_string());
    let store = db.open_with(every).await.map_err(fail)?;
    let task = store
        .create_task(new_task(), &json!({}))
        .await
        .map_err(fail)?;
    let mut state = json!({});
    let mut hashes = vec![state_hash(&state)];
    for candidate in patches {
        let Ok(parsed) = StatePatch::from_value(&candidate) else {
            continue;
        };
        let Ok(next) = parsed.apply(&state) else {
            continue;
        };
        let step = hashes.len() as u64;
        let hash = state_hash(&next);
        let commit = StepCommit {
            entry: accepted(step, &candidate, &hash),
            new_state: next.clone(),
            intent: None,
            status: None,
            previous_result: None,
            next_observation: None,
            world: None,
            upgrade: None,
        };
        store
            .commit_step(&task.id, step - 1, &commit)
            .await
            .map_err(fail)?;
        state = next;
        hashes.push(hash);
    }
    let version = hashes.len() as u64 - 1;
    let stored = store.task(&task.id).await.map_err(fail)?;
    prop_assert_eq!(stored.version, version);
    prop_assert_eq!(stored.state, state);
    for (step, hash) in hashes.iter().enumerate() {
        let rebuilt = state_at(store.as_ref(), &task.id, step as u64, version)
            .await
            .map_err(fail)?;
        prop_assert_eq!(
            &state_hash(&rebuilt),
            hash,
            "step {} with snapshots every {}",
            step,
            every
        );
    }
    Ok(())
}

/// The state rebuilt for every step N equals the hash recorded when step N was committed,
/// whatever the snapshot interval.
#[test]
fn every_step_rebuilds_to_its_recorded_hash() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for backend in backends() {
        let cases = match backend {
            Backend::Sqlite => 24,
            Backend::Postgres => 16,
            // Three round trips a statement (BEGIN, it, COMMIT): fewer cases, the same property.
            Backend::PgBouncer => 8,
        };
        let db = runtime.block_on(Db::create(backend))?;
        let mut runner = TestRunner::new(Config::with_cases(cases));
        let outcome = runner.run(
            &(prop::collection::vec(patch(), 1..40), 1u64..8),
            |(patches, every)| runtime.block_on(rebuild_every_step(&db, patches, every)),
        );
        runtime.block_on(db.destroy())?;
        if let Err(failure) = outcome {
            bail!("{backend:?}: {failure}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_patch_is_caught_at_its_step() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(10).await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        run_steps(store.as_ref(), &task.id, 5, &[]).await?;
        let changed = db
            .execute(&format!(
                "UPDATE journal SET patch = '{{\"k3\": 99}}' WHERE task_id = '{}' AND step = 3",
                task.id
            ))
            .await?;
        assert_eq!(changed, 1);
        assert!(state_at(store.as_ref(), &task.id, 2, 5).await.is_ok());
        for step in 3..=5 {
            match state_at(store.as_ref(), &task.id, step, 5).await {
                Err(StoreError::Corrupt { step: 3, .. }) => {}
                other => bail!("rebuilding step {step}: expected Corrupt at 3, got {other:?}"),
            }
        }

        // A missing accepted row is reported at the step it should be.
        db.execute(&format!(
            "DELETE FROM journal WHERE task_id = '{}' AND step = 2",
            task.id
        ))
        .await?;
        match state_at(store.as_ref(), &task.id, 2, 5).await {
            Err(StoreError::Corrupt { step: 2, .. }) => {}
            other => bail!("expected Corrupt at 2, got {other:?}"),
        }
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Fork, compaction, deletion, statistics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_copies_history_up_to_its_step_and_records_its_parent() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(2).await?;
        let spec = NewTask {
            tools: control_specs(),
            context_budget: Some(900),
            environment: Some(json!({"kind": "warehouse"})),
            ..new_task()
        };
        let parent = store.create_task(spec, &json!({"base": true})).await?;
        let states = run_steps(store.as_ref(), &parent.id, 5, &[2]).await?;
        let parent = store.task(&parent.id).await?;

        for at in [3u64, 4] {
            let fork = store
                .fork_task(
                    &parent.id,
                    at,
                    &states[at as usize],
                    Some(&json!({"forked": at})),
                )
                .await?;
            assert_ne!(fork.id, parent.id);
            assert_eq!(fork.parent, Some((parent.id.clone(), at)));
            assert_eq!(fork.version, at);
            assert_eq!(fork.state, states[at as usize]);
            assert_eq!(fork.status, TaskStatus::Running);
            assert_eq!(fork.env_checkpoint, Some(json!({"forked": at})));
            assert_eq!(
                (
                    &fork.skill,
                    &fork.tools,
                    fork.context,
                    fork.context_budget,
                    &fork.model,
                    &fork.environment
                ),
                (
                    &parent.skill,
                    &parent.tools,
                    parent.context,
                    parent.context_budget,
                    &parent.model,
                    &parent.environment
                )
            );

            let journal: Vec<JournalEntry> = store
                .journal(&parent.id)
                .await?
                .into_iter()
                .filter(|e| e.step <= at)
                .collect();
            assert_eq!(store.journal(&fork.id).await?, journal);
            assert_eq!(journal.len() as u64, at + 1, "the rejection is copied too");
            let intents: Vec<IntentRecord> = store
                .intents(&parent.id)
                .await?
                .into_iter()
                .filter(|i| i.step <= at)
                .collect();
            assert_eq!(store.intents(&fork.id).await?, intents);
            let observations: Vec<(u64, String)> = store
                .observations(&parent.id)
                .await?
                .into_iter()
                .filter(|(step, _)| *step <= at + 1)
                .collect();
            assert_eq!(store.observations(&fork.id).await?, observations);
            // At 4 the fork's own snapshot replaces the copied one at the same step.
            assert_eq!(
                store.snapshot_before(&fork.id, at).await?,
                Some((at, states[at as usize].clone()))
            );
            for step in 0..=at {
                assert_eq!(
                    state_at(store.as_ref(), &fork.id, step, at).await?,
                    states[step as usize]
                );
            }

            // The fork goes on by itself; the parent does not move.
            let next = step_commit(at + 1, &states[at as usize], json!({"fork": at}), false);
            store.commit_step(&fork.id, at, &next).await?;
            assert_eq!(store.task(&fork.id).await?.state, next.new_state);
            assert_eq!(store.task(&parent.id).await?, parent);
        }

        match store.fork_task(&parent.id, 6, &json!({}), None).await {
            Err(StoreError::NoSuchStep {
                step: 6,
                version: 5,
                ..
            }) => {}
            other => bail!("expected NoSuchStep, got {other:?}"),
        }
        match store.fork_task("0000", 0, &json!({}), None).await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        assert_eq!(store.list_tasks().await?.len(), 3);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_later_steps_rebuildable_and_reports_earlier_ones_compacted()
-> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(3).await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let states = run_steps(store.as_ref(), &task.id, 8, &[]).await?;

        // Base step 3 already has a snapshot, which is replaced. Deleted: journal, intent and
        // observation rows of steps 1..=3 and the snapshot at 0.
        let deleted = store.compact_task(&task.id, 4, &states[3]).await?;
        assert_eq!(deleted, 3 + 3 + 3 + 1);
        // Base step 5 has none. Deleted: steps 4 and 5 of each kind and the snapshot at 3.
        let deleted = store.compact_task(&task.id, 6, &states[5]).await?;
        assert_eq!(deleted, 2 + 2 + 2 + 1);

        for step in 0..5 {
            match state_at(store.as_ref(), &task.id, step, 8).await {
                Err(StoreError::Compacted { step: s, .. }) => assert_eq!(s, step),
                other => bail!("step {step}: expected Compacted, got {other:?}"),
            }
        }
        for step in 5..=8 {
            assert_eq!(
                state_at(store.as_ref(), &task.id, step, 8).await?,
                states[step as usize]
            );
        }
        let journal_steps: Vec<u64> = store
            .journal(&task.id)
            .await?
            .iter()
            .map(|e| e.step)
            .collect();
        assert_eq!(journal_steps, [6, 7, 8]);
        let intent_steps: Vec<u64> = store
            .intents(&task.id)
            .await?
            .iter()
            .map(|i| i.step)
            .collect();
        assert_eq!(intent_steps, [6, 7, 8]);
        let observation_steps: Vec<u64> = store
            .observations(&task.id)
            .await?
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(observation_steps, [6, 7, 8, 9]);

        // The task itself is untouched and carries on.
        let stored = store.task(&task.id).await?;
        assert_eq!((stored.version, &stored.state), (8, &states[8]));
        let next = step_commit(9, &states[8], json!({"after": "gc"}), false);
        store.commit_step(&task.id, 8, &next).await?;
        assert_eq!(
            state_at(store.as_ref(), &task.id, 9, 9).await?,
            next.new_state
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_task_removes_what_it_owns_and_unlinks_its_forks() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open_with(1).await?;
        let parent = store.create_task(new_task(), &json!({})).await?;
        let states = run_steps(store.as_ref(), &parent.id, 2, &[]).await?;
        store.record_rejection(&parent.id, &rejected(3, 1)).await?;
        let fork = store.fork_task(&parent.id, 1, &states[1], None).await?;
        let other = store.create_task(new_task(), &json!({"other": 1})).await?;

        store.delete_task(&parent.id).await?;
        match store.task(&parent.id).await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        for table in ["tasks", "journal", "intents", "observations", "snapshots"] {
            let column = if table == "tasks" { "id" } else { "task_id" };
            let left = db
                .count(&format!(
                    "SELECT COUNT(*) FROM {table} WHERE {column} = '{}'",
                    parent.id
                ))
                .await?;
            assert_eq!(left, 0, "{table} still holds rows of the deleted task");
        }

        let fork_after = store.task(&fork.id).await?;
        assert_eq!(fork_after.parent, None);
        assert_eq!(store.journal(&fork.id).await?.len(), 1);
        assert_eq!(state_at(store.as_ref(), &fork.id, 1, 1).await?, states[1]);
        assert_eq!(store.task(&other.id).await?, other);

        match store.delete_task(&parent.id).await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("a second delete should be NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

/// The documented per-row accounting: text bytes plus fixed sizes for integer columns.
fn journal_row_bytes(task: &str, entry: &JournalEntry) -> u64 {
    let json_len = |v: &Option<Value>| v.as_ref().map_or(0, |v| v.to_string().len());
    let verdict = match entry.verdict {
        Verdict::Accepted => "accepted",
        Verdict::Rejected => "rejected",
    };
    (task.len()
        + 8
        + 4
        + verdict.len()
        + entry.output.len()
        + json_len(&entry.patch)
        + json_len(&entry.action)
        + json_len(&entry.errors)
        + entry.state_hash.as_ref().map_or(0, String::len)
        + 8
        + entry.prompt_hash.len()
        + json_len(&entry.usage)
        + 16) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_stats_count_the_bytes_of_what_is_stored() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let initial = json!({"inventory": {"shelf_1": "item_1"}});
        let task = store.create_task(new_task(), &initial).await?;
        let snapshot_bytes = (initial.to_string().len() + state_hash(&initial).len()) as u64;
        assert_eq!(
            store.storage_stats(&task.id).await?,
            StorageStats {
                steps: 0,
                journal_bytes: 0,
                intent_bytes: 0,
                observation_bytes: "start".len() as u64,
                snapshot_bytes,
            }
        );

        // Non-ASCII text: the stats count bytes, not characters.
        let mut commit = step_commit(1, &initial, json!({"note": "café ✓"}), true);
        commit.entry.output = "réponse: {\"note\": \"café ✓\"}".into();
        store.commit_step(&task.id, 0, &commit).await?;
        let result = ActionResult {
            next_observation: "étagère 1 pleine".into(),
            ..action_result(1)
        };
        store.record_action_result(&task.id, &result).await?;
        let intent = commit.intent.as_ref().unwrap();
        let intent_bytes = (task.id.len()
            + 8
            + intent.tool.len()
            + intent.args.to_string().len()
            + intent.idempotency_key.len()
            + intent.side_effect.len()
            + "done".len()
            + 8
            + result.result.len()
            + 16) as u64;
        let stats = store.storage_stats(&task.id).await?;
        assert_eq!(
            stats,
            StorageStats {
                steps: 1,
                journal_bytes: journal_row_bytes(&task.id, &commit.entry),
                intent_bytes,
                observation_bytes: ("start".len() + "étagère 1 pleine".len()) as u64,
                snapshot_bytes,
            }
        );
        assert!(stats.journal_bytes > 0 && stats.intent_bytes > 0);
        assert_eq!(
            stats.journal_bytes_per_step(),
            (stats.journal_bytes + stats.intent_bytes) as f64
        );

        // A rejection adds journal bytes, not steps.
        store.record_rejection(&task.id, &rejected(2, 1)).await?;
        let after = store.storage_stats(&task.id).await?;
        assert_eq!(after.steps, 1);
        assert_eq!(
            after.journal_bytes,
            stats.journal_bytes + journal_row_bytes(&task.id, &rejected(2, 1))
        );

        match store.storage_stats("0000").await {
            Err(StoreError::NotFound(_)) => {}
            other => bail!("expected NotFound, got {other:?}"),
        }
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Opening and migrations

/// The newest schema version of `backend`. Their seventh migrations differ: SQLite moved skill
/// and tools out of `tasks` (PostgreSQL's TOAST did not need it then), PostgreSQL added the
/// batch claim's index; SQLite's sixteenth indexes a group commit's recall entries once per
/// group (FTS5 writes a segment at every savepoint; PostgreSQL's GIN index has no such cost);
/// PostgreSQL's sixteenth is the one-statement step commit (`skillstate_commit_step`), its
/// seventeenth the triggers that wake idle workers (LISTEN/NOTIFY).
fn latest_schema(backend: Backend) -> i64 {
    match backend {
        Backend::Sqlite => 17,
        Backend::Postgres | Backend::PgBouncer => 20,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_and_repeated_opens_apply_each_migration_once() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        // Four stores open the same brand-new database at once (for SQLite: a file that does
        // not exist yet, so the WAL switch races too).
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move { db.open().await })
            })
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            stores.push(open.await??);
        }
        let again = db.open().await?;
        let latest = latest_schema(db.backend);
        assert_eq!(
            db.count("SELECT COUNT(*) FROM schema_migrations").await?,
            latest
        );
        assert_eq!(
            db.count("SELECT MAX(version) FROM schema_migrations")
                .await?,
            latest
        );

        let task = stores[0].create_task(new_task(), &json!({"x": 1})).await?;
        assert_eq!(again.task(&task.id).await?, task);
        assert_eq!(stores[3].list_tasks().await?.len(), 1);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        db.open().await?;
        db.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'from the future', 0)",
        )
        .await?;
        match db.open().await {
            Err(StoreError::SchemaTooNew {
                found: 999,
                supported,
            }) if supported == latest_schema(db.backend) => {}
            Err(other) => bail!("expected SchemaTooNew, got {other}"),
            Ok(_) => bail!("a newer schema was accepted"),
        }
        match skillstate_store::open(&db.location()).await {
            Err(StoreError::SchemaTooNew { found: 999, .. }) => {}
            Err(other) => bail!("expected SchemaTooNew, got {other}"),
            Ok(_) => bail!("a newer schema was accepted"),
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_picks_the_backend_from_the_location() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let mut locations = vec![db.location()];
        if db.backend.is_postgres() {
            // The schema comes from the URL's `options` (through the pooler: from the role), as
            // an operator would configure it.
            locations.push(db.location().replacen("postgres://", "postgresql://", 1));
        }
        let direct = db.open().await?;
        for location in locations {
            let store = skillstate_store::open(&location).await?;
            let task = store
                .create_task(new_task(), &json!({"via": location}))
                .await?;
            assert_eq!(direct.task(&task.id).await?, task, "{location}");
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn postgres_errors_name_the_location_without_its_password() -> anyhow::Result<()> {
    // Nothing listens on port 1; the error must say where it tried, minus the secret.
    let url = "postgres://skillstate:hunter2@127.0.0.1:1/none";
    match skillstate_store::open(url).await {
        Err(StoreError::Open { location, message }) => {
            assert_eq!(location, "postgres://skillstate:***@127.0.0.1:1/none");
            assert!(!message.contains("hunter2"), "{message}");
            // The cause, not the pool's "timed out" after retrying for seconds.
            assert!(!message.contains("timed out"), "{message}");
        }
        Err(other) => bail!("expected an Open error, got {other}"),
        Ok(_) => bail!("opened a store on port 1"),
    }
    let url = "postgresql://127.0.0.1:1/none?user=skillstate&password=hunter2&sslmode=disable";
    match skillstate_store::open(url).await {
        Err(StoreError::Open { location, message }) => {
            assert_eq!(
                location,
                "postgresql://127.0.0.1:1/none?user=skillstate&password=***&sslmode=disable"
            );
            assert!(!message.contains("hunter2"), "{message}");
        }
        Err(other) => bail!("expected an Open error, got {other}"),
        Ok(_) => bail!("opened a store on port 1"),
    }
    match PostgresStore::open_in_schema(DEFAULT_POSTGRES_URL, "x; DROP TABLE tasks").await {
        Err(StoreError::Open { message, .. }) => assert!(message.contains("schema name")),
        Err(other) => bail!("expected an Open error, got {other}"),
        Ok(_) => bail!("accepted a schema name that needs quoting"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Execution leases, journal extent, degraded listing, read-only opens

fn claim(token: &str) -> LeaseClaim {
    LeaseClaim {
        token: token.into(),
        holder: format!("runner {token}"),
        process: format!("test {token}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_runner_holds_a_task_until_its_lease_expires_or_is_released() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        assert_eq!(store.lease(&task.id).await?, None);

        let first = store
            .acquire_lease(&task.id, &claim("a"), 60_000, None)
            .await?;
        assert_eq!(first.holder, "runner a");
        assert!(first.expires_at > first.acquired_at);
        // A second runner is told who holds it and since when.
        match store
            .acquire_lease(&task.id, &claim("b"), 60_000, None)
            .await
        {
            Err(error @ StoreError::Leased { .. }) => {
                let message = error.to_string();
                assert!(message.contains("runner a"), "{message}");
                assert!(message.contains("since"), "{message}");
            }
            other => bail!("a held lease was granted again: {other:?}"),
        }
        // The holder renews and re-acquires; its acquisition time stays.
        store.renew_lease(&task.id, "a", 60_000).await?;
        let again = store
            .acquire_lease(&task.id, &claim("a"), 60_000, None)
            .await?;
        assert_eq!(again.acquired_at, first.acquired_at);
        // Naming the wrong current holder does not take it over.
        assert!(matches!(
            store
                .acquire_lease(&task.id, &claim("b"), 60_000, Some("z"))
                .await,
            Err(StoreError::Leased { .. })
        ));
        // Taking over from a holder known to be gone: only with its exact token.
        let taken = store
            .acquire_lease(&task.id, &claim("b"), 60_000, Some("a"))
            .await?;
        assert_eq!(taken.token, "b");
        // The old holder's renewal now fails: it has lost the lease.
        assert!(matches!(
            store.renew_lease(&task.id, "a", 60_000).await,
            Err(StoreError::LeaseLost { .. })
        ));
        // Releasing by a non-holder does nothing; by the holder frees it.
        store.release_lease(&task.id, "a").await?;
        assert_eq!(
            store.lease(&task.id).await?.map(|l| l.token),
            Some("b".into())
        );
        store.release_lease(&task.id, "b").await?;
        assert_eq!(store.lease(&task.id).await?, None);

        // An expired lease is free for anyone.
        store.acquire_lease(&task.id, &claim("c"), 1, None).await?;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let after = store
            .acquire_lease(&task.id, &claim("d"), 60_000, None)
            .await?;
        assert_eq!(after.token, "d");
        assert!(matches!(
            store.lease("no-such-task").await,
            Err(StoreError::NotFound(_))
        ));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_runners_get_one_lease() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let barrier = Arc::new(Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let (store, barrier, id) = (store.clone(), barrier.clone(), task.id.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .acquire_lease(&id, &claim(&format!("r{i}")), 60_000, None)
                        .await
                })
            })
            .collect();
        let mut granted = 0;
        for racer in racers {
            match racer.await? {
                Ok(_) => granted += 1,
                Err(StoreError::Leased { .. }) => {}
                Err(other) => bail!("unexpected: {other}"),
            }
        }
        assert_eq!(granted, 1);
        Ok(())
    })
    .await
}

/// Runners taking and giving back a lease while others ask for it: an asker gets the lease or
/// `Leased` naming a holder — never `NotFound` for a task that exists (a lease released between
/// the refused attempt and the read of its holder is taken instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_changing_hands_never_looks_like_a_missing_task() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let workers: Vec<_> = (0..4)
            .map(|i| {
                let (store, id) = (store.clone(), task.id.clone());
                tokio::spawn(async move {
                    for round in 0..60 {
                        let token = format!("r{i}-{round}");
                        match store.acquire_lease(&id, &claim(&token), 60_000, None).await {
                            Ok(_) => store.release_lease(&id, &token).await?,
                            Err(StoreError::Leased { .. }) => {}
                            Err(other) => bail!("round {round}: {other}"),
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for worker in workers {
            worker.await??;
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_extent_shows_gaps_and_the_last_hash() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        let empty = store.journal_extent(&task.id).await?;
        assert_eq!((empty.accepted, empty.first, empty.last), (0, None, None));
        assert_eq!(empty.base, Some(0));
        let states = run_steps(store.as_ref(), &task.id, 4, &[]).await?;
        let extent = store.journal_extent(&task.id).await?;
        assert_eq!(
            (extent.accepted, extent.first, extent.last),
            (4, Some(1), Some(4))
        );
        assert_eq!(extent.last_hash, Some(state_hash(&states[4])));
        db.execute(&format!(
            "DELETE FROM journal WHERE task_id = '{}' AND step = 2",
            task.id
        ))
        .await?;
        let gap = store.journal_extent(&task.id).await?;
        assert_eq!((gap.accepted, gap.first, gap.last), (3, Some(1), Some(4)));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unreadable_row_does_not_hide_the_other_tasks() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let good = store.create_task(new_task(), &json!({})).await?;
        let bad = store.create_task(new_task(), &json!({})).await?;
        db.execute(&format!(
            "UPDATE tasks SET status = 'exploded' WHERE id = '{}'",
            bad.id
        ))
        .await?;
        let listed = store.list_tasks().await?;
        assert_eq!(listed.len(), 2);
        let row = |id: &str| listed.iter().find(|t| t.id == id).cloned();
        let good_row = row(&good.id).context("good row listed")?;
        assert_eq!(good_row.status, Some(TaskStatus::Running));
        assert_eq!(good_row.problem, None);
        let bad_row = row(&bad.id).context("bad row listed")?;
        assert_eq!(bad_row.status, None);
        assert!(
            bad_row
                .problem
                .as_deref()
                .is_some_and(|p| p.contains("exploded")),
            "{bad_row:?}"
        );
        // Loading the bad task itself names what is wrong.
        let error = store.task(&bad.id).await.err().context("bad task loads")?;
        assert!(error.to_string().contains("exploded"), "{error}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_journal_row_is_named_by_its_step() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let store = db.open().await?;
        let task = store.create_task(new_task(), &json!({})).await?;
        run_steps(store.as_ref(), &task.id, 3, &[]).await?;
        db.execute(&format!(
            "UPDATE journal SET usage = '{{not json' WHERE task_id = '{}' AND step = 2",
            task.id
        ))
        .await?;
        let error = store
            .journal(&task.id)
            .await
            .err()
            .context("journal loads")?;
        let message = error.to_string();
        assert!(message.contains("step 2"), "{message}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_opens_never_create_or_migrate() -> anyhow::Result<()> {
    on_each_backend(|db| async move {
        let options = StoreOptions::default();
        // Nothing there yet: refused, and still nothing there afterwards.
        match open_existing(&db.location(), &options).await {
            Err(StoreError::NoSchema { .. }) => {}
            Err(other) => bail!("expected NoSchema, got {other}"),
            Ok(_) => bail!("a read-only open succeeded on an empty database"),
        }
        if db.backend == Backend::Sqlite {
            let path = db.location();
            assert!(!std::path::Path::new(&path).exists(), "{path} was created");
        } else {
            assert_eq!(
                db.count("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()")
                    .await?,
                0
            );
        }
        // After a writer created it, a read-only open reads it.
        let writer = db.open().await?;
        let task = writer.create_task(new_task(), &json!({"a": 1})).await?;
        let reader = open_existing(&db.location(), &options).await?;
        assert_eq!(reader.task(&task.id).await?, task);
        Ok(())
    })
    .await
}
