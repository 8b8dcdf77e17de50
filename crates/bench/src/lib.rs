//! skillbench: runs a skill's environment under every context strategy with the same seeded
//! events, measures score and tokens from the journal, and reports the comparison the way the
//! SKILL.state paper does (Table 1 shape, scaling fits, a prompt-size chart).

pub mod archive;
pub mod board;
mod chart;
mod job;
pub mod long_task;
pub mod queue;
mod report;
pub mod server_cost;
pub mod stats;
pub mod team;
pub mod wire;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use skillstate_core::{ContextStrategy, Skill};

pub use job::{RunResult, RunSpec};
pub use report::{BenchReport, Group, Scaling};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Store(skillstate_store::StoreError),
    #[error(transparent)]
    Runtime(skillstate_runtime::RuntimeError),
    #[error("cannot write {path}: {message}")]
    Output { path: String, message: String },
}

/// What to run. Every combination of horizon × noise × drift × seed × strategy is one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    pub environment: String,
    pub horizons: Vec<u32>,
    pub seeds: Vec<u64>,
    pub strategies: Vec<ContextStrategy>,
    /// Context budget for `window` and `summary`.
    pub budget: Option<usize>,
    pub noise: Vec<u32>,
    /// Drift scenarios to run; empty means no drift.
    pub drifts: Vec<String>,
    pub model: String,
    /// Price of the model, for the cost column (from `[prices]` in skillstate.toml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<skillstate_providers::Price>,
    /// Runs at once (at most this many threads).

    #[serde(skip)]
    pub jobs: usize,
}

impl BenchConfig {
    pub fn specs(&self) -> Vec<RunSpec> {
        let drifts: Vec<Option<String>> = if self.drifts.is_empty() {
            vec![None]
        } else {
            self.drifts.iter().cloned().map(Some).collect()
        };
        let mut specs = Vec::new();
        for &horizon in &self.horizons {
            for &noise in &self.noise {
                for drift in &drifts {
                    for &seed in &self.seeds {
                        for &strategy in &self.strategies {
                            specs.push(RunSpec {
                                horizon,
                                noise,
                                drift: drift.clone(),
                                seed,
                                strategy,
                            });
                        }
                    }
                }
            }
        }
        specs
    }
}

/// Called after each finished run with (finished, total).
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Runs every run of `config` for the skill in `skill_dir`, spread over `config.jobs` threads.
/// `model` is shared by every run; `None` runs the oracle.
pub fn run_bench(
    skill_dir: &Path,
    config: &BenchConfig,
    model: Option<Arc<dyn skillstate_providers::ModelProvider>>,
    progress: Progress<'_>,
) -> Result<BenchReport, BenchError> {
    let skill = Skill::load(skill_dir)
        .map_err(|e| BenchError::Setup(e.to_string()))?
        .skill;
    let environment_kind = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.clone())
        .ok_or_else(|| BenchError::Setup(format!("skill `{}` has no [environment] in skill.toml; only skills with a built-in environment can be benched", skill.name())))?;
    if environment_kind != config.environment {
        return Err(BenchError::Setup(format!(
            "the skill in {} runs in the `{environment_kind}` environment, not `{}`",
            skill_dir.display(),
            config.environment
        )));
    }
    let context = job::JobContext {
        skill,
        model,
        budget: config.budget,
    };
    let specs = config.specs();
    let total = specs.len();
    // Longest runs first, so the last runs to finish are short ones and both cores stay busy.
    let mut queue: Vec<(usize, RunSpec)> = specs.into_iter().enumerate().collect();
    queue.sort_by_key(|(_, s)| {
        std::cmp::Reverse((u64::from(s.horizon) * cost_weight(s.strategy), s.noise))
    });
    let queue = Arc::new(Mutex::new(VecDeque::from(queue)));
    let results: Mutex<Vec<Option<Result<RunResult, BenchError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let finished = Mutex::new(0usize);
    let workers = config.jobs.clamp(1, total.max(1));
    // One runtime for every worker thread: a network provider's pooled connections are driven
    // by tasks of the runtime that opened them, so a runtime per thread would leave the others
    // holding connections whose driver is gone once its thread finishes (a failed request, a
    // retry, one request too many at the provider). Each thread still runs its own jobs
    // (`block_on` on the calling thread), so the CPU-bound work uses every core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(format!("cannot start the async runtime: {e}")))?;
    let runtime = &runtime;
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let Some((index, spec)) = lock(&queue).pop_front() else {
                        return;
                    };
                    let result = runtime.block_on(job::run_one(&context, &spec));
                    lock(&results)[index] = Some(result);
                    let done = {
                        let mut count = lock(&finished);
                        *count += 1;
                        *count
                    };
                    progress(done, total);
                }
            });
        }
    });
    let mut runs = Vec::with_capacity(total);
    for slot in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        match slot {
            Some(Ok(run)) => runs.push(run),
            Some(Err(error)) => return Err(error),
            None => return Err(BenchError::Setup("a run did not finish".into())),
        }
    }
    Ok(BenchReport::new(config.clone(), runs))
}

/// Rough relative cost per step: transcript strategies render and count ever longer prompts.
fn cost_weight(strategy: ContextStrategy) -> u64 {
    match strategy {
        ContextStrategy::History | ContextStrategy::Stateful => 50,
        ContextStrategy::Summary => 10,
        ContextStrategy::State | ContextStrategy::Window => 1,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Writes `results.json`, `report.md` and `prompt_tokens.svg` into `out`.
pub fn write_outputs(report: &BenchReport, out: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let fail = |path: &Path, e: &dyn std::fmt::Display| BenchError::Output {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(out).map_err(|e| fail(out, &e))?;
    let json_path = out.join("results.json");
    let json = serde_json::to_string_pretty(report).map_err(|e| fail(&json_path, &e))?;
    std::fs::write(&json_path, json + "\n").map_err(|e| fail(&json_path, &e))?;
    let md_path = out.join("report.md");
    std::fs::write(&md_path, report.markdown()).map_err(|e| fail(&md_path, &e))?;
    let svg_path = out.join("prompt_tokens.svg");
    chart::prompt_chart(report, &svg_path).map_err(|e| fail(&svg_path, &e))?;
    Ok(vec![json_path, md_path, svg_path])
}
