//! Board throughput: N agents writing disjoint parts of one board at full speed.
//!
//! ```text
//! cargo bench -p skillstate-bench --bench board -- [--agents 8] [--steps 200]
//!     [--db FILE | postgres://…]
//! cargo bench -p skillstate-bench --bench board -- --team [--seeds 10] [--bugs 3]
//!     [--db FILE | postgres://…]
//! ```
//! `--team` runs the bugfix team instead (skills/bugfix-coder and skills/bugfix-reviewer on
//! a boards/bugfix board, with the oracle, once per seed 0..N; see `skillstate_bench::team`)
//! and prints its per-agent table after the JSON line.
//!
//! Under `cargo test` (no `--bench` argument) it runs 3 agents of 4 steps and the team on one
//! seed with 2 bugs, as a smoke test that also checks what the benchmarks report (every agent
//! completes, no conflicts, the journals replay to the boards, the team's release is out).
//! Without `--db` a fresh SQLite file (synchronous = FULL) in a temporary directory is used.
//! Prints one JSON line of figures per benchmark.

use std::path::Path;

use skillstate_bench::board::{report_json, run_board_bench};
use skillstate_bench::team::{TeamConfig, run_team_bench, team_table};
use skillstate_store::Store;

struct Args {
    agents: usize,
    steps: u32,
    db: Option<String>,
    bench: bool,
    team: bool,
    seeds: u64,
    bugs: u32,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        agents: 8,
        steps: 200,
        db: None,
        bench: false,
        team: false,
        seeds: 10,
        bugs: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |text: String| -> Result<usize, String> {
            text.parse::<usize>()
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| format!("{flag}: `{text}` is not a number from 1 to 100000"))
        };
        match flag.as_str() {
            "--agents" => args.agents = number(value()?)?.min(1000),
            "--steps" => {
                args.steps = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--db" => args.db = Some(value()?),
            "--bench" => args.bench = true,
            "--team" => args.team = true,
            "--seeds" => args.seeds = number(value()?)?.min(1000) as u64,
            "--bugs" => {
                args.bugs = number(value()?)?
                    .try_into()
                    .ok()
                    .filter(|b| (1..=5).contains(b))
                    .ok_or("--bugs: use a number from 1 to 5")?
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if !args.bench {
        args.agents = args.agents.min(3);
        args.steps = args.steps.min(4);
        args.seeds = 1;
        args.bugs = args.bugs.min(2);
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
        let (location, backend) = match &args.db {
            Some(db) if db.starts_with("postgres") => (db.clone(), "postgres"),
            Some(db) => (db.clone(), "sqlite"),
            None => (dir.path().join("board.db").display().to_string(), "sqlite"),
        };
        let store = skillstate_store::open(&location)
            .await
            .map_err(|e| format!("{location}: {e}"))?;
        if args.team || !args.bench {
            team(&args, store.clone(), backend).await?;
        }
        if args.team {
            return Ok(());
        }
        let report = run_board_bench(store, backend, args.agents, args.steps).await?;
        println!("{}", report_json(&report));
        if !args.bench {
            // The smoke run checks the benchmark measures what it says.
            if report.completed != args.agents
                || report.conflicts != 0
                || !report.replay_ok
                || report.board_writes != u64::from(args.steps) * args.agents as u64
            {
                return Err(format!(
                    "the board benchmark's smoke run went wrong: {report:?}"
                ));
            }
        }
        Ok(())
    })
}

/// The bugfix team, once per seed.
async fn team(args: &Args, store: std::sync::Arc<dyn Store>, backend: &str) -> Result<(), String> {
    let config = TeamConfig {
        root: Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
        seeds: (0..args.seeds).collect(),
        bugs: args.bugs,
    };
    let report = run_team_bench(store, backend, &config).await?;
    println!(
        "{}",
        serde_json::to_value(&report).map_err(|e| e.to_string())?
    );
    println!("{}", team_table(&report));
    if !args.bench {
        let agents = [&report.coder, &report.reviewer];
        if report.released != 1
            || !report.replay_ok
            || agents
                .iter()
                .any(|a| a.completed != 1 || a.conflicts != 0 || a.board_writes == 0)
        {
            return Err(format!(
                "the team benchmark's smoke run went wrong: {report:?}"
            ));
        }
    }
    Ok(())
}
