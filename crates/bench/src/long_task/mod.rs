//! The long-task curve: ONE task of many steps through the real runtime on a durable SQLite file
//! (`synchronous=FULL`), timing every step in the loop, to show whether a step's cost grows with
//! the steps already taken (README, "Performance").
//!
//! A step's in-loop time is the time between the model's accepted answers of two consecutive
//! steps: it covers the commit, the tool, recording its result, reading the next observation,
//! rendering and counting the prompt, the model call and validation, once each. Run start-up
//! (continuity check, opening the store) is outside the loop and not timed.
//!
//! A step's work also grows with the size of the state it validates, renders and stores, so
//! the default workload keeps that size fixed: `CurveModel::Steady` starts from a 40-item
//! inventory and alternately puts one more item on a shelf and takes it off again (with the
//! `wait` action), so the state is the same size at every step and any growth of the step
//! time comes from the steps already taken. `CurveModel::Oracle` runs the real warehouse
//! episode instead, whose inventory wanders with the events (each window reports its median
//! prompt size).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use skillstate_core::{AcceptedStep, ContextStrategy, RejectedStep, Skill};
use skillstate_envs::oracle::OracleModel;
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::{RunObserver, Runner, TaskOptions, start_task};
use skillstate_store::{SqliteStore, Synchronous, TaskStatus};

use crate::BenchError;
use crate::stats::median;

/// Steps per measured window (the early window starts at step 100, the late one ends at the
/// last step).
pub const CURVE_WINDOW: u64 = 100;
/// Fewest steps a curve can have: the early window is steps 100–200.
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
    pub median_ms: f64,
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
    /// Steps 100–200.
    pub early: Window,
    /// The last 100 steps.
    pub late: Window,
    /// `late.median_ms / early.median_ms`; the bar is ≤ 1.25.
    pub ratio: f64,
    /// Median step time of each block of 1,000 steps (or of tenths of shorter runs), for a
    /// coarse picture of the whole curve.
    pub blocks: Vec<Window>,
    /// Wall time of the whole loop, in seconds.
    pub loop_secs: f64,
    /// Every step's in-loop time in milliseconds, step 1 first.
    pub step_ms: Vec<f64>,
}

/// 40 occupied shelves: about what a 200-step warehouse episode holds at its peak.
fn steady_state() -> Value {
    let inventory: Map<String, Value> = (0..40)
        .map(|i| {
            (
                format!("shelf_{}", i * 7),
                json!(format!("item_{}", 1000 + i)),
            )
        })
        .collect();
    json!({"shelf_count": 500, "inventory": inventory})
}

/// Answers every prompt validly without reading it: odd calls put item_9 on shelf_499, even
/// calls take it off again; the action is always `wait`.
#[derive(Default)]
struct SteadyModel {
    calls: AtomicU64,
}

#[async_trait]
impl ModelProvider for SteadyModel {
    fn spec(&self) -> String {
        "scripted:steady".into()
    }

    async fn complete(&self, _request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let shelf = if call % 2 == 1 {
            json!("item_9")
        } else {
            Value::Null
        };
        Ok(ModelResponse {
            text: json!({
                "reasoning": "steady workload",
                "state_patch": {"inventory": {"shelf_499": shelf}},
                "action": {"tool": "wait", "args": {}}
            })
            .to_string(),
            usage: None,
            latency: Duration::ZERO,
            truncated: false,
        })
    }
}

/// Stamps the time (and prompt size) of every accepted answer.
struct Stamps {
    accepted: Vec<Instant>,
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
            self.accepted.push(Instant::now());
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
            "a long task needs {CURVE_MIN_STEPS} to {CURVE_MAX_STEPS} steps (the early window is steps 100–200), not {}",
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
        CurveModel::Steady => Arc::new(SteadyModel::default()),
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
    let ended = Instant::now();
    store.pool().close().await;
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    let outcome = outcome?;
    // Step k ends where step k+1's answer is accepted; the last step ends with the loop.
    let mut marks = stamps.accepted.clone();
    marks.push(ended);
    let step_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1000.0)
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
    let tokens = &stamps.prompt_tokens;
    let early = window(&step_ms, tokens, CURVE_WINDOW, 2 * CURVE_WINDOW);
    let late = window(&step_ms, tokens, steps - CURVE_WINDOW + 1, steps);
    let block = if steps >= 10_000 { 1_000 } else { steps / 10 };
    let blocks = (0..steps / block)
        .map(|b| window(&step_ms, tokens, b * block + 1, (b + 1) * block))
        .collect();
    Ok(CurveReport {
        config: config.clone(),
        status: outcome.status.as_str().to_owned(),
        steps,
        ratio: late.median_ms / early.median_ms.max(f64::MIN_POSITIVE),
        early,
        late,
        blocks,
        loop_secs: ended.duration_since(started).as_secs_f64(),
        step_ms,
    })
}

/// The medians of steps `first..=last` (1-based).
fn window(step_ms: &[f64], prompt_tokens: &[f64], first: u64, last: u64) -> Window {
    let range = (first - 1) as usize..last.min(step_ms.len() as u64) as usize;
    Window {
        first_step: first,
        last_step: last,
        median_ms: median(&step_ms[range.clone()]),
        prompt_tokens: median(prompt_tokens.get(range).unwrap_or_default()),
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
                "median in-loop step time, steps {}–{}: {:.2} ms (prompt {:.0} tokens)\n",
                w.first_step, w.last_step, w.median_ms, w.prompt_tokens
            ));
        }
        out.push_str(&format!(
            "ratio late/early: {:.2} (bar: ≤ 1.25)\n",
            self.ratio
        ));
        out.push_str(&format!(
            "whole loop: {:.1} s, {:.0} steps/s\n",
            self.loop_secs,
            self.steps as f64 / self.loop_secs.max(f64::MIN_POSITIVE)
        ));
        out.push_str("median by block:");
        for block in &self.blocks {
            out.push_str(&format!(
                " {}–{}: {:.2} ms ({:.0} tok);",
                block.first_step, block.last_step, block.median_ms, block.prompt_tokens
            ));
        }
        out.pop();
        out.push('\n');
        out
    }
}
