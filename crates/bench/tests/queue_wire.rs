//! Round trips per step on PostgreSQL, counted on the wire: the queue bench's workload (a
//! counting skill, one read-only tool call per step) run by a worker whose store reaches the
//! server through the counting proxy (`wire.rs`). A step's commit is one statement
//! (`skillstate_commit_step`) and the inbox is not read again when that commit found it empty,
//! so a step costs one round trip, plus each task's claim, set-up and settle spread over its
//! steps: at most 2 per accepted step (issue 25's bar), where the multi-statement commit took
//! about 15.
//!
//! Needs the PostgreSQL server of `SKILLSTATE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`; `off` skips, visibly); the test works in a schema
//! of its own and drops it.

#[path = "../../../test-support/skip.rs"]
mod skip;

use std::sync::Arc;
use std::time::Duration;

use skillstate_bench::queue::{Measure, run_queue_bench};
use skillstate_bench::wire::{WireProxy, through_proxy};

const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const TASKS: usize = 24;
const STEPS: u32 = 20;

async fn fresh_schema(url: &str, schema: &str) -> String {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(url)
        .await
        .expect("the PostgreSQL test server is reachable");
    for sql in [
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        format!("CREATE SCHEMA {schema}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut connection)
            .await
            .expect("the test schema is created");
    }
    format!("{url}?options=-c%20search_path%3D{schema}")
}

async fn drop_schema(url: &str, schema: &str) {
    use sqlx::Connection;
    if let Ok(mut connection) = sqlx::PgConnection::connect(url).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE"
        )))
        .execute(&mut connection)
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_step_costs_at_most_two_round_trips_on_the_wire() {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned());
    if url == "off" {
        skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test",
        );
        return;
    }
    let schema = format!("bench_wire_{}", std::process::id());
    let location = fresh_schema(&url, &schema).await;
    let store = skillstate_store::open(&location)
        .await
        .expect("store opens");

    let placeholder = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let (_, upstream) = through_proxy(&location, placeholder).expect("a postgres URL");
    let upstream = tokio::net::lookup_host(&upstream)
        .await
        .expect("the server's address resolves")
        .next()
        .expect("one address");
    let proxy = WireProxy::start(upstream, Duration::ZERO)
        .await
        .expect("the proxy listens");
    let (worker_location, _) = through_proxy(&location, proxy.addr()).expect("a postgres URL");
    let worker_store = skillstate_store::open(&worker_location)
        .await
        .expect("the worker's store opens through the proxy");
    // Opening (the schema check) is not a step's cost.
    let before = proxy.turns();

    let report = run_queue_bench(
        Arc::clone(&store),
        worker_store,
        TASKS,
        STEPS,
        8,
        1,
        |_| Err(std::io::Error::other("one process only")),
        Measure {
            server: Some(&url),
            own_cpu_is_workers: false,
        },
    )
    .await
    .expect("the queue bench runs");
    let turns = proxy.turns() - before;
    drop_schema(&url, &schema).await;

    assert_eq!(report.completed, TASKS as u64, "{report:?}");
    assert_eq!(
        report.steps,
        TASKS as u64 * (u64::from(STEPS) + 1),
        "{report:?}"
    );
    let per_step = turns as f64 / report.steps as f64;
    eprintln!(
        "{turns} round trips for {} accepted steps: {per_step:.2} per step",
        report.steps
    );
    assert!(
        per_step <= 2.0,
        "{turns} round trips for {} accepted steps: {per_step:.2} per step (at most 2)",
        report.steps
    );

    // What the steps cost the server, read from the server (other tests may write to it
    // meanwhile, so these are lower bounds): every step writes WAL; the server's processes
    // are on this machine; pg_stat_statements, where loaded and not crowded out, saw at least the step's commit.
    let server = report
        .server
        .as_ref()
        .expect("the server's cost is measured");
    assert!(server.wal_bytes_per_step > 0.0, "{server:?}");
    if url.contains("@127.0.0.1") || url.contains("@localhost") {
        assert!(
            server.server_cpu_us_per_step.is_some_and(|cpu| cpu > 0.0),
            "{server:?}"
        );
    }
    match &server.pg_stat_statements {
        None => assert!(
            server.statements_per_step.is_some_and(|n| n >= 1.0),
            "{server:?}"
        ),
        // Not loaded (a fresh server), or other tests' statements crowded the run's out.
        Some(why) => assert!(
            why.contains("shared_preload_libraries") || why.contains("evicted"),
            "{why}"
        ),
    }
    assert!(report.worker_cpu_us_per_step.is_none(), "{report:?}");
}

/// An idle worker whose fallback poll is two minutes away starts a task queued after it went
/// idle at once: PostgreSQL notifies it (LISTEN/NOTIFY, schema 17). The control, the same
/// worker told not to use the signal, is still asleep a second later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_wakes_when_work_is_queued_not_at_its_next_poll() {
    use skillstate_bench::queue::{CounterHost, submit};
    use skillstate_runtime::{StopLevel, WorkerEvent, WorkerOptions, run_worker};

    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned());
    if url == "off" {
        skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test",
        );
        return;
    }
    let schema = format!("bench_wake_{}", std::process::id());
    let location = fresh_schema(&url, &schema).await;
    let store = skillstate_store::open(&location)
        .await
        .expect("store opens");
    const NEVER: Duration = Duration::from_secs(120);

    for signal in [true, false] {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let options = WorkerOptions {
            concurrency: 2,
            poll: NEVER,
            idle_poll: NEVER,
            wake_on_signal: signal,
            ..WorkerOptions::default()
        };
        let worker = tokio::spawn(run_worker(
            Arc::clone(&store),
            Arc::new(CounterHost { steps: 1 }),
            options,
            stop_rx,
            Some(events_tx),
        ));
        // Its first look finds nothing; it waits.
        tokio::time::sleep(Duration::from_millis(500)).await;
        submit(store.as_ref(), 1, 1)
            .await
            .expect("a task is queued");
        let wait = if signal {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(1)
        };
        let settled = tokio::time::timeout(wait, async {
            while let Some(event) = events.recv().await {
                if let WorkerEvent::Settled { .. } = event {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        let _ = stop_tx.send(StopLevel::Now);
        let _ = worker.await;
        if signal {
            assert!(
                settled,
                "the queued task did not run within 30 s of being queued"
            );
        } else {
            assert!(
                !settled,
                "without the signal the worker should still be asleep (its poll is 2 minutes)"
            );
        }
    }
    drop_schema(&url, &schema).await;
}
