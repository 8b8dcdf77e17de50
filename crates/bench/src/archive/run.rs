//! One archive run: a task of the skill under one arm, on a freshly generated archive, run to
//! its end through the real runtime on an in-memory SQLite store (the store the `recall` tool
//! reads through), timed at every step and measured from its journal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skillstate_core::skill::EnvironmentSettings;
use skillstate_core::{AcceptedStep, RejectedStep, Skill, count_tokens};
use skillstate_envs::oracle::OracleModel;
use skillstate_providers::ModelProvider;
use skillstate_runtime::{RunObserver, Runner, TaskOptions, start_task};
use skillstate_store::prelude::*;
use skillstate_store::{ActionOutcome, SqliteStore, Synchronous, TaskStatus, Verdict};

use super::{Arm, RECALL_TOOL};
use crate::BenchError;
use crate::stats::{median, process_cpu};

/// Steps per measured window: prompt growth compares the first and the last 100 steps, the
/// step time steps 101–200 and the last 100 (the long-task measure).
pub const WINDOW: usize = 100;

/// What one run is: every arm sees the same archive for the same (horizon, seed).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ArchiveSpec {
    pub horizon: u32,
    pub seed: u64,
    pub arm: Arm,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveRun {
    #[serde(flatten)]
    pub spec: ArchiveSpec,
    /// `completed`, or `failed` (with `failure`).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The fraction of the T events handled with the ground truth's action.
    pub score: f64,
    /// Accepted steps: one per event, plus one per recall.
    pub steps: u64,
    /// Accepted steps whose action was `recall`.
    pub recall_calls: u64,
    pub steps_per_event: f64,
    pub recalls_per_event: f64,
    /// Prompt tokens of the accepted answer's prompt: the first step's, the last step's, the
    /// largest, and the means of the first and the last 100 steps.
    pub prompt_first: u64,
    pub prompt_last: u64,
    pub prompt_max: u64,
    pub prompt_mean: f64,
    /// `None` when the run has fewer than 200 steps (the two windows would overlap).
    pub prompt_first_100: Option<f64>,
    pub prompt_last_100: Option<f64>,
    /// `prompt_last_100 / prompt_first_100 − 1` (the bar for state+recall: < 10%).
    pub prompt_growth: Option<f64>,
    /// Over every model call, rejected ones included.
    pub total_prompt_tokens: u64,
    pub total_completion_tokens: u64,
    pub total_tokens: u64,
    pub rejected_answers: u64,
    pub tool_errors: u64,
    /// Median in-loop step time over the run, over steps 101–200 and over the last 100 steps
    /// (`None` below 300 steps), and their ratio late / early (the bar: ≤ 1.25).
    pub step_ms_median: f64,
    pub step_ms_early: Option<f64>,
    pub step_ms_late: Option<f64>,
    pub step_time_ratio: Option<f64>,
    /// The same ratio for the process's CPU time per step: unlike wall time not stretched by
    /// other programs, but it counts every thread of the process, so it describes this run
    /// alone only when the bench runs one run at a time (`--jobs 1`).
    pub step_cpu_ratio: Option<f64>,
    /// The wall-time ratio over the same windows without their recall steps and the steps
    /// that read a recall's result: a recall step runs a journal search besides the step's
    /// own work, the step after it reads a longer observation, and the early window (few
    /// items stored, all in the state) has neither, so this compares like with like.
    pub step_time_ratio_without_recalls: Option<f64>,
    pub wall_ms: u64,
    /// Every accepted step's prompt tokens, step 1 first (for the chart).
    pub prompt_tokens_per_step: Vec<u64>,
    /// Every accepted step's in-loop wall time in milliseconds, step 1 first.
    pub step_ms: Vec<f64>,
    /// The steps whose action was a recall.
    pub recall_steps: Vec<u64>,
}

impl ArchiveRun {
    pub fn completed(&self) -> bool {
        self.status == TaskStatus::Completed.as_str()
    }
}

/// Stamps the time (wall and process CPU) of every accepted answer.
struct Stamps(Vec<(Instant, Duration)>);

impl RunObserver for Stamps {
    fn attempt(
        &mut self,
        _step: u64,
        _attempt: u32,
        _prompt_tokens: usize,
        result: Result<&AcceptedStep, &RejectedStep>,
    ) {
        if result.is_ok() {
            self.0.push((Instant::now(), process_cpu()));
        }
    }
}

fn mean(values: &[u64]) -> f64 {
    values.iter().sum::<u64>() as f64 / values.len().max(1) as f64
}

/// The skill as the arm runs it: without `recall` in `[tools] allow` for the arms that have no
/// recall, and with room for a recall step per event.
fn arm_skill(
    skill: &Skill,
    spec: &ArchiveSpec,
) -> Result<(Skill, EnvironmentSettings), BenchError> {
    let mut definition = skill.definition.clone();
    if !spec.arm.recall() {
        definition
            .settings
            .tools
            .allow
            .retain(|entry| entry != RECALL_TOOL);
    }
    let settings = definition.settings.environment.as_mut().ok_or_else(|| {
        BenchError::Setup(format!(
            "skill `{}` has no [environment] to bench",
            definition.name
        ))
    })?;
    settings.params.insert("seed".into(), json!(spec.seed));
    settings.params.insert("events".into(), json!(spec.horizon));
    let env_settings = settings.clone();
    definition.settings.run.max_steps = definition
        .settings
        .run
        .max_steps
        .max(spec.horizon.saturating_mul(3).saturating_add(10));
    let skill = Skill::from_definition(definition).map_err(BenchError::Setup)?;
    Ok((skill, env_settings))
}

pub async fn run_one(
    skill: &Skill,
    spec: &ArchiveSpec,
    budget: usize,
    model: Option<Arc<dyn ModelProvider>>,
) -> Result<ArchiveRun, BenchError> {
    let started = Instant::now();
    let (skill, env_settings) = arm_skill(skill, spec)?;
    let mut env = skillstate_envs::build_environment(&env_settings)
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let model: Arc<dyn ModelProvider> = match model {
        Some(model) => model,
        None => Arc::new(
            OracleModel::for_environment(env.kind())
                .map_err(|e| BenchError::Setup(e.to_string()))?,
        ),
    };
    let store = Arc::new(
        SqliteStore::open("sqlite::memory:", Synchronous::Normal)
            .await
            .map_err(BenchError::Store)?,
    );
    let options = TaskOptions {
        context_budget: spec.arm.uses_budget().then_some(budget),
        ..TaskOptions::new(model.spec(), spec.arm.strategy())
    };
    let task = start_task(store.as_ref(), &skill, env.as_mut(), &options)
        .await
        .map_err(BenchError::Runtime)?;
    let mut stamps = Stamps(Vec::with_capacity(spec.horizon as usize * 2));
    let outcome = Runner::new(store.clone(), model, env.as_mut(), &mut stamps)
        .run(&task.id)
        .await
        .map_err(BenchError::Runtime)?;
    let ended = (Instant::now(), process_cpu());
    let journal = store.journal(&task.id).await.map_err(BenchError::Store)?;
    let intents = store.intents(&task.id).await.map_err(BenchError::Store)?;

    let accepted: Vec<_> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .collect();
    let per_step: Vec<u64> = accepted.iter().map(|e| e.prompt_tokens).collect();
    let recall_steps: Vec<u64> = accepted
        .iter()
        .filter(|e| {
            e.action
                .as_ref()
                .and_then(|a| a.get("tool"))
                .and_then(Value::as_str)
                == Some(RECALL_TOOL)
        })
        .map(|e| e.step)
        .collect();
    let recall_calls = recall_steps.len() as u64;
    let recalled: std::collections::HashSet<u64> = recall_steps.iter().copied().collect();
    let total_prompt: u64 = journal.iter().map(|e| e.prompt_tokens).sum();
    let total_completion: u64 = journal
        .iter()
        .map(|e| {
            e.output_tokens
                .unwrap_or_else(|| count_tokens(&e.output) as u64)
        })
        .sum();
    let environment = match outcome.outcome.as_ref().map(|o| &o["environment"]) {
        Some(recorded) if recorded.is_object() => recorded.clone(),
        _ => env.outcome(),
    };
    let completed = outcome.status == TaskStatus::Completed;

    let mut marks = stamps.0;
    marks.push(ended);
    let step_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| ms(w[1].0.duration_since(w[0].0)))
        .collect();
    let step_cpu_ms: Vec<f64> = marks
        .windows(2)
        .map(|w| ms(w[1].1.saturating_sub(w[0].1)))
        .collect();
    let steps = per_step.len();
    let (early, late) = windows(&step_ms);
    let (early_cpu, late_cpu) = windows(&step_cpu_ms);
    let warehouse_steps: Vec<Option<f64>> = step_ms
        .iter()
        .zip(1u64..)
        .map(|(ms, step)| {
            let recall_or_its_answer = recalled.contains(&step) || recalled.contains(&(step - 1));
            (!recall_or_its_answer).then_some(*ms)
        })
        .collect();
    let (early_warehouse, late_warehouse) = if step_ms.len() >= 3 * WINDOW {
        let without = |range: &[Option<f64>]| -> Option<f64> {
            let kept: Vec<f64> = range.iter().flatten().copied().collect();
            (!kept.is_empty()).then(|| median(&kept))
        };
        (
            without(&warehouse_steps[WINDOW..2 * WINDOW]),
            without(&warehouse_steps[step_ms.len() - WINDOW..]),
        )
    } else {
        (None, None)
    };
    let (first_100, last_100) = if steps >= 2 * WINDOW {
        (
            Some(mean(&per_step[..WINDOW])),
            Some(mean(&per_step[steps - WINDOW..])),
        )
    } else {
        (None, None)
    };
    let events = f64::from(spec.horizon.max(1));
    Ok(ArchiveRun {
        spec: spec.clone(),
        status: outcome.status.as_str().to_owned(),
        failure: (!completed).then(|| crate::job::failure_reason(outcome.outcome.as_ref())),
        score: environment
            .get("score")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        steps: steps as u64,
        recall_calls,
        steps_per_event: steps as f64 / events,
        recalls_per_event: recall_calls as f64 / events,
        prompt_first: per_step.first().copied().unwrap_or(0),
        prompt_last: per_step.last().copied().unwrap_or(0),
        prompt_max: per_step.iter().copied().max().unwrap_or(0),
        prompt_mean: mean(&per_step),
        prompt_first_100: first_100,
        prompt_last_100: last_100,
        prompt_growth: first_100
            .zip(last_100)
            .map(|(first, last)| last / first.max(1.0) - 1.0),
        total_prompt_tokens: total_prompt,
        total_completion_tokens: total_completion,
        total_tokens: total_prompt + total_completion,
        rejected_answers: journal
            .iter()
            .filter(|e| e.verdict == Verdict::Rejected)
            .count() as u64,
        tool_errors: intents
            .iter()
            .filter(|i| i.outcome() == ActionOutcome::Failed)
            .count() as u64,
        step_ms_median: median(&step_ms),
        step_ms_early: early,
        step_ms_late: late,
        step_time_ratio: ratio(early, late),
        step_cpu_ratio: ratio(early_cpu, late_cpu),
        step_time_ratio_without_recalls: ratio(early_warehouse, late_warehouse),
        wall_ms: started.elapsed().as_millis() as u64,
        prompt_tokens_per_step: per_step,
        step_ms,
        recall_steps,
    })
}

/// The medians of steps 101–200 and of the last 100 steps; `None` below 300 steps.
fn windows(per_step: &[f64]) -> (Option<f64>, Option<f64>) {
    if per_step.len() < 3 * WINDOW {
        return (None, None);
    }
    (
        Some(median(&per_step[WINDOW..2 * WINDOW])),
        Some(median(&per_step[per_step.len() - WINDOW..])),
    )
}

fn ratio(early: Option<f64>, late: Option<f64>) -> Option<f64> {
    early
        .zip(late)
        .map(|(early, late)| late / early.max(f64::MIN_POSITIVE))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
