//! Board throughput: N agents writing disjoint parts of one board at full speed.
//!
//! ```text
//! cargo bench -p skillstate-bench --bench board -- [--agents 8] [--steps 200]
//!     [--db FILE | postgres://…]
//! ```
//! Under `cargo test` (no `--bench` argument) it runs 3 agents of 4 steps, as a smoke test
//! that also checks what the benchmark reports (every agent completes, no conflicts, the
//! journal replays to the board). Without `--db` a fresh SQLite file (synchronous = FULL) in a
//! temporary directory is used. Prints one JSON line of figures.

use skillstate_bench::board::{report_json, run_board_bench};

struct Args {
    agents: usize,
    steps: u32,
    db: Option<String>,
    bench: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        agents: 8,
        steps: 200,
        db: None,
        bench: false,
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
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if !args.bench {
        args.agents = args.agents.min(3);
        args.steps = args.steps.min(4);
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
