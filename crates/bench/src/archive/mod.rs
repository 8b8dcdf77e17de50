//! `bench warehouse --archive` (issue 22): the warehouse-archive workload, whose inventory
//! cannot fit the state budget, run under four arms on the same seeds:
//!
//! - `state+recall`: the skill as shipped, a bounded state plus the journal's `recall` tool;
//! - `state`: the same skill without the recall tool, so what the state evicts is gone;
//! - `window` and `summary`: the transcript strategies at the same context budget.
//!
//! Reported per horizon and arm: score, prompt tokens per step (first / last / max, and the
//! growth from the first 100 steps to the last 100), recall calls and steps per event, total
//! tokens and the in-loop time per step (median, and late / early as the long-task measure).

mod chart;
mod report;
mod run;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use skillstate_core::{ContextStrategy, Skill};
use skillstate_providers::ModelProvider;

pub use report::{ArchiveGroup, ArchiveReport};
pub use run::{ArchiveRun, ArchiveSpec, WINDOW};

use crate::{BenchError, Progress};

/// The built-in tool the `state+recall` arm keeps and the others drop from `[tools] allow`.
pub const RECALL_TOOL: &str = "recall";

/// The environment kind the archive bench runs.
pub const ARCHIVE_KIND: &str = skillstate_envs::warehouse_archive::KIND;

/// Context budget of `window` and `summary` when none is given: about what a state+recall
/// prompt may reach (the procedure, tools and schema, a full recent-moves index, a recall
/// result), so every arm has the same room.
pub const DEFAULT_ARCHIVE_BUDGET: usize = 4_000;

/// One way of running the skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Arm {
    #[serde(rename = "state+recall")]
    StateRecall,
    #[serde(rename = "state")]
    State,
    #[serde(rename = "window")]
    Window,
    #[serde(rename = "summary")]
    Summary,
}

impl Arm {
    pub const ALL: [Arm; 4] = [Arm::StateRecall, Arm::State, Arm::Window, Arm::Summary];
    pub const NAMES: &'static [&'static str] = &["state+recall", "state", "window", "summary"];

    pub fn as_str(self) -> &'static str {
        match self {
            Arm::StateRecall => "state+recall",
            Arm::State => "state",
            Arm::Window => "window",
            Arm::Summary => "summary",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }

    pub fn strategy(self) -> ContextStrategy {
        match self {
            Arm::StateRecall | Arm::State => ContextStrategy::State,
            Arm::Window => ContextStrategy::Window,
            Arm::Summary => ContextStrategy::Summary,
        }
    }

    /// Whether the arm keeps the recall tool.
    pub fn recall(self) -> bool {
        self == Arm::StateRecall
    }

    /// Whether the context budget bounds the arm's prompts (the transcript strategies).
    pub fn uses_budget(self) -> bool {
        matches!(self, Arm::Window | Arm::Summary)
    }
}

/// What to run: every horizon × seed × arm is one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveConfig {
    pub horizons: Vec<u32>,
    pub seeds: Vec<u64>,
    pub arms: Vec<Arm>,
    /// Context budget of `window` and `summary`.
    pub budget: usize,
    pub model: String,
    /// The state budget of the skill, for the report (from its skill.toml).
    pub state_tokens: usize,
    /// Runs at once (at most this many threads); with 1 the report also gives CPU times.
    #[serde(default)]
    pub jobs: usize,
}

impl ArchiveConfig {
    pub fn specs(&self) -> Vec<ArchiveSpec> {
        let mut specs = Vec::new();
        for &horizon in &self.horizons {
            for &seed in &self.seeds {
                for &arm in &self.arms {
                    specs.push(ArchiveSpec { horizon, seed, arm });
                }
            }
        }
        specs
    }
}

/// Loads the skill and checks that it runs the archive.
pub fn load_skill(skill_dir: &Path) -> Result<Skill, BenchError> {
    let skill = Skill::load(skill_dir)
        .map_err(|e| BenchError::Setup(e.to_string()))?
        .skill;
    let kind = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.as_str());
    if kind != Some(ARCHIVE_KIND) {
        return Err(BenchError::Setup(format!(
            "the skill in {} runs in {}, not the `{ARCHIVE_KIND}` environment the archive bench needs; pass --skill skills/warehouse-archive",
            skill_dir.display(),
            kind.map_or("no environment".to_owned(), |k| format!(
                "the `{k}` environment"
            ))
        )));
    }
    Ok(skill)
}

/// Runs every run of `config` for the archive skill in `skill_dir`, spread over `config.jobs`
/// threads, longest runs first. `model` is shared by every run; `None` runs the oracle.
pub fn run_archive(
    skill_dir: &Path,
    config: &ArchiveConfig,
    model: Option<Arc<dyn ModelProvider>>,
    progress: Progress<'_>,
) -> Result<ArchiveReport, BenchError> {
    let skill = load_skill(skill_dir)?;
    let specs = config.specs();
    let total = specs.len();
    let mut queue: Vec<(usize, ArchiveSpec)> = specs.into_iter().enumerate().collect();
    queue.sort_by_key(|(_, s)| {
        let weight: u64 = if s.arm.uses_budget() { 3 } else { 1 };
        std::cmp::Reverse(u64::from(s.horizon) * weight)
    });
    let queue = Mutex::new(VecDeque::from(queue));
    let results: Mutex<Vec<Option<Result<ArchiveRun, BenchError>>>> =
        Mutex::new((0..total).map(|_| None).collect());
    let finished = Mutex::new(0usize);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(format!("cannot start the async runtime: {e}")))?;
    let runtime = &runtime;
    let (skill, queue, results, finished) = (&skill, &queue, &results, &finished);
    std::thread::scope(|scope| {
        for _ in 0..config.jobs.clamp(1, total.max(1)) {
            let model = model.clone();
            scope.spawn(move || {
                loop {
                    let Some((index, spec)) = lock(queue).pop_front() else {
                        return;
                    };
                    let result =
                        runtime.block_on(run::run_one(skill, &spec, config.budget, model.clone()));
                    lock(results)[index] = Some(result);
                    let done = {
                        let mut count = lock(finished);
                        *count += 1;
                        *count
                    };
                    progress(done, total);
                }
            });
        }
    });
    let mut runs = Vec::with_capacity(total);
    for slot in lock(results).drain(..) {
        match slot {
            Some(Ok(run)) => runs.push(run),
            Some(Err(error)) => return Err(error),
            None => return Err(BenchError::Setup("a run did not finish".into())),
        }
    }
    Ok(ArchiveReport::new(config.clone(), runs))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Writes `archive.json`, `archive.md` and `archive_prompt_tokens.svg` into `out`.
pub fn write_archive_outputs(
    report: &ArchiveReport,
    out: &Path,
) -> Result<Vec<PathBuf>, BenchError> {
    let fail = |path: &Path, e: &dyn std::fmt::Display| BenchError::Output {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(out).map_err(|e| fail(out, &e))?;
    let json_path = out.join("archive.json");
    let json = serde_json::to_string_pretty(report).map_err(|e| fail(&json_path, &e))?;
    std::fs::write(&json_path, json + "\n").map_err(|e| fail(&json_path, &e))?;
    let md_path = out.join("archive.md");
    std::fs::write(&md_path, report.markdown()).map_err(|e| fail(&md_path, &e))?;
    let svg_path = out.join("archive_prompt_tokens.svg");
    chart::prompt_chart(report, &svg_path).map_err(|e| fail(&svg_path, &e))?;
    Ok(vec![json_path, md_path, svg_path])
}
