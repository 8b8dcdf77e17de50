//! The long-task curve: ONE task of many steps through the real runtime on a durable SQLite file
//! (`synchronous=FULL`), timing every step in the loop, to show whether a step's cost grows with
//! the steps already taken (docs/performance.md, "Performance").
//!
//! A step's in-loop time is the time between the model's accepted answers of two consecutive
//! steps: it covers the commit, the tool, recording its result, reading the next observation,
//! rendering and counting the prompt, the model call and validation, once each. Run start-up
//! (continuity check, opening the store) is outside the loop and not timed.
//!
//! A step's work also grows with the size of the state it validates, renders and stores, so
//! the default workload keeps that size fixed: `CurveModel::Steady` starts from a 40-item
//! inventory and alternately puts one more item on a shelf and takes it off again, so the
//! state is the same size at every step and any growth of the step time comes from the steps
//! already taken. Its actions are the episode's correct ones (from the seeded events), so the
//! warehouse itself stays as small as in a well-handled episode (a model that ignored the
//! arrivals would pile them up on the dock, and the environment's checkpoint, written at every
//! step, would grow). `CurveModel::Oracle` runs the real episode instead, whose inventory
//! wanders with the events (each window reports its median prompt size).

mod steady;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use skillstate_core::{AcceptedStep, ContextStrategy, RejectedStep, Skill};
use skillstate_envs::oracle::OracleModel;
use skillstate_envs::warehouse::WarehouseConfig;
use skillstate_providers::ModelProvider;
use skillstate_runtime::{RunObserver, Runner, TaskOptions, start_task};
use skillstate_store::{SqliteStore, Synchronous, TaskStatus};

use crate::BenchError;
use crate::stats::{median, process_cpu};
use steady::{SteadyModel, steady_state};

/// Steps per measured window: the early window is steps 101–200, the late one the last 100.
pub const CURVE_WINDOW: u64 = 100;
/// Fewest steps a curve can have.
pub const CURVE_MIN_STEPS: u32 = 300;
/// Most steps: the warehouse generates at most 100,000 events.
pub const CURVE_MAX_STEPS: u32 = 100_000;

/// Who answers the long task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CurveModel {
    /// Scripted answers that keep the state's size fixed (see the module doc).
    Steady,
    /// The oracle on the real episode: the state grows and shrinks with the events.
    Oracle,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurveConfig {
    /// Steps of the task (= warehouse events).
    pub steps: u32,
    pub model: CurveModel,
    pub seed: u64,
    pub strategy: ContextStrategy,
    /// `true`: `synchronous=FULL` (every commit synced to disk); `false`: `NORMAL`.
    pub full_sync: bool,
    /// The directory the SQLite file is created in (removed afterwards).
    #[serde(skip)]
    pub dir: PathBuf,
}

/// Median in-loop step time of a window of steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub first_step: u64,
    pub last_step: u64,
    /// Median wall time of the window's steps.
    pub median_ms: f64,
    /// Median CPU time the whole process (every thread: the runner, SQLite's) spent per step:
    /// unlike wall time, not stretched by other programs competing for the machine.
    pub median_cpu_ms: f64,
    /// Median prompt tokens of the window's steps: how large the state (and so the work of a
    /// step) was there.
    pub prompt_tokens: f64,
}

/// The measured curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurveReport {
    pub config: CurveConfig,
    pub status: String,
    /// Accepted steps.
    pub steps: u64,
    /// Steps 101–200.
    pub early: Window,
    /// The last 100 steps.
    pub late: Window,
    /// `late.median_ms / early.median_ms`; the bar is ≤ 1.25.
    pub ratio: f64,
    /// The same for CPU time.
    pub cpu_ratio: f64,
    /// Median step time of each block of 1,000 steps (or of tenths of shorter runs), for a
    /// coarse picture of the whole curve.
    pub blocks: Vec<Window>,
    /// Wall time of the whole loop, in seconds.
    pub loop_secs: f64,
    /// Every step's in-loop time in milliseconds, step 1 first.
    pub step_ms: Vec<f64>,
    /// Every step's process CPU time in milliseconds.
    pub step_cpu_ms: Vec<f64>,
}

/// Stamps the time (wall and CPU) and prompt size of every accepted answer.
struct Stamps {
    accepted: Vec<(Instant, Duration)>,
    prompt_tokens: Vec<f64>,
    progress: Box<dyn Fn(u64) + Send + Sync>,
}

impl RunObserver for Stamps {
    fn attempt(
        &mut self,
        step: u64,
        _attempt: u32,
        prompt_tokens: usize,
        result: Result<&AcceptedStep, &RejectedStep>,
    ) {
        if result.is_ok() {
            self.accepted.push((Instant::now(), process_cpu()));
            self.prompt_tokens.push(prompt_tokens as f64);
            (self.progress)(step);
        }
    }
}

/// Runs one `config.steps`-step warehouse task of the skill in `skill_dir` with the oracle and
/// times each step. `progress` is called with each accepted step.
pub async fn run_curve(
    skill_dir: &Path,
    config: &CurveConfig,
    progress: Box<dyn Fn(u64) + Send + Sync>,
) -> Result<CurveReport, BenchError> {
    if !(CURVE_MIN_STEPS..=CURVE_MAX_STEPS).contains(&config.steps) {
        return Err(BenchError::Setup(format!(
            "a long task needs {CURVE_MIN_STEPS} to {CURVE_MAX_STEPS} steps (the early window is steps 101–200), not {}",
            config.steps
        )));
    }
    let mut definition = Skill::load(skill_dir)
        .map_err(|e| BenchError::Setup(e.to_string()))?
        .skill
        .definition;
    let settings = definition.settings.environment.as_mut().ok_or_else(|| {
        BenchError::Setup(format!(
            "skill `{}` has no [environment] to run a long task in",
            definition.name
        ))
    })?;
    settings.params.insert("seed".into(), json!(config.seed));
    settings.params.insert("events".into(), json!(config.steps));
    let env_settings = settings.clone();
    definition.settings.run.max_steps = config.steps.saturating_add(10);
    if config.model == CurveModel::Steady {
        definition.initial_state = steady_state();
    }
    let skill = Skill::from_definition(definition).map_err(BenchError::Setup)?;
    let mut env = skillstate_envs::build_environment(&env_settings)
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let model: Arc<dyn ModelProvider> = match config.model {
        CurveModel::Steady => Arc::new(SteadyModel::new(
            &WarehouseConfig::from_params(&env_settings.params)
                .map_err(|e| BenchError::Setup(e.to_string()))?,
        )),
        CurveModel::Oracle => Arc::new(
            OracleModel::for_environment(env.kind())
                .map_err(|e| BenchError::Setup(e.to_string()))?,
        ),
    };
    let file = config
        .dir
        .join(format!("long-task-{}.db", std::process::id()));
    let store = Arc::new(
        SqliteStore::open(
            &file.display().to_string(),
            if config.full_sync {
                Synchronous::Full
            } else {
                Synchronous::Normal
            },
        )
        .await
        .map_err(BenchError::Store)?,
    );
    let options = TaskOptions::new(model.spec(), config.strategy);
    let task = start_task(store.as_ref(), &skill, env.as_mut(), &options)
        .await
        .map_err(BenchError::Runtime)?;
    let mut stamps = Stamps {
        accepted: Vec::with_capacity(config.steps as usize),
        prompt_tokens: Vec::with_capacity(config.steps as usize),
        progress,
    };
    let started = Instant::now();
    let outcome = Runner::new(store.clone(), model, env.as_mut(), &mut stamps)
        .run(&task.id)
        .await
        .map_err(BenchError::Runtime);
    let ended = (Instant::now(), process_cpu());
    store.pool().close().await;
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    let outcome = outcome?;
    // Step k ends where step k+1's answer is accepted; the last step ends with the loop.
    let mut marks = stamps.accepted.clone();
    marks.push(ended);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let step_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| ms(w[1].0.duration_since(w[0].0)))
        .collect();
    let step_cpu_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| ms(w[1].1.saturating_sub(w[0].1)))
        .collect();
    if outcome.status != TaskStatus::Completed || (step_ms.len() as u64) < 2 * CURVE_WINDOW {
        return Err(BenchError::Setup(format!(
            "the long task stopped at step {} ({}) instead of running its {} steps: {}",
            outcome.steps,
            outcome.status.as_str(),
            config.steps,
            outcome
                .outcome
                .map(|o| o.to_string())
                .unwrap_or_else(|| "no outcome".into())
        )));
    }
    let steps = step_ms.len() as u64;
    let series = Series {
        wall: &step_ms,
        cpu: &step_cpu_ms,
        tokens: &stamps.prompt_tokens,
    };
    let early = series.window(CURVE_WINDOW + 1, 2 * CURVE_WINDOW);
    let late = series.window(steps - CURVE_WINDOW + 1, steps);
    let block = if steps >= 10_000 { 1_000 } else { steps / 10 };
    let blocks = (0..steps / block)
        .map(|b| series.window(b * block + 1, (b + 1) * block))
        .collect();
    Ok(CurveReport {
        config: config.clone(),
        status: outcome.status.as_str().to_owned(),
        steps,
        ratio: late.median_ms / early.median_ms.max(f64::MIN_POSITIVE),
        cpu_ratio: late.median_cpu_ms / early.median_cpu_ms.max(f64::MIN_POSITIVE),
        early,
        late,
        blocks,
        loop_secs: ended.0.duration_since(started).as_secs_f64(),
        step_ms,
        step_cpu_ms,
    })
}

/// Per-step figures, step 1 first.
struct Series<'a> {
    wall: &'a [f64],
    cpu: &'a [f64],
    tokens: &'a [f64],
}

impl Series<'_> {
    /// The medians of steps `first..=last` (1-based).
    fn window(&self, first: u64, last: u64) -> Window {
        let range = (first - 1) as usize..last as usize;
        let median_of = |values: &[f64]| median(values.get(range.clone()).unwrap_or_default());
        Window {
            first_step: first,
            last_step: last,
            median_ms: median_of(self.wall),
            median_cpu_ms: median_of(self.cpu),
            prompt_tokens: median_of(self.tokens),
        }
    }
}

impl CurveReport {
    /// The human-readable summary.
    pub fn text(&self) -> String {
        let model = match self.config.model {
            CurveModel::Steady => "scripted answers keeping the state's size fixed".to_owned(),
            CurveModel::Oracle => {
                format!("oracle on the warehouse episode, seed {}", self.config.seed)
            }
        };
        let mut out = format!(
            "long task: {} steps, strategy {}, SQLite synchronous={}, {model}\n",
            self.steps,
            self.config.strategy.as_str(),
            if self.config.full_sync {
                "FULL"
            } else {
                "NORMAL"
            },
        );
        for w in [&self.early, &self.late] {
            out.push_str(&format!(
                "steps {:>6}–{:<6} median in-loop step time {:.2} ms wall, {:.2} ms CPU (prompt {:.0} tokens)\n",
                w.first_step, w.last_step, w.median_ms, w.median_cpu_ms, w.prompt_tokens
            ));
        }
        out.push_str(&format!(
            "ratio late/early: {:.2} wall (bar: ≤ 1.25), {:.2} CPU\n",
            self.ratio, self.cpu_ratio
        ));
        out.push_str(&format!(
            "whole loop: {:.1} s, {:.0} steps/s\n",
            self.loop_secs,
            self.steps as f64 / self.loop_secs.max(f64::MIN_POSITIVE)
        ));
        out.push_str("median by block (wall / CPU ms):");
        for block in &self.blocks {
            out.push_str(&format!(
                " {}–{}: {:.2} / {:.2};",
                block.first_step, block.last_step, block.median_ms, block.median_cpu_ms
            ));
        }
        out.pop();
        out.push('\n');
        out
    }
}
