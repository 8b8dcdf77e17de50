//! skillbench end to end with the oracle on the shipped warehouse skill: the table's
//! invariants, determinism, and the paper's scaling, budget and drift properties (checked as
//! relations between strategies, never as fixed numbers).
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skillstate_bench::{BenchConfig, BenchReport, Group, run_bench, write_outputs};
use skillstate_core::ContextStrategy;
use skillstate_envs::oracle::OracleModel;
use skillstate_envs::warehouse::{WarehouseConfig, generate_events};
use skillstate_providers::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ScriptedModel,
};

fn skill_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse")
}

fn config(horizons: Vec<u32>, seeds: u64, strategies: &[ContextStrategy]) -> BenchConfig {
    BenchConfig {
        environment: "warehouse".into(),
        horizons,
        seeds: (0..seeds).collect(),
        strategies: strategies.to_vec(),
        budget: None,
        noise: vec![0],
        drifts: Vec::new(),
        model: "oracle".into(),
        price: None,
        jobs: 2,
    }
}

fn run(config: &BenchConfig) -> BenchReport {
    run_bench(&skill_dir(), config, None, &|_, _| {}).unwrap()
}

fn group(report: &BenchReport, strategy: ContextStrategy) -> &Group {
    report
        .groups
        .iter()
        .find(|g| g.strategy == strategy)
        .unwrap()
}

#[test]
fn a_small_bench_has_a_consistent_table_and_outputs() {
    let report = run(&config(vec![10], 1, &ContextStrategy::ALL));
    assert_eq!(report.runs.len(), 5);
    for run in &report.runs {
        assert_eq!(run.status, "completed", "{:?}", run.spec);
        assert_eq!(run.steps, 10);
        assert_eq!(run.prompt_tokens_per_step.len(), 10);
        assert!(
            run.total_tokens > run.total_prompt_tokens
                && run.total_prompt_tokens >= run.prompt_tokens_per_step.iter().sum()
        );
        assert!(run.prompt_max >= run.prompt_last);
        assert!(run.prompt_mean.unwrap() <= run.prompt_max as f64);
        assert_eq!(run.failure, None);
        assert!((0.0..=1.0).contains(&run.score));
        assert_eq!(run.rejected_answers, 0, "the oracle always answers validly");
    }
    // Every strategy renders the same prefix; transcripts only add to it.
    let state = group(&report, ContextStrategy::State);
    for strategy in [
        ContextStrategy::History,
        ContextStrategy::Stateful,
        ContextStrategy::Summary,
    ] {
        assert!(
            group(&report, strategy).total_tokens.unwrap().mean > state.total_tokens.unwrap().mean,
            "{strategy:?}"
        );
    }
    let history = report
        .runs
        .iter()
        .find(|r| r.spec.strategy == ContextStrategy::History)
        .unwrap();
    assert!(
        history
            .prompt_tokens_per_step
            .windows(2)
            .all(|w| w[1] > w[0]),
        "the transcript grows every step"
    );
    assert_eq!(state.score.mean, 1.0);
    assert_eq!((state.completed, state.token_runs), (1, 1));

    let table = report.table();
    assert!(
        !table.contains(" ok)") && !table.contains("failed"),
        "{table}"
    );
    for name in ContextStrategy::NAMES {
        assert!(table.contains(name), "{table}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let written = write_outputs(&report, tmp.path()).unwrap();
    assert_eq!(written.len(), 3);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("results.json")).unwrap())
            .unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 5);
    let svg = std::fs::read_to_string(tmp.path().join("prompt_tokens.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("polyline"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    assert!(
        std::fs::read_to_string(tmp.path().join("report.md"))
            .unwrap()
            .contains("| T |")
    );
}

fn without_wall_times(mut value: Value) -> Value {
    match &mut value {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with("wall_ms"));
            for v in map.values_mut() {
                *v = without_wall_times(v.take());
            }
        }
        Value::Array(items) => {
            for v in items.iter_mut() {
                *v = without_wall_times(v.take());
            }
        }
        _ => {}
    }
    value
}

#[test]
fn the_same_seeds_give_identical_results() {
    let mut c = config(vec![12], 2, &ContextStrategy::ALL);
    c.noise = vec![3];
    let first = serde_json::to_value(run(&c)).unwrap();
    c.jobs = 1;
    let second = serde_json::to_value(run(&c)).unwrap();
    assert_eq!(
        without_wall_times(first.clone()),
        without_wall_times(second)
    );
    c.seeds = vec![5, 6];
    let other = serde_json::to_value(run(&c)).unwrap();
    assert_ne!(
        without_wall_times(first),
        without_wall_times(other),
        "different seeds, different events"
    );
}

#[test]
fn state_prompts_stay_flat_while_transcripts_grow_linearly() {
    let report = run(&config(
        vec![25, 100],
        2,
        &[
            ContextStrategy::State,
            ContextStrategy::History,
            ContextStrategy::Stateful,
        ],
    ));
    let fit = |s: ContextStrategy| report.scaling.iter().find(|f| f.strategy == s).unwrap();
    let state = fit(ContextStrategy::State);
    assert!(
        state.prompt_growth.abs() < 0.10,
        "state prompt grew {:.1}% over the run",
        state.prompt_growth * 100.0
    );
    for s in [ContextStrategy::History, ContextStrategy::Stateful] {
        let f = fit(s);
        assert!(
            f.prompt_per_step.slope > 0.0 && f.prompt_per_step.r_squared >= 0.95,
            "{s:?}: {f:?}"
        );
        assert!(
            f.total_tokens_exponent.unwrap() > state.total_tokens_exponent.unwrap() + 0.2,
            "{s:?}: {f:?}"
        );
    }
    assert!(
        (state.total_tokens_exponent.unwrap() - 1.0).abs() < 0.1,
        "{state:?}"
    );
    // total ≈ a·T + b·T²: b is negligible for state and clearly positive for transcripts.
    let quadratic = |s: ContextStrategy| fit(s).total_tokens_quadratic.unwrap();
    let state_q = quadratic(ContextStrategy::State);
    assert!(
        state_q.slope * 100.0 < 0.1 * state_q.intercept,
        "{state_q:?}"
    );
    for s in [ContextStrategy::History, ContextStrategy::Stateful] {
        let q = quadratic(s);
        assert!(q.slope * 100.0 > 2.0 * q.intercept, "{s:?}: {q:?}");
    }
}

#[test]
fn under_a_tight_budget_the_window_forgets_and_state_does_not() {
    let mut c = config(
        vec![100],
        2,
        &[ContextStrategy::State, ContextStrategy::Window],
    );
    c.budget = Some(1800);
    let report = run(&c);
    let state = group(&report, ContextStrategy::State).score.mean;
    let window = group(&report, ContextStrategy::Window).score.mean;
    assert!(state >= 0.95, "state scored {state}");
    assert!(window < state - 0.15, "window {window} vs state {state}");
    let window_prompts = report
        .runs
        .iter()
        .filter(|r| r.spec.strategy == ContextStrategy::Window);
    for run in window_prompts {
        assert!(
            run.prompt_max <= 1800 + 40,
            "window prompt {} over the budget",
            run.prompt_max
        );
    }
}

#[test]
fn with_drift_the_state_strategy_recovers_at_once() {
    let mut c = config(
        vec![40],
        2,
        &[ContextStrategy::State, ContextStrategy::Window],
    );
    c.drifts = skillstate_envs::drift_scenarios("warehouse")
        .iter()
        .map(|d| (*d).to_owned())
        .collect();
    let report = run(&c);
    assert_eq!(report.groups.len(), 8);
    for g in report
        .groups
        .iter()
        .filter(|g| g.strategy == ContextStrategy::State)
    {
        assert_eq!(g.recovery_steps.unwrap().mean, 0.0, "{:?}", g.drift);
        assert_eq!(g.recovered_runs, Some(2), "{:?}", g.drift);
        assert_eq!(g.score.mean, 1.0, "{:?}", g.drift);
    }
    assert!(report.table().contains("rec "));
}

#[test]
fn the_repository_environment_benches_too() {
    let mut c = config(
        vec![30],
        2,
        &[
            ContextStrategy::State,
            ContextStrategy::History,
            ContextStrategy::Window,
        ],
    );
    c.environment = "repository".into();
    let report = run_bench(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/repository"),
        &c,
        None,
        &|_, _| {},
    )
    .unwrap();
    for run in &report.runs {
        assert_eq!(run.status, "completed");
        assert_eq!(run.steps, 30);
        assert_eq!(run.rejected_answers, 0, "{:?}", run.spec);
    }
    assert_eq!(group(&report, ContextStrategy::State).score.mean, 1.0);
    assert_eq!(group(&report, ContextStrategy::History).score.mean, 1.0);
    assert!(
        group(&report, ContextStrategy::History)
            .total_tokens
            .unwrap()
            .mean
            > group(&report, ContextStrategy::State)
                .total_tokens
                .unwrap()
                .mean
    );
    // A skill for one environment cannot be benched as another.
    c.environment = "warehouse".into();
    let error = run_bench(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/repository"),
        &c,
        None,
        &|_, _| {},
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("runs in the `repository` environment"),
        "{error}"
    );
}

/// A one-strategy bench whose runs all share `model`.
fn run_with(horizon: u32, seeds: u64, model: Arc<dyn ModelProvider>) -> BenchReport {
    let mut c = config(vec![horizon], seeds, &[ContextStrategy::State]);
    c.model = model.spec();
    run_bench(&skill_dir(), &c, Some(model), &|_, _| {}).unwrap()
}

/// The oracle, except that it answers nonsense to every prompt containing `marker`.
struct FailsOn {
    oracle: OracleModel,
    marker: String,
}

impl ModelProvider for FailsOn {
    fn spec(&self) -> String {
        "oracle-that-fails-on-one-alert".into()
    }

    fn complete<'a, 'b, 'f>(
        &'a self,
        request: &'b ModelRequest,
    ) -> Pin<Box<dyn Future<Output = Result<ModelResponse, ProviderError>> + Send + 'f>>
    where
        'a: 'f,
        'b: 'f,
        Self: 'f,
    {
        Box::pin(async move {
            if request.prompt.text().contains(&self.marker) {
                return Ok(ModelResponse {
                    text: "this is not an answer".into(),
                    usage: None,
                    latency: Duration::ZERO,
                    truncated: false,
                });
            }
            self.oracle.complete(request).await
        })
    }
}

/// Failed runs are visible: the cell says how many of its runs completed, and token figures
/// average only the runs that committed a step instead of counting a failed run as 0 tokens.
#[test]
fn failed_runs_are_counted_and_never_averaged_as_zero_tokens() {
    let horizon = 6;
    // Seed 1's first alert never occurs with seed 0: the model fails seed 1 at step 1 only.
    let marker = generate_events(&WarehouseConfig::new(1, horizon))[0]
        .alert
        .clone();
    assert!(
        generate_events(&WarehouseConfig::new(0, horizon))
            .iter()
            .all(|e| !e.alert.contains(&marker))
    );
    let model = FailsOn {
        oracle: OracleModel::for_environment("warehouse").unwrap(),
        marker,
    };
    let report = run_with(horizon, 2, Arc::new(model));

    let ok = &report.runs[0];
    let failed = &report.runs[1];
    assert_eq!((ok.spec.seed, ok.status.as_str()), (0, "completed"));
    assert_eq!((failed.spec.seed, failed.status.as_str()), (1, "failed"));
    assert_eq!(failed.steps, 0);
    assert_eq!(failed.prompt_mean, None, "no step, no prompt size");
    assert!(
        failed
            .failure
            .as_deref()
            .unwrap()
            .contains("answers was rejected"),
        "{:?}",
        failed.failure
    );
    assert_eq!(failed.score, 0.0, "it handled none of the events");
    assert_eq!(ok.score, 1.0);

    let g = group(&report, ContextStrategy::State);
    assert_eq!((g.seeds, g.completed, g.token_runs), (2, 1, 1));
    assert_eq!(g.score.mean, 0.5, "the score counts every run");
    let prompt = g.prompt_mean.unwrap();
    assert_eq!(
        (prompt.mean, prompt.sd),
        (ok.prompt_mean.unwrap(), 0.0),
        "averaged over the completed run only"
    );
    assert_eq!(g.total_tokens.unwrap().mean, ok.total_tokens as f64);
    assert!(
        report
            .scaling
            .iter()
            .any(|s| s.strategy == ContextStrategy::State),
        "the completed run still gives a fit"
    );

    let table = report.table();
    let row = table.lines().find(|l| l.starts_with("6 ")).unwrap();
    assert!(row.ends_with(" (1/2 ok)"), "{table}");
    let prompt = ok.prompt_mean.unwrap().round() as u64;
    assert!((1_000..1_000_000).contains(&prompt));
    let shown = format!("{},{:03}", prompt / 1000, prompt % 1000);
    assert!(row.contains(&format!(" / {shown}±0 / ")), "{table}");
    assert!(table.contains("1 of 2 runs failed."), "{table}");
    assert!(report.markdown().contains("(1/2 ok)"));
}

/// A cell none of whose runs committed a step shows no token figures at all (not 0±0), and
/// results.json records each run's status and reason.
#[test]
fn a_cell_whose_runs_all_failed_shows_no_token_figures() {
    // A script without a single output: every run fails at its first model call.
    let model = ScriptedModel::from_outputs("empty.jsonl".into(), Vec::new());
    let report = run_with(5, 2, Arc::new(model));
    let g = group(&report, ContextStrategy::State);
    assert_eq!((g.completed, g.token_runs), (0, 0));
    assert_eq!(
        (g.prompt_mean, g.prompt_max, g.total_tokens),
        (None, None, None)
    );
    for run in &report.runs {
        let failure = run.failure.as_deref().unwrap();
        assert!(failure.contains("the script is exhausted"), "{failure}");
        assert_eq!((run.steps, run.prompt_mean, run.score), (0, None, 0.0));
    }
    let table = report.table();
    let row = table.lines().find(|l| l.starts_with("5 ")).unwrap();
    assert_eq!(row, "5 | 0.00±0.00 / — / — (0/2 ok)", "{table}");
    assert!(
        !table.contains("Scaling"),
        "no completed run, no fit: {table}"
    );

    let tmp = tempfile::tempdir().unwrap();
    write_outputs(&report, tmp.path()).unwrap();
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("results.json")).unwrap())
            .unwrap();
    for run in json["runs"].as_array().unwrap() {
        assert_eq!(run["status"], "failed");
        assert!(run["failure"].is_string());
        assert!(run["prompt_mean"].is_null());
    }
    assert_eq!(json["groups"][0]["completed"], 0);
    assert!(json["groups"][0]["prompt_mean"].is_null());
    let svg = std::fs::read_to_string(tmp.path().join("prompt_tokens.svg")).unwrap();
    assert!(svg.contains("state (no completed run)"));
}
