//! The PostgreSQL store through PgBouncer in transaction mode (Debian's `pgbouncer`, 1.18 here:
//! it does not track prepared statements). Each test starts a PgBouncer of its own on a free
//! loopback port, in front of the test server (`SKILLSTATE_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), and stops it when done, also on a panic.
//!
//! - Without `transaction_pooler`, the store's statements meet another client's on a shared
//!   server connection; the user reads one message, in the store's words, naming the setting.
//! - With it, and the pooler configured as docs/storage.md says, a queue of tasks is claimed, stepped
//!   and settled by concurrent workers through the pooler, in a schema of its own.
//!
//! A missing `pgbouncer` fails the test with the install command (scripts/test installs it when
//! it runs as root); `SKILLSTATE_TEST_POSTGRES_URL=off` skips, visibly.
#![allow(clippy::unwrap_used)]

#[path = "../../../test-support/skip.rs"]
mod skip;
#[path = "../../../test-support/store_steps.rs"]
mod store_steps;

#[path = "../../../test-support/pgbouncer.rs"]
mod pgbouncer;

use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use pgbouncer::Bouncer;
use serde_json::{Value, json};
use skillstate_store::*;
use sqlx::{AssertSqlSafe, Connection};

const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn postgres_url() -> Option<String> {
    match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => {
            skip::skip_test(
                "SKILLSTATE_TEST_POSTGRES_URL=off",
                "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
            );
            None
        }
        Ok(url) if !url.is_empty() => Some(url),
        _ => Some(DEFAULT_POSTGRES_URL.to_owned()),
    }
}

/// PgBouncer in transaction mode with `settings`, serving `test` (the test server's database)
/// and, when `schema` is given, `test_schema`: the same database with that schema as every server
/// connection's `search_path` (`connect_query`, as docs/storage.md shows an operator).
fn start_bouncer(url: &str, settings: &str, schema: Option<&str>) -> anyhow::Result<Bouncer> {
    let (host, port, _, database) = pgbouncer::server_of(url)?;
    let databases = match schema {
        Some(schema) => format!(
            "test_schema = host={host} port={port} dbname={database} connect_query='SET search_path TO {schema}'\n"
        ),
        None => String::new(),
    };
    Bouncer::start(
        url,
        &databases,
        &format!("pool_mode = transaction\n{settings}"),
    )
}

/// A schema of the test server's own for one test, dropped on drop (best effort).
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    async fn create(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
        let mut conn = sqlx::PgConnection::connect(url).await.with_context(|| {
            format!(
                "cannot reach PostgreSQL at {url}; start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, point SKILLSTATE_TEST_POSTGRES_URL elsewhere, or set it to `off`"
            )
        })?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(Self {
            url: url.to_owned(),
            name,
        })
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        let options: sqlx::postgres::PgConnectOptions = self.url.parse()?;
        let options = options.options([("search_path", self.name.clone())]);
        let mut conn = sqlx::PgConnection::connect_with(&options).await?;
        let n = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&mut conn)
            .await?;
        conn.close().await?;
        Ok(n)
    }

    async fn drop_now(self) -> anyhow::Result<()> {
        let mut conn = sqlx::PgConnection::connect(&self.url).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.name
        )))
        .execute(&mut conn)
        .await?;
        conn.close().await?;
        Ok(())
    }
}

fn new_task(n: usize) -> NewTask {
    store_steps::free_task(format!("input {n}"))
}

fn step_commit(step: u64, state: &Value) -> StepCommit {
    let patch = json!({ format!("k{step}"): step });
    let output = patch.to_string();
    let created_at = 1_700_000_000_000 + step as i64;
    store_steps::accepted_step(
        step,
        state,
        patch,
        output,
        json!({"step": step}),
        created_at,
    )
}

fn action_result(step: u64) -> ActionResult {
    ActionResult {
        step,
        ok: true,
        outcome_unknown: false,
        result: format!("stored {step}"),
        next_observation: format!("observation {}", step + 1),
        env_checkpoint: None,
        delivered: Vec::new(),
    }
}

/// The settings docs/storage.md gives an operator for PgBouncer in transaction mode (without
/// `pool_mode`, which `start_bouncer` sets).
const DOCUMENTED: &str =
    "server_reset_query = DEALLOCATE ALL\nserver_reset_query_always = 1\ndefault_pool_size = 3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_setting_a_transaction_pooler_is_named_once_with_the_way_out()
-> anyhow::Result<()> {
    let Some(url) = postgres_url() else {
        return Ok(());
    };
    let schema = Schema::create(&url, "pgbouncer_off").await?;
    // An operator's usual PgBouncer: transaction mode, sqlx's `extra_float_digits` ignored,
    // one server connection (so two clients share it, as they do under load).
    let bouncer = start_bouncer(
        &url,
        "ignore_startup_parameters = extra_float_digits\ndefault_pool_size = 1",
        Some(&schema.name),
    )?;
    let through = bouncer.url("test_schema", "");
    let outcome = async {
        // The first client creates the tables; its statements stay prepared on the one server
        // connection. The second (`batch submit` in another process) meets them at once.
        let first = PostgresStore::open(&through).await;
        let second = match first {
            Ok(first) => {
                let second = open_and_use(&through).await;
                drop(first);
                second
            }
            Err(error) => Err(error),
        };
        let Err(error) = second else {
            bail!("the store worked through a transaction pooler without the setting");
        };
        ensure!(
            matches!(error, StoreError::TransactionPooler { .. }),
            "not the pooler's error: {error:?}"
        );
        let text = error.to_string();
        eprintln!("{text}");
        ensure!(
            text.matches("`transaction_pooler = true`").count() == 1,
            "the message names the setting once: {text}"
        );
        ensure!(
            text.matches("sqlx_s_").count() == 1,
            "the server's complaint appears once: {text}"
        );
        ensure!(
            text.contains("[store]") && text.contains("server_reset_query_always = 1"),
            "{text}"
        );
        // PgBouncer's refusal of a startup parameter names the setting too.
        let strict = start_bouncer(&url, "default_pool_size = 1", None)?;
        let error = match PostgresStore::open(&strict.url("test", "")).await {
            Ok(_) => bail!("PgBouncer accepted sqlx's extra_float_digits"),
            Err(error) => error,
        };
        ensure!(
            matches!(error, StoreError::TransactionPooler { .. }),
            "not the pooler's error: {error:?}"
        );
        Ok(())
    }
    .await;
    drop(bouncer);
    schema.drop_now().await?;
    outcome
}

/// Opens the store and uses it: a batch with one task.
async fn open_and_use(url: &str) -> Result<PostgresStore> {
    let store = PostgresStore::open(url).await?;
    let batch = store.create_batch(&new_batch()).await?;
    store.enqueue_tasks(&batch.id, vec![queued(0)]).await?;
    Ok(store)
}

fn new_batch() -> NewBatch {
    NewBatch {
        name: "through-pgbouncer".into(),
        spec: json!({"skill": "skills/free"}),
        on_error: OnError::SkipAndLog,
        max_retry: 0,
        rate_limit: RateLimit::default(),
    }
}

fn queued(n: usize) -> QueuedTask {
    QueuedTask {
        task: new_task(n),
        initial_state: json!({"n": n}),
        labels: json!({"n": n}),
        tenant: None,
    }
}

const TASKS: usize = 24;
const STEPS: u64 = 5;
const WORKERS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_setting_a_queue_runs_through_pgbouncer_in_transaction_mode() -> anyhow::Result<()>
{
    let Some(url) = postgres_url() else {
        return Ok(());
    };
    let schema = Schema::create(&url, "pgbouncer_on").await?;
    // Fewer server connections than the store's pool holds: clients share them.
    let bouncer = start_bouncer(&url, DOCUMENTED, Some(&schema.name))?;
    let outcome = run_queue(&bouncer, &schema).await;
    let log = bouncer.log();
    drop(bouncer);
    schema.drop_now().await?;
    outcome.with_context(|| format!("pgbouncer's log:\n{log}"))
}

async fn run_queue(bouncer: &Bouncer, schema: &Schema) -> anyhow::Result<()> {
    // The URL's parameter here; `[store] transaction_pooler = true` reaches the same switch
    // through `StoreOptions`.
    let url = bouncer.url("test_schema", "?transaction_pooler=true");
    let opened = skillstate_store::open_with(
        &bouncer.url("test_schema", ""),
        &StoreOptions {
            transaction_pooler: true,
            ..StoreOptions::default()
        },
    )
    .await?;
    drop(opened);
    let store = Arc::new(PostgresStore::open(&url).await?);
    // A second client's migrations check through the same server connections.
    let other = PostgresStore::open_mode(&url, OpenMode::Existing).await?;
    let batch = store.create_batch(&new_batch()).await?;
    let ids = store
        .enqueue_tasks(&batch.id, (0..TASKS).map(queued).collect())
        .await?;
    ensure!(ids.len() == TASKS);
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let store = store.clone();
        let batch = batch.id.clone();
        workers.spawn(async move {
            let mut done = 0usize;
            loop {
                let claim = LeaseClaim {
                    token: format!("w{w}-{done}"),
                    holder: format!("worker {w}"),
                    process: format!("test:{w}"),
                };
                let Some(claimed) = store.claim_task(&claim, 60_000, Some(&batch)).await? else {
                    return anyhow::Ok(done);
                };
                let task = store.task(&claimed.task_id).await?;
                let mut state = task.state.clone();
                for step in 1..=STEPS {
                    let commit = step_commit(step, &state);
                    store
                        .write_under_lease(
                            &task.id,
                            &claim.token,
                            LeasedWrite::Step {
                                expected_version: step - 1,
                                commit: &commit,
                            },
                        )
                        .await?;
                    store
                        .write_under_lease(
                            &task.id,
                            &claim.token,
                            LeasedWrite::ActionResult(&action_result(step)),
                        )
                        .await?;
                    state = commit.new_state;
                }
                store.renew_lease(&task.id, &claim.token, 60_000).await?;
                store
                    .settle_claim(&task.id, &claim.token, &Settle::Done, None)
                    .await?;
                done += 1;
            }
        });
    }
    let mut settled = 0;
    while let Some(joined) = workers.join_next().await {
        settled += joined??;
    }
    ensure!(settled == TASKS, "{settled} of {TASKS} tasks settled");
    for id in &ids {
        let task = other.task(id).await?;
        ensure!(
            task.version == STEPS,
            "task {id} at version {}",
            task.version
        );
        let steps: Vec<u64> = other
            .journal(id)
            .await?
            .iter()
            .filter(|entry| entry.verdict == Verdict::Accepted)
            .map(|entry| entry.step)
            .collect();
        ensure!(
            steps == (1..=STEPS).collect::<Vec<_>>(),
            "task {id}: {steps:?}"
        );
    }
    ensure!(
        store
            .claim_task(
                &LeaseClaim {
                    token: "late".into(),
                    holder: "late".into(),
                    process: "late".into(),
                },
                1,
                Some(&batch.id)
            )
            .await?
            .is_none()
    );
    // Everything landed in the test's own schema, each effect once.
    ensure!(schema.count("SELECT COUNT(*) FROM tasks").await? == TASKS as i64);
    ensure!(
        schema
            .count("SELECT COUNT(*) FROM intents WHERE status = 'done'")
            .await?
            == (TASKS as i64) * STEPS as i64
    );
    ensure!(
        schema
            .count("SELECT COUNT(*) FROM (SELECT task_id, step FROM journal GROUP BY task_id, step HAVING COUNT(*) > 1) d")
            .await?
            == 0
    );
    // A schema cannot be chosen per connection through the pooler: said, with the way out.
    let refused = PostgresStore::open_in_schema(&url, "elsewhere").await;
    let Err(error) = refused else {
        bail!("a schema was chosen per connection through a transaction pooler");
    };
    ensure!(error.to_string().contains("connect_query"), "{error}");
    store.pool().close().await;
    other.pool().close().await;
    Ok(())
}
