//! One bench run: a task of the skill in a freshly generated environment, run to its end on an
//! in-memory SQLite store through the real runtime, and measured from its journal.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill, count_tokens};
use skillstate_envs::oracle::OracleModel;
use skillstate_providers::{ModelProvider, Usage};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::prelude::*;
use skillstate_store::{ActionOutcome, SqliteStore, Synchronous, TaskStatus, Verdict};

use crate::BenchError;

/// What one run is: every strategy sees the same environment for the same
/// (horizon, seed, noise, drift).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunSpec {
    pub horizon: u32,
    pub noise: u32,
    pub drift: Option<String>,
    pub seed: u64,
    pub strategy: ContextStrategy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    #[serde(flatten)]
    pub spec: RunSpec,
    /// The task's final status: `completed`, or `failed` (answers rejected too often, a
    /// provider error, the step limit).
    pub status: String,
    /// Why a run that did not complete stopped (the task outcome's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The environment's score over all T events: a run that failed keeps the credit for the
    /// events it handled before it stopped.
    pub score: f64,
    /// Accepted (committed) steps.
    pub steps: u64,
    /// Prompt tokens of the accepted answer's prompt, per step.
    pub prompt_tokens_per_step: Vec<u64>,
    /// Mean of `prompt_tokens_per_step`; `None` when the run committed no step.
    pub prompt_mean: Option<f64>,
    pub prompt_max: u64,
    pub prompt_last: u64,
    /// Over every model call, rejected ones included.
    pub total_prompt_tokens: u64,
    pub total_completion_tokens: u64,
    pub total_tokens: u64,
    pub rejected_answers: u64,
    /// Tool calls that returned an error.
    #[serde(default)]
    pub tool_errors: u64,
    /// Actions whose outcome a crash left unknown: their own figure, not tool errors.
    #[serde(default)]
    pub outcome_unknown: u64,
    /// What the provider reported, summed over the run's calls (absent for the oracle).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_steps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    pub wall_ms: u64,
}

impl RunResult {
    /// Whether the run's task completed (its episode ended or the model finished).
    pub fn completed(&self) -> bool {
        self.status == TaskStatus::Completed.as_str()
    }
}

/// The shared inputs of every run of one bench.
pub struct JobContext {
    pub skill: Skill,
    /// The model every run shares (and so its rate limits), or `None` for the oracle, which is
    /// built per run for the environment it reads.
    pub model: Option<Arc<dyn ModelProvider>>,
    pub budget: Option<usize>,
}

pub async fn run_one(ctx: &JobContext, spec: &RunSpec) -> Result<RunResult, BenchError> {
    let started = Instant::now();
    let mut definition = ctx.skill.definition.clone();
    let settings = definition.settings.environment.as_mut().ok_or_else(|| {
        BenchError::Setup(format!(
            "skill `{}` has no [environment] to bench",
            definition.name
        ))
    })?;
    settings.params.insert("seed".into(), json!(spec.seed));
    settings.params.insert("events".into(), json!(spec.horizon));
    if spec.noise > 0 {
        settings.params.insert("noise".into(), json!(spec.noise));
    }
    if let Some(drift) = &spec.drift {
        settings.params.insert("drift".into(), json!(drift));
    }
    let env_settings = settings.clone();
    definition.settings.run.max_steps = definition
        .settings
        .run
        .max_steps
        .max(spec.horizon.saturating_add(10));
    let skill = Skill::from_definition(definition).map_err(BenchError::Setup)?;
    let mut env = skillstate_envs::build_environment(&env_settings)
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let model: Arc<dyn ModelProvider> = match &ctx.model {
        Some(model) => Arc::clone(model),
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
        model: model.spec(),
        context: spec.strategy,
        context_budget: ctx.budget,
        environment: None,
        secrets: Default::default(),
    };
    let task = start_task(store.as_ref(), &skill, env.as_mut(), &options)
        .await
        .map_err(BenchError::Runtime)?;
    let outcome = Runner::new(store.clone(), model, env.as_mut(), &mut NoProgress)
        .run(&task.id)
        .await
        .map_err(BenchError::Runtime)?;
    let journal = store.journal(&task.id).await.map_err(BenchError::Store)?;
    let intents = store.intents(&task.id).await.map_err(BenchError::Store)?;
    let ended =
        |outcome: ActionOutcome| intents.iter().filter(|i| i.outcome() == outcome).count() as u64;

    let per_step: Vec<u64> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .map(|e| e.prompt_tokens)
        .collect();
    let total_prompt: u64 = journal.iter().map(|e| e.prompt_tokens).sum();
    let total_completion: u64 = journal.iter().map(|e| count_tokens(&e.output) as u64).sum();
    // A completed task carries the environment's outcome; a failed one does not, so the
    // environment is asked directly: its score counts what the run did before it stopped.
    let environment = match outcome.outcome.as_ref().map(|o| &o["environment"]) {
        Some(recorded) if recorded.is_object() => recorded.clone(),
        _ => env.outcome(),
    };
    let drift = environment.get("drift");
    let completed = outcome.status == TaskStatus::Completed;
    Ok(RunResult {
        spec: spec.clone(),
        status: outcome.status.as_str().to_owned(),
        failure: (!completed).then(|| failure_reason(outcome.outcome.as_ref())),
        score: environment
            .get("score")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        steps: outcome.steps,
        prompt_mean: (!per_step.is_empty())
            .then(|| per_step.iter().sum::<u64>() as f64 / per_step.len() as f64),
        prompt_max: per_step.iter().copied().max().unwrap_or(0),
        prompt_last: per_step.last().copied().unwrap_or(0),
        prompt_tokens_per_step: per_step,
        total_prompt_tokens: total_prompt,
        total_completion_tokens: total_completion,
        total_tokens: total_prompt + total_completion,
        rejected_answers: journal
            .iter()
            .filter(|e| e.verdict == Verdict::Rejected)
            .count() as u64,
        tool_errors: ended(ActionOutcome::Failed),
        outcome_unknown: ended(ActionOutcome::Unknown),
        provider_usage: journal
            .iter()
            .filter_map(|e| {
                e.usage
                    .as_ref()
                    .and_then(|u| serde_json::from_value::<Usage>(u.clone()).ok())
            })
            .fold(None, |sum: Option<Usage>, u| {
                let mut total = sum.unwrap_or_default();
                total.add(&u);
                Some(total)
            }),
        recovery_steps: drift.and_then(|d| d["recovery_steps"].as_u64()),
        recovered: drift.and_then(|d| d["recovered"].as_bool()),
        wall_ms: started.elapsed().as_millis() as u64,
    })
}

/// The message of a task outcome that did not complete (`reason` when it has no message).
pub(crate) fn failure_reason(outcome: Option<&Value>) -> String {
    let Some(outcome) = outcome else {
        return "stopped without an outcome".to_owned();
    };
    outcome
        .get("message")
        .or_else(|| outcome.get("reason"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| outcome.to_string())
}
