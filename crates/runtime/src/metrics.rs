//! What runners and workers count, through the `metrics` facade.
//!
//! Every call is a no-op (one atomic load) until the process installs a recorder: the service
//! does (`skillstate serve`'s `/metrics`, `skillstate worker --metrics-addr`); `run`, `batch` and
//! the benchmarks do not. The facade rather than a sink passed to each runner: every entry point
//! (workers, `run`, pauses, recovery) reports the same figures without a new parameter, and the
//! runtime names what it counts without knowing who exports it (the server crate renders them).
//!
//! No label carries a task id, a tenant or a model spec (each unbounded); tool names are the
//! tools a skill was given, so bounded by the installed skills.

use std::time::Duration;

use skillstate_core::{AcceptedStep, RejectedStep, RejectionKind};
use skillstate_providers::Usage;

use crate::WorkerEvent;

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, kind, and what it counts (its `# HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricInfo {
    pub name: &'static str,
    pub kind: MetricKind,
    pub help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> MetricInfo {
    MetricInfo {
        name,
        kind: MetricKind::Counter,
        help,
    }
}

pub const STEPS_COMMITTED: &str = "skillstate_steps_committed_total";
pub const ANSWERS: &str = "skillstate_answers_total";
pub const REJECTED_ANSWERS: &str = "skillstate_rejected_answers_total";
pub const INVALID_TOOL_CALLS: &str = "skillstate_invalid_tool_calls_total";
pub const TOOL_CALLS: &str = "skillstate_tool_calls_total";
pub const TOOL_ERRORS: &str = "skillstate_tool_errors_total";
pub const PROMPT_TOKENS: &str = "skillstate_prompt_tokens_total";
pub const PROVIDER_TOKENS: &str = "skillstate_provider_tokens_total";
pub const MODEL_LATENCY: &str = "skillstate_model_latency_seconds";
pub const MODEL_ERRORS: &str = "skillstate_model_errors_total";
pub const TASKS_CLAIMED: &str = "skillstate_tasks_claimed_total";
pub const TASKS_SETTLED: &str = "skillstate_tasks_settled_total";
pub const TASK_RETRIES: &str = "skillstate_task_retries_total";
pub const TASKS_RELEASED: &str = "skillstate_tasks_released_total";
pub const LEASES_LOST: &str = "skillstate_leases_lost_total";
pub const LEASE_TAKEOVERS: &str = "skillstate_lease_takeovers_total";
pub const BOARD_WRITES: &str = "skillstate_board_writes_total";
pub const BOARD_REBASES: &str = "skillstate_board_rebases_total";
pub const BOARD_CONFLICTS: &str = "skillstate_board_conflicts_total";

/// Everything the runtime reports, for `# HELP` lines and docs/operations/metrics.md.
pub const METRICS: &[MetricInfo] = &[
    counter(
        STEPS_COMMITTED,
        "Steps committed by runners (a model's accepted answer and its state, one transaction each).",
    ),
    counter(
        ANSWERS,
        "Model answers validated, by verdict (accepted, rejected).",
    ),
    counter(
        REJECTED_ANSWERS,
        "Rejected model answers by the kind of their errors; an answer with errors of two kinds counts once under each.",
    ),
    counter(
        INVALID_TOOL_CALLS,
        "Rejected model answers that named an unknown tool or gave invalid tool arguments.",
    ),
    counter(
        TOOL_CALLS,
        "Tool calls run, by tool (built-in, MCP or an environment's).",
    ),
    counter(
        TOOL_ERRORS,
        "Tool calls whose result was an error (the tool failed, timed out, or is not available), by tool.",
    ),
    counter(
        PROMPT_TOKENS,
        "Prompt tokens of answered model calls, counted locally (o200k_base).",
    ),
    counter(
        PROVIDER_TOKENS,
        "Tokens the model provider reported, by kind (input, output, cached_input, cache_write); absent for providers that report none.",
    ),
    MetricInfo {
        name: MODEL_LATENCY,
        kind: MetricKind::Histogram,
        help: "Time from sending a prompt to having the model's whole answer, in seconds (answered calls).",
    },
    counter(
        MODEL_ERRORS,
        "Model calls that failed (the provider's retries spent); each fails its task.",
    ),
    counter(TASKS_CLAIMED, "Queued tasks claimed by workers."),
    counter(
        TASKS_SETTLED,
        "Tasks the queue is done with, by status (completed, failed, awaiting_input, awaiting_approval).",
    ),
    counter(
        TASK_RETRIES,
        "Failed tasks queued again for a whole-task retry after a backoff.",
    ),
    counter(
        TASKS_RELEASED,
        "Tasks a draining worker stopped at a step boundary and left queued for another.",
    ),
    counter(
        LEASE_TAKEOVERS,
        "Leases taken over: a claim of a task whose lease had expired without being released, or a runner taking a task from a holder that no longer runs.",
    ),
    counter(
        LEASES_LOST,
        "Tasks a worker stopped because another worker took their lease over (it had expired); nothing more was written.",
    ),
    counter(
        BOARD_WRITES,
        "Board writes committed by tasks' steps (each in the step's transaction).",
    ),
    counter(
        BOARD_REBASES,
        "Board writes committed on top of a newer version than their answer was computed on (others wrote elsewhere meanwhile).",
    ),
    counter(
        BOARD_CONFLICTS,
        "Answers refused because their board part met another writer's change since the version shown; the model recomputes from the fresh values.",
    ),
];

/// Model-latency histogram buckets, in seconds: fast local models to long reasoning calls.
pub const MODEL_LATENCY_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0,
];

/// Registers every `# HELP` line with the installed recorder (call after installing it).
pub fn describe() {
    for metric in METRICS {
        match metric.kind {
            MetricKind::Counter => metrics::describe_counter!(metric.name, metric.help),
            MetricKind::Gauge => metrics::describe_gauge!(metric.name, metric.help),
            MetricKind::Histogram => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
}

/// A model answered `prompt_tokens` of prompt after `latency`.
pub(crate) fn model_answered(latency: Duration, prompt_tokens: usize, usage: Option<&Usage>) {
    metrics::histogram!(MODEL_LATENCY).record(latency.as_secs_f64());
    metrics::counter!(PROMPT_TOKENS).increment(prompt_tokens as u64);
    if let Some(usage) = usage {
        let reported = [
            ("input", Some(usage.input_tokens)),
            ("output", Some(usage.output_tokens)),
            ("cached_input", usage.cached_input_tokens),
            ("cache_write", usage.cache_write_tokens),
        ];
        for (kind, tokens) in reported {
            if let Some(tokens) = tokens {
                metrics::counter!(PROVIDER_TOKENS, "kind" => kind).increment(tokens);
            }
        }
    }
}

pub(crate) fn model_failed() {
    metrics::counter!(MODEL_ERRORS).increment(1);
}

/// An answer's verdict.
pub(crate) fn answer(verdict: Result<&AcceptedStep, &RejectedStep>) {
    let rejected = match verdict {
        Ok(_) => {
            metrics::counter!(ANSWERS, "verdict" => "accepted").increment(1);
            return;
        }
        Err(rejected) => rejected,
    };
    metrics::counter!(ANSWERS, "verdict" => "rejected").increment(1);
    let mut kinds: Vec<RejectionKind> = Vec::new();
    for rejection in &rejected.rejections {
        if !kinds.contains(&rejection.kind) {
            kinds.push(rejection.kind);
        }
    }
    for kind in &kinds {
        metrics::counter!(REJECTED_ANSWERS, "kind" => kind.as_str()).increment(1);
    }
    if kinds
        .iter()
        .any(|k| matches!(k, RejectionKind::UnknownTool | RejectionKind::ToolArgs))
    {
        metrics::counter!(INVALID_TOOL_CALLS).increment(1);
    }
}

pub(crate) fn board_written() {
    metrics::counter!(BOARD_WRITES).increment(1);
}

pub(crate) fn board_rebased() {
    metrics::counter!(BOARD_REBASES).increment(1);
}

pub(crate) fn board_conflicted() {
    metrics::counter!(BOARD_CONFLICTS).increment(1);
}

pub(crate) fn step_committed() {
    metrics::counter!(STEPS_COMMITTED).increment(1);
}

/// A tool call of `tool` ended, with an error result unless `ok`.
pub(crate) fn tool_called(tool: &str, ok: bool) {
    metrics::counter!(TOOL_CALLS, "tool" => tool.to_owned()).increment(1);
    if !ok {
        metrics::counter!(TOOL_ERRORS, "tool" => tool.to_owned()).increment(1);
    }
}

/// What a worker reports, counted whether or not anyone listens to its events.
pub(crate) fn worker_event(event: &WorkerEvent) {
    match event {
        WorkerEvent::Claimed { took_over, .. } => {
            metrics::counter!(TASKS_CLAIMED).increment(1);
            if *took_over {
                lease_taken_over();
            }
        }
        WorkerEvent::Settled { status, .. } => {
            metrics::counter!(TASKS_SETTLED, "status" => status.as_str()).increment(1);
        }
        WorkerEvent::Retrying { .. } => metrics::counter!(TASK_RETRIES).increment(1),
        WorkerEvent::Released { .. } => metrics::counter!(TASKS_RELEASED).increment(1),
        WorkerEvent::LostLease { .. } => metrics::counter!(LEASES_LOST).increment(1),
        // Steps are counted by the runner; a stopped batch shows in its tasks.
        WorkerEvent::Step { .. } | WorkerEvent::BatchStopped { .. } => {}
    }
}

/// A lease taken over from a holder that died or stalled.
pub(crate) fn lease_taken_over() {
    metrics::counter!(LEASE_TAKEOVERS).increment(1);
}
