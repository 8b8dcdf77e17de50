//! What a batch's status and report are made of, for `skillstate batch status|report` and
//! `GET /v1/batches/{id}` alike: each task's figures (from the store's `batch_tasks`) and the
//! batch's stability metrics (completion, rejected answers, invalid tool calls, tokens,
//! durations, cost, percentiles of steps and durations, ETA).

use serde::Serialize;
use serde_json::Value;
use skillstate_providers::{Price, Usage};
use skillstate_store::{BatchRecord, BatchState, BatchTask, QueueState, TaskStatus};
use utoipa::ToSchema;

/// Where a task stands, as reports count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Waiting to be claimed.
    Queued,
    /// A worker holds its lease now.
    Running,
    /// Failed, queued again, waiting for its backoff (or the next claim).
    RetryWaiting,
    Completed,
    /// Failed for good.
    Failed,
    /// Waiting for a human (`skillstate pending`).
    Paused,
    /// Its stored row cannot be read.
    Unknown,
}

impl Standing {
    pub fn of(task: &BatchTask) -> Self {
        match (task.queue, task.status) {
            (None, _) | (_, None) => Standing::Unknown,
            (Some(QueueState::Queued), _) if task.leased => Standing::Running,
            (Some(QueueState::Queued), Some(TaskStatus::Failed)) => Standing::RetryWaiting,
            (Some(QueueState::Queued), Some(_)) => Standing::Queued,
            (Some(QueueState::Done), Some(TaskStatus::Completed)) => Standing::Completed,
            (Some(QueueState::Done), Some(TaskStatus::Failed)) => Standing::Failed,
            (
                Some(QueueState::Done),
                Some(TaskStatus::AwaitingInput | TaskStatus::AwaitingApproval),
            ) => Standing::Paused,
            (Some(QueueState::Done), Some(TaskStatus::Running)) => Standing::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Queued => "queued",
            Standing::Running => "running",
            Standing::RetryWaiting => "retry-waiting",
            Standing::Completed => "completed",
            Standing::Failed => "failed",
            Standing::Paused => "paused",
            Standing::Unknown => "unknown",
        }
    }

    /// The queue is done with it.
    pub fn finished(self) -> bool {
        matches!(
            self,
            Standing::Completed | Standing::Failed | Standing::Paused
        )
    }
}

/// One task's row.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskRow {
    pub id: String,
    #[schema(value_type = Object)]
    pub labels: Value,
    pub status: Standing,
    pub steps: u64,
    pub tries: u32,
    /// The provider's input + output tokens, or skillstate's count of the prompt tokens where
    /// the provider reports none.
    pub tokens: u64,
    pub prompt_tokens: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub answers: u64,
    pub rejected_answers: u64,
    pub tool_call_rejections: u64,
    pub tool_errors: u64,
    /// Actions whose outcome is unknown after a crash (the runtime stopped between committing
    /// them and recording their result): their own figure, not tool errors.
    pub outcome_unknown: u64,
    /// From its first answer to its last write.
    pub duration_ms: Option<i64>,
    pub cost_usd: Option<f64>,
    pub failure: Option<String>,
}

/// Tasks by where they stand.
#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub struct Counts {
    pub total: u64,
    pub queued: u64,
    pub running: u64,
    pub retry_waiting: u64,
    pub completed: u64,
    pub failed: u64,
    pub paused: u64,
    pub unknown: u64,
}

impl Counts {
    fn add(&mut self, standing: Standing) {
        self.total += 1;
        *match standing {
            Standing::Queued => &mut self.queued,
            Standing::Running => &mut self.running,
            Standing::RetryWaiting => &mut self.retry_waiting,
            Standing::Completed => &mut self.completed,
            Standing::Failed => &mut self.failed,
            Standing::Paused => &mut self.paused,
            Standing::Unknown => &mut self.unknown,
        } += 1;
    }

    pub fn finished(&self) -> u64 {
        self.completed + self.failed + self.paused
    }

    /// Tasks the queue still has to run.
    pub fn remaining(&self) -> u64 {
        self.queued + self.running + self.retry_waiting
    }
}

/// `p50` and `p95` (nearest rank) of a figure over finished tasks.
#[derive(Debug, Clone, Copy, Default, Serialize, ToSchema)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let rank = |p: f64| -> Option<f64> {
            if values.is_empty() {
                return None;
            }
            let index = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            Some(values[index])
        };
        Self {
            p50: rank(0.50),
            p95: rank(0.95),
        }
    }
}

/// The batch's stability metrics; rates are fractions (0–1), `None` when nothing to divide.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Metrics {
    /// Completed tasks over all tasks.
    pub completion_rate: Option<f64>,
    /// Rejected answers over all answers (accepted + rejected).
    pub rejected_answer_rate: Option<f64>,
    /// Answers that named an unknown tool or gave invalid arguments, plus tool calls that
    /// returned an error, over all answers. Actions whose outcome is unknown after a crash
    /// are not in it: they are `outcome_unknown`.
    pub invalid_tool_call_rate: Option<f64>,
    pub answers: u64,
    pub rejected_answers: u64,
    pub tool_call_rejections: u64,
    pub tool_errors: u64,
    /// Actions whose outcome is unknown after a crash: neither a tool error nor a success.
    pub outcome_unknown: u64,
    /// Over finished tasks.
    pub avg_tokens_per_task: Option<f64>,
    pub avg_duration_ms: Option<f64>,
    pub tokens: u64,
    pub prompt_tokens: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// From `[prices."<model>"]` in skillstate.toml and the provider's usage; `None` without a
    /// price.
    pub cost_usd: Option<f64>,
    pub steps: Percentiles,
    pub duration_ms: Percentiles,
    /// Estimated time to finish the remaining tasks at the rate seen so far.
    pub eta_ms: Option<i64>,
}

/// A text setting a batch was submitted with (`model`, `skill`): batch files and the
/// service's batch creates both store them under these names.
pub fn setting(batch: &BatchRecord, name: &str) -> Option<String> {
    batch
        .spec
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// A batch's settings and state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchInfo {
    pub id: String,
    pub name: String,
    /// `open` (workers claim its tasks) or `stopped`.
    #[schema(value_type = String)]
    pub state: BatchState,
    pub stop_reason: Option<String>,
    pub created_at: i64,
    pub model: Option<String>,
    pub skill: Option<String>,
    /// `skip_and_log` or `stop`.
    #[schema(value_type = String)]
    pub on_error: skillstate_store::OnError,
    pub max_retry: u32,
    /// `{"requests_per_minute", "tokens_per_minute"}`, each `null` when unlimited.
    #[schema(value_type = Object)]
    pub rate_limit: skillstate_store::RateLimit,
}

/// Everything `batch status`, `batch report` and the summary show.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Report {
    pub batch: BatchInfo,
    pub counts: Counts,
    pub metrics: Metrics,
    pub tasks: Vec<TaskRow>,
    /// Unix milliseconds.
    pub generated_at: i64,
}

impl Report {
    /// Computes the figures of `batch` from its tasks at `now`; `model` and `skill` as the
    /// batch's settings name them, `price` the model's (no cost without one).
    pub fn build(
        batch: BatchRecord,
        tasks: &[BatchTask],
        model: Option<String>,
        skill: Option<String>,
        price: Option<&Price>,
        now: i64,
    ) -> Self {
        let mut counts = Counts::default();
        let mut rows = Vec::with_capacity(tasks.len());
        for task in tasks {
            let status = Standing::of(task);
            counts.add(status);
            let provider = task.input_tokens + task.output_tokens;
            let end = if status.finished() {
                task.updated_at
            } else {
                now
            };
            let duration_ms = task
                .started_at
                .filter(|_| status.finished() || status == Standing::Running)
                .map(|start| (end - start).max(0));
            rows.push(TaskRow {
                id: task.id.clone(),
                labels: task.labels.clone(),
                status,
                steps: task.version,
                tries: task.tries,
                tokens: if provider > 0 {
                    provider
                } else {
                    task.prompt_tokens
                },
                prompt_tokens: task.prompt_tokens,
                input_tokens: task.input_tokens,
                output_tokens: task.output_tokens,
                answers: task.accepted + task.rejected,
                rejected_answers: task.rejected,
                tool_call_rejections: task.tool_call_rejections,
                tool_errors: task.tool_errors,
                outcome_unknown: task.outcome_unknown,
                duration_ms,
                cost_usd: price.map(|p| {
                    p.cost(&Usage {
                        input_tokens: task.input_tokens,
                        output_tokens: task.output_tokens,
                        ..Usage::default()
                    })
                }),
                failure: task.failure.clone(),
            });
        }
        let metrics = metrics(&rows, &counts, tasks, batch.state, now, price.is_some());
        Self {
            batch: BatchInfo {
                id: batch.id,
                name: batch.name,
                state: batch.state,
                stop_reason: batch.stop_reason,
                created_at: batch.created_at,
                model,
                skill,
                on_error: batch.on_error,
                max_retry: batch.max_retry,
                rate_limit: batch.rate_limit,
            },
            counts,
            metrics,
            tasks: rows,
            generated_at: now,
        }
    }

    /// The slowest tasks first (finished or running), at most `n`.
    pub fn slowest(&self, n: usize) -> Vec<&TaskRow> {
        let mut timed: Vec<&TaskRow> = self
            .tasks
            .iter()
            .filter(|t| t.duration_ms.is_some())
            .collect();
        timed.sort_by_key(|t| std::cmp::Reverse(t.duration_ms));
        timed.truncate(n);
        timed
    }

    /// Tasks that failed (for good or waiting for a retry), with their reasons.
    pub fn failures(&self) -> Vec<&TaskRow> {
        self.tasks
            .iter()
            .filter(|t| matches!(t.status, Standing::Failed | Standing::RetryWaiting))
            .collect()
    }
}

fn ratio(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

fn metrics(
    rows: &[TaskRow],
    counts: &Counts,
    tasks: &[BatchTask],
    state: BatchState,
    now: i64,
    priced: bool,
) -> Metrics {
    let finished: Vec<&TaskRow> = rows.iter().filter(|r| r.status.finished()).collect();
    let answers: u64 = rows.iter().map(|r| r.answers).sum();
    let rejected: u64 = rows.iter().map(|r| r.rejected_answers).sum();
    let tool_call_rejections: u64 = rows.iter().map(|r| r.tool_call_rejections).sum();
    let tool_errors: u64 = rows.iter().map(|r| r.tool_errors).sum();
    let outcome_unknown: u64 = rows.iter().map(|r| r.outcome_unknown).sum();
    let durations: Vec<f64> = finished
        .iter()
        .filter_map(|r| r.duration_ms)
        .map(|d| d as f64)
        .collect();
    let avg = |values: &[f64]| {
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let finished_tokens: Vec<f64> = finished.iter().map(|r| r.tokens as f64).collect();
    // ETA: the remaining tasks at the pace tasks finished since the first one started.
    let first_start = tasks.iter().filter_map(|t| t.started_at).min();
    let eta_ms = match (first_start, counts.finished(), counts.remaining(), state) {
        (_, _, 0, _) => Some(0),
        (_, _, _, BatchState::Stopped) => None,
        (Some(start), done, remaining, _) if done > 0 && now > start => {
            Some(((now - start) as f64 / done as f64 * remaining as f64) as i64)
        }
        _ => None,
    };
    Metrics {
        completion_rate: ratio(counts.completed, counts.total),
        rejected_answer_rate: ratio(rejected, answers),
        invalid_tool_call_rate: ratio(tool_call_rejections + tool_errors, answers),
        answers,
        rejected_answers: rejected,
        tool_call_rejections,
        tool_errors,
        outcome_unknown,
        avg_tokens_per_task: avg(&finished_tokens),
        avg_duration_ms: avg(&durations),
        tokens: rows.iter().map(|r| r.tokens).sum(),
        prompt_tokens: rows.iter().map(|r| r.prompt_tokens).sum(),
        input_tokens: rows.iter().map(|r| r.input_tokens).sum(),
        output_tokens: rows.iter().map(|r| r.output_tokens).sum(),
        cost_usd: priced.then(|| rows.iter().filter_map(|r| r.cost_usd).sum()),
        steps: Percentiles::of(finished.iter().map(|r| r.steps as f64).collect()),
        duration_ms: Percentiles::of(durations),
        eta_ms,
    }
}

pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=20).map(f64::from).collect());
        assert_eq!(p.p50, Some(10.0));
        assert_eq!(p.p95, Some(19.0));
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p95), (Some(7.0), Some(7.0)));
        assert_eq!(Percentiles::of(Vec::new()).p50, None);
    }

    fn task(id: &str, tool_errors: u64, outcome_unknown: u64) -> BatchTask {
        BatchTask {
            id: id.into(),
            status: Some(skillstate_store::TaskStatus::Completed),
            queue: Some(skillstate_store::QueueState::Done),
            tries: 0,
            labels: serde_json::json!({}),
            version: 5,
            outcome: None,
            failure: None,
            accepted: 5,
            rejected: 0,
            tool_call_rejections: 1,
            tool_errors,
            outcome_unknown,
            prompt_tokens: 100,
            input_tokens: 0,
            output_tokens: 0,
            created_at: 0,
            started_at: Some(0),
            updated_at: 10,
            leased: false,
        }
    }

    #[test]
    fn unknown_outcomes_are_their_own_figure_and_not_tool_errors() {
        let batch = BatchRecord {
            id: "b".into(),
            name: "b".into(),
            spec: serde_json::json!({}),
            on_error: skillstate_store::OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: skillstate_store::RateLimit::default(),
            state: BatchState::Open,
            stop_reason: None,
            created_at: 0,
        };
        let tasks = [task("a", 1, 2), task("b", 0, 1)];
        let report = Report::build(batch, &tasks, None, None, None, 20);
        let m = &report.metrics;
        assert_eq!((m.tool_errors, m.outcome_unknown), (1, 3));
        // 2 tool-call rejections + 1 tool error over 10 answers; the 3 unknown outcomes are not
        // in the rate.
        assert_eq!(m.invalid_tool_call_rate, Some(0.3));
        assert_eq!(report.tasks[0].outcome_unknown, 2);
        let json = serde_json::to_value(&report).unwrap_or_default();
        assert_eq!(json["metrics"]["outcome_unknown"], 3);
        assert_eq!(json["tasks"][1]["outcome_unknown"], 1);
    }
}
