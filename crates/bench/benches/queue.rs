//! Queue throughput: durable steps per second through workers.
//!
//! ```text
//! cargo bench -p skillstate-bench --bench queue -- [--tasks 10000] [--steps 20]
//!     [--concurrency 64] [--processes 1] [--db FILE | postgres://…] [--wire] [--delay-ms N]
//! ```
//! With `--wire` (PostgreSQL only) the workers reach the server through a loopback proxy that
//! counts round trips as the wire sees them (client turns: statements, pipelines, pings), and
//! the figures add `wire_round_trips_per_step`; `--delay-ms N` makes the proxy hold every chunk
//! N ms each way, as a server on another machine would (queueing the tasks does not go through
//! it).
//! On PostgreSQL the figures also hold what the run cost the server per step (`server`:
//! statements and their execution time from pg_stat_statements where the server loads it, WAL
//! bytes, and the CPU time of its processes when it runs on this machine) and the workers' CPU
//! time per step (`worker_cpu_us_per_step`, not when one process also runs the proxy).
//! With `--start-latency` it measures instead how soon queued work starts on an idle worker:
//! 200 single tasks queued one at a time (p50/p99, queued → first step), then one batch of
//! `--tasks` tasks (queued → its first step); `--no-signal` makes the worker poll (every
//! 500 ms) instead of waiting on the store's work signal (PostgreSQL's LISTEN/NOTIFY).
//! Under `cargo test` (no `--bench` argument) it runs 20 tasks of 3 steps, as a smoke test.
//! Without `--db` a fresh SQLite file (synchronous = FULL) in a temporary directory is used.
//! With `--processes N > 1` the tasks are run by N worker processes (this program re-run with
//! `--join BATCH`), each with `--concurrency` slots. Prints one JSON line of figures.

use std::sync::Arc;

use skillstate_bench::queue::{Measure, run_queue_bench, work};

struct Args {
    tasks: usize,
    steps: u32,
    concurrency: usize,
    processes: usize,
    db: Option<String>,
    join: Option<String>,
    bench: bool,
    wire: bool,
    delay_ms: u64,
    start_latency: bool,
    no_signal: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        tasks: 10_000,
        steps: 20,
        concurrency: 64,
        processes: 1,
        db: None,
        join: None,
        bench: false,
        wire: false,
        delay_ms: 0,
        start_latency: false,
        no_signal: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |text: String| -> Result<usize, String> {
            text.parse()
                .map_err(|_| format!("{flag}: `{text}` is not a positive number"))
        };
        match flag.as_str() {
            "--tasks" => args.tasks = number(value()?)?,
            "--steps" => {
                args.steps = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--concurrency" => args.concurrency = number(value()?)?.max(1),
            "--processes" => args.processes = number(value()?)?.max(1),
            "--db" => args.db = Some(value()?),
            "--join" => args.join = Some(value()?),
            "--wire" => args.wire = true,
            "--start-latency" => args.start_latency = true,
            "--no-signal" => args.no_signal = true,
            "--delay-ms" => {
                args.delay_ms = number(value()?)? as u64;
                args.wire = true;
            }
            // `cargo bench` passes --bench; `cargo test` does not and gets a smoke run.
            "--bench" => args.bench = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if !args.bench && args.join.is_none() {
        // Under `cargo test` (no --bench): check the benchmark runs, on a few small tasks.
        args.tasks = args.tasks.min(20);
        args.steps = args.steps.min(3);
    }
    Ok(args)
}

fn main() {
    if let Err(error) = run() {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let location = match &args.db {
            Some(db) => db.clone(),
            None => dir.path().join("queue.db").display().to_string(),
        };
        let store = skillstate_store::open(&location)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(batch) = &args.join {
            let done = work(store, batch, args.steps, args.concurrency).await?;
            eprintln!(
                "worker {}: {} tasks, {:.0} steps/s",
                std::process::id(),
                done.stats.completed,
                done.steps_per_sec()
            );
            return Ok(());
        }
        if args.start_latency {
            let singles = if args.bench { 200 } else { 5 };
            let report = skillstate_bench::queue::start_latency(
                Arc::clone(&store),
                Arc::clone(&store),
                singles,
                args.tasks,
                args.concurrency,
                !args.no_signal,
            )
            .await?;
            println!(
                "{}",
                serde_json::to_value(&report).map_err(|e| e.to_string())?
            );
            return Ok(());
        }
        // The workers' way to the database: through the counting proxy with --wire.
        let proxy = if args.wire {
            let placeholder = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            let (_, upstream) = skillstate_bench::wire::through_proxy(&location, placeholder)
                .ok_or_else(|| {
                    format!("--wire counts PostgreSQL round trips: give --db postgres://HOST:PORT/…, not `{location}`")
                })?;
            let upstream = tokio::net::lookup_host(&upstream)
                .await
                .map_err(|e| format!("--wire: cannot resolve {upstream}: {e}"))?
                .next()
                .ok_or_else(|| format!("--wire: {upstream} resolves to no address"))?;
            let delay = std::time::Duration::from_millis(args.delay_ms);
            Some(
                skillstate_bench::wire::WireProxy::start(upstream, delay)
                    .await
                    .map_err(|e| format!("--wire: cannot start the proxy: {e}"))?,
            )
        } else {
            None
        };
        let worker_location = match &proxy {
            Some(proxy) => skillstate_bench::wire::through_proxy(&location, proxy.addr())
                .map(|(url, _)| url)
                .unwrap_or_else(|| location.clone()),
            None => location.clone(),
        };
        let worker_store = if proxy.is_some() {
            skillstate_store::open(&worker_location)
                .await
                .map_err(|e| e.to_string())?
        } else {
            Arc::clone(&store)
        };
        // Opening the worker's store (the schema check) is not a step's cost.
        let turns_before = proxy.as_ref().map_or(0, |proxy| proxy.turns());
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let join = |batch: &str| {
            tokio::process::Command::new(&exe)
                .args(["--join", batch, "--db", &worker_location])
                .args(["--steps", &args.steps.to_string()])
                .args(["--concurrency", &args.concurrency.to_string()])
                .kill_on_drop(true)
                .spawn()
        };
        let report = run_queue_bench(
            Arc::clone(&store),
            worker_store,
            args.tasks,
            args.steps,
            args.concurrency,
            args.processes,
            join,
            Measure {
                server: Some(location.as_str()),
                own_cpu_is_workers: proxy.is_none(),
            },
        )
        .await?;
        let mut figures = serde_json::to_value(&report).map_err(|e| e.to_string())?;
        if let (Some(proxy), Some(map)) = (&proxy, figures.as_object_mut()) {
            let turns = proxy.turns() - turns_before;
            map.insert("wire_round_trips".into(), turns.into());
            map.insert(
                "wire_round_trips_per_step".into(),
                (turns as f64 / report.steps.max(1) as f64).into(),
            );
            map.insert("delay_ms_each_way".into(), args.delay_ms.into());
        }
        println!("{figures}");
        if report.completed as usize != args.tasks {
            return Err(format!(
                "{} of {} tasks completed ({} failed)",
                report.completed, args.tasks, report.failed
            ));
        }
        Ok(())
    })
}
