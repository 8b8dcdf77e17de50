use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use skillstate_bench::archive::{
    ARCHIVE_KIND, ArchiveConfig, Arm, DEFAULT_ARCHIVE_BUDGET, load_skill, run_archive,
    write_archive_outputs,
};
use skillstate_bench::long_task::{
    CURVE_MAX_STEPS, CURVE_MIN_STEPS, CurveConfig, CurveModel, run_curve,
};
use skillstate_bench::{BenchConfig, run_bench, write_outputs};
use skillstate_core::ContextStrategy;

use crate::config::load_config;
use crate::model::{ModelArgs, build_model};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The environment to bench (`warehouse`); its skill is skills/<environment> unless --skill.
    environment: String,
    /// The skill directory to bench.
    #[arg(long)]
    skill: Option<PathBuf>,
    /// Horizons T (events per run). Default 10,25,50,100,200; 50 with --noise or --drift.
    #[arg(long, value_delimiter = ',')]
    horizons: Option<Vec<u32>>,
    /// Number of seeds (0, 1, 2, ...).
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// Context strategies to compare (default: all five; with --long-task: state).
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy)]
    strategies: Option<Vec<ContextStrategy>>,
    /// Token budget for `window` (default 1800) and `summary` (capped only when given).
    #[arg(long, value_parser = crate::limits::parse_budget)]
    budget: Option<usize>,
    /// Telemetry lines per observation; several levels give one row each.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    noise: Vec<u32>,
    /// Run the drift scenarios (secret move, secret audit, secret barcode, canceled order).
    #[arg(long)]
    drift: bool,
    /// The model (default `oracle`: reads only the prompt and acts optimally on it).
    #[command(flatten)]
    model: ModelArgs,
    /// Where results.json, report.md and prompt_tokens.svg go.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Runs at once (default: the number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Instead of the strategy table: run ONE task of this many steps on a SQLite file with
    /// synchronous=FULL and report the median in-loop step time of steps 101–200 and of the
    /// last 100 steps, and their ratio (long_task.json in --out). Scripted answers keep the
    /// state's size fixed; with --model oracle the real episode runs (seed 0).
    #[arg(long, value_name = "STEPS", conflicts_with_all = ["horizons", "noise", "drift", "budget", "jobs"])]
    long_task: Option<u32>,
    /// With --long-task: commit with synchronous=NORMAL instead of FULL.
    #[arg(long, requires = "long_task")]
    normal_sync: bool,
    /// The warehouse-archive workload (skills/warehouse-archive: 5,000 shelves, facts that
    /// outgrow the state): state+recall against state alone, window and summary at the same
    /// budget (--budget, default 4000). Default horizons 1000; archive.json, archive.md and
    /// archive_prompt_tokens.svg in --out.
    #[arg(long, conflicts_with_all = ["long_task", "noise", "drift", "strategies"])]
    archive: bool,
    /// With --archive: the arms to run (default all: state+recall, state, window, summary).
    #[arg(long, value_delimiter = ',', value_parser = parse_arm, requires = "archive")]
    arms: Option<Vec<Arm>>,
}

/// Most seeds one bench runs: every seed is a run in every cell of the table.
const MAX_SEEDS: u64 = 10_000;

fn parse_arm(name: &str) -> Result<Arm, String> {
    Arm::parse(name).ok_or_else(|| format!("unknown arm `{name}`; use: {}", Arm::NAMES.join(", ")))
}

fn parse_strategy(name: &str) -> Result<ContextStrategy, String> {
    ContextStrategy::parse(name).ok_or_else(|| {
        format!(
            "unknown strategy `{name}`; use: {}",
            ContextStrategy::NAMES.join(", ")
        )
    })
}

pub fn run(config_path: Option<&Path>, args: BenchArgs) -> Result<ExitCode> {
    let archive = args.archive || args.environment == ARCHIVE_KIND;
    if archive && !matches!(args.environment.as_str(), "warehouse" | ARCHIVE_KIND) {
        bail!(
            "--archive is the warehouse's archive workload: run `bench warehouse --archive` (not `{}`)",
            args.environment
        );
    }
    let default_skill = if archive {
        ARCHIVE_KIND
    } else {
        args.environment.as_str()
    };
    let skill_dir = args
        .skill
        .clone()
        .unwrap_or_else(|| PathBuf::from("skills").join(default_skill));
    if !skill_dir.join("SKILL.md").is_file() {
        bail!(
            "no skill for environment `{}` at {}; run from the repository root or pass --skill <dir>",
            args.environment,
            skill_dir.display()
        );
    }
    if let Some(steps) = args.long_task {
        return long_task(&skill_dir, &args, steps);
    }
    if !(1..=MAX_SEEDS).contains(&args.seeds) {
        bail!("--seeds must be from 1 to {MAX_SEEDS} (each seed is one run per cell)");
    }
    if archive {
        return archive_bench(config_path, &skill_dir, &args);
    }
    let horizons = args.horizons.clone().unwrap_or_else(|| {
        if args.drift || args.noise.iter().any(|n| *n > 0) {
            vec![50]
        } else {
            vec![10, 25, 50, 100, 200]
        }
    });
    if horizons.is_empty() || horizons.contains(&0) {
        bail!("--horizons must list positive numbers of events");
    }
    let drifts = if args.drift {
        skillstate_envs::drift_scenarios(&args.environment)
            .iter()
            .map(|d| (*d).to_owned())
            .collect()
    } else {
        Vec::new()
    };
    let file_config = load_config(config_path)?;
    let default_model = args.model.model.is_none().then_some("oracle");
    let (spec, settings) = args.model.resolve(&file_config, default_model)?;
    let model = if spec == "oracle" {
        None
    } else {
        Some(build_model(&spec, &settings, Some(&args.environment))?)
    };
    let config = BenchConfig {
        environment: args.environment.clone(),
        horizons,
        seeds: (0..args.seeds).collect(),
        strategies: args
            .strategies
            .clone()
            .unwrap_or_else(|| ContextStrategy::ALL.to_vec()),
        budget: args.budget,
        noise: args.noise.clone(),
        drifts,
        price: file_config.prices.get(&spec).copied(),
        model: spec,
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
    };
    let total = config.specs().len();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} runs")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = run_bench(&skill_dir, &config, model, &|done, _| {
        bar.set_position(done as u64)
    })
    .with_context(|| format!("bench {}", args.environment))?;
    bar.finish_and_clear();
    out!("{}", report.table());
    let written = write_outputs(&report, &args.out)?;
    outln!();
    for path in written {
        outln!("wrote {}", path.display());
    }
    // The table shows failed runs; the exit status says so too, for scripts.
    let failed = report
        .runs
        .iter()
        .filter(|r| r.status != "completed")
        .count();
    if failed > 0 {
        errln!(
            "{failed} of {} runs did not complete (see `failure` in results.json)",
            report.runs.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Most events an archive run may have (the environment's own limit).
const MAX_ARCHIVE_EVENTS: u32 = 100_000;

/// `--archive`: the warehouse-archive comparison.
fn archive_bench(
    config_path: Option<&Path>,
    skill_dir: &Path,
    args: &BenchArgs,
) -> Result<ExitCode> {
    let horizons = args.horizons.clone().unwrap_or_else(|| vec![1_000]);
    if horizons.is_empty()
        || horizons
            .iter()
            .any(|h| !(1..=MAX_ARCHIVE_EVENTS).contains(h))
    {
        bail!("--horizons must list numbers of events from 1 to {MAX_ARCHIVE_EVENTS}");
    }
    let skill = load_skill(skill_dir)?;
    let file_config = load_config(config_path)?;
    let default_model = args.model.model.is_none().then_some("oracle");
    let (spec, settings) = args.model.resolve(&file_config, default_model)?;
    let model = if spec == "oracle" {
        None
    } else {
        Some(build_model(&spec, &settings, Some(ARCHIVE_KIND))?)
    };
    let config = ArchiveConfig {
        horizons,
        seeds: (0..args.seeds).collect(),
        arms: args.arms.clone().unwrap_or_else(|| Arm::ALL.to_vec()),
        budget: args.budget.unwrap_or(DEFAULT_ARCHIVE_BUDGET),
        model: spec,
        state_tokens: skill.settings().budgets.state_tokens,
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
    };
    let total = config.specs().len();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} runs")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = run_archive(skill_dir, &config, model, &|done, _| {
        bar.set_position(done as u64)
    })
    .context("bench warehouse --archive")?;
    bar.finish_and_clear();
    out!("{}", report.table());
    let written = write_archive_outputs(&report, &args.out)?;
    outln!();
    for path in written {
        outln!("wrote {}", path.display());
    }
    let failed = report.runs.iter().filter(|r| !r.completed()).count();
    if failed > 0 {
        errln!(
            "{failed} of {} runs did not complete (see `failure` in archive.json)",
            report.runs.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `--long-task`: one task of `steps` steps, its step-time curve.
fn long_task(skill_dir: &Path, args: &BenchArgs, steps: u32) -> Result<ExitCode> {
    if !(CURVE_MIN_STEPS..=CURVE_MAX_STEPS).contains(&steps) {
        bail!(
            "--long-task must be from {CURVE_MIN_STEPS} to {CURVE_MAX_STEPS} steps (the early window is steps 101–200)"
        );
    }
    // The default answers keep the state's size fixed; `--model oracle` runs the real episode.
    let model = match args.model.model.as_deref() {
        None => CurveModel::Steady,
        Some("oracle") => CurveModel::Oracle,
        Some(other) => bail!(
            "--long-task measures the runtime, not a model: drop --model `{other}` (fixed-size state) or pass --model oracle (the real episode)"
        ),
    };
    let strategy = match args.strategies.as_deref() {
        None => ContextStrategy::State,
        Some([one]) => *one,
        Some(_) => bail!("--long-task runs one task: give at most one strategy"),
    };
    let config = CurveConfig {
        steps,
        model,
        seed: 0,
        strategy,
        full_sync: !args.normal_sync,
        dir: std::env::temp_dir(),
    };
    let bar = ProgressBar::new(u64::from(steps));
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} steps")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ticks = bar.clone();
    let report = tokio::runtime::Handle::current()
        .block_on(run_curve(
            skill_dir,
            &config,
            Box::new(move |step| {
                if step % 100 == 0 {
                    ticks.set_position(step)
                }
            }),
        ))
        .with_context(|| format!("bench {} --long-task {steps}", args.environment))?;
    bar.finish_and_clear();
    out!("{}", report.text());
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let path = args.out.join("long_task.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))?;
    outln!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}
