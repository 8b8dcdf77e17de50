//! `skillstate bench queue`: durable steps per second through the work queue.
//!
//! N tasks of a small counting skill are queued in one batch; workers run them with a scripted
//! model (each task's answers known in advance, so the model costs nothing) and a no-op
//! read-only tool. Every step goes through the whole runtime: prompt, validation, commit of
//! the step and of the tool's result, leases. What is measured is the runtime and the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::skill::SkillSettings;
use skillstate_core::{ContextStrategy, Skill, SkillDefinition, ToolSpec, tool::SideEffect};
use skillstate_providers::ScriptedModel;
use skillstate_runtime::{
    HostedTask, StopLevel, TaskHost, TaskOptions, WorkerOptions, WorkerStats, prepare_task,
    run_worker,
};
use skillstate_store::{NewBatch, OnError, QueuedTask, RateLimit, Store, TaskRecord};
use skillstate_tools::{CallContext, Environment, Tool, ToolError, ToolOutput, UserRequest};

use crate::server_cost::{ServerCost, ServerCostReport};
use crate::stats::{children_cpu, process_cpu};

/// The skill every benchmark task runs: count up to `steps`, one tool call per step.
pub fn counter_skill(steps: u32) -> Result<Skill, String> {
    let mut settings = SkillSettings::default();
    settings.tools.allow = vec![SOURCE.into()];
    settings.run.max_steps = steps.saturating_add(1);
    Skill::from_definition(SkillDefinition {
        name: "counter".into(),
        description: "Counts steps; the queue benchmark's workload.".into(),
        metadata: None,
        procedure: "Each step: set `count` to the step number and call `tick`. After the last step, finish.".into(),
        schema: json!({
            "type": "object",
            "properties": {"count": {"type": "integer", "minimum": 0}},
            "required": ["count"],
            "additionalProperties": false
        }),
        initial_state: json!({"count": 0}),
        settings,
        migrations: Vec::new(),
    })
}

const SOURCE: &str = "bench";

/// The answers a task of `steps` steps gets: `steps` ticks, then `finish`.
pub fn counter_answers(steps: u32) -> Vec<String> {
    let mut answers: Vec<String> = (1..=steps)
        .map(|i| {
            json!({
                "reasoning": "next tick",
                "state_patch": {"count": i},
                "action": {"tool": "tick", "args": {}}
            })
            .to_string()
        })
        .collect();
    answers.push(
        json!({"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "counted"}}})
            .to_string(),
    );
    answers
}

/// A read-only tool that does nothing.
struct Tick {
    spec: ToolSpec,
}

impl Tick {
    fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "tick".into(),
                description: "Does nothing.".into(),
                input_schema: json!({"type": "object", "additionalProperties": false}),
                side_effect: SideEffect::ReadOnly,
                source: SOURCE.into(),
                needs_approval: false,
            },
        }
    }
}

#[async_trait]
impl Tool for Tick {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success("ok"))
    }
}

/// The world of a counter task: a user request and the no-op `tick` tool.
pub fn counter_environment() -> Box<dyn Environment> {
    Box::new(UserRequest::new("count").with_tools(vec![Arc::new(Tick::new())]))
}

/// Rebuilds each claimed benchmark task's world and model.
pub struct CounterHost {
    pub steps: u32,
}

#[async_trait]
impl TaskHost for CounterHost {
    async fn open(&self, _task: &TaskRecord) -> Result<HostedTask, String> {
        Ok(HostedTask {
            env: counter_environment(),
            model: Arc::new(ScriptedModel::from_outputs(
                "counter.jsonl".into(),
                counter_answers(self.steps),
            )),
            resources: None,
        })
    }
}

/// Queues `tasks` counter tasks of `steps` steps in a new batch; returns its id.
pub async fn submit(store: &dyn Store, tasks: usize, steps: u32) -> Result<String, String> {
    submit_noting_first(store, tasks, steps)
        .await
        .map(|(batch, _)| batch)
}

/// [`submit`], also answering when its first chunk was committed: its tasks are claimable
/// from then on.
async fn submit_noting_first(
    store: &dyn Store,
    tasks: usize,
    steps: u32,
) -> Result<(String, Instant), String> {
    let skill = counter_skill(steps)?;
    let batch = store
        .create_batch(&NewBatch {
            name: format!("bench queue {tasks}x{steps}"),
            spec: json!({"tasks": tasks, "steps": steps}),
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: RateLimit::default(),
        })
        .await
        .map_err(|e| e.to_string())?;
    let options = TaskOptions::new("scripted:counter.jsonl", ContextStrategy::State);
    const CHUNK: usize = 1000;
    let mut first = None;
    let mut left = tasks;
    while left > 0 {
        let n = left.min(CHUNK);
        let mut queued = Vec::with_capacity(n);
        for _ in 0..n {
            let mut env = counter_environment();
            let task = prepare_task(&skill, env.as_mut(), &options).map_err(|e| e.to_string())?;
            queued.push(QueuedTask {
                task,
                initial_state: skill.definition.initial_state.clone(),
                labels: json!({}),
                tenant: None,
            });
        }
        store
            .enqueue_tasks(&batch.id, queued)
            .await
            .map_err(|e| e.to_string())?;
        first.get_or_insert_with(Instant::now);
        left -= n;
    }
    Ok((batch.id, first.unwrap_or_else(Instant::now)))
}

/// What one worker measured.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    pub stats: WorkerStats,
    pub steps: u64,
    pub elapsed: Duration,
}

impl Throughput {
    pub fn steps_per_sec(&self) -> f64 {
        self.steps as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs a worker on `batch` until nothing is left, and counts the steps it committed.
pub async fn work(
    store: Arc<dyn Store>,
    batch: &str,
    steps: u32,
    concurrency: usize,
) -> Result<Throughput, String> {
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let options = WorkerOptions {
        concurrency,
        batch: Some(batch.to_owned()),
        until_idle: true,
        poll: Duration::from_millis(20),
        ..WorkerOptions::default()
    };
    let started = Instant::now();
    let stats = run_worker(
        store,
        Arc::new(CounterHost { steps }),
        options,
        stop_rx,
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    Ok(Throughput {
        stats,
        // Each completed task committed `steps` ticks and its finish.
        steps: stats.completed * (u64::from(steps) + 1),
        elapsed,
    })
}

/// The figures of one `bench queue` run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueueReport {
    pub tasks: usize,
    pub steps_per_task: u32,
    pub processes: usize,
    pub concurrency: usize,
    pub submit_secs: f64,
    pub run_secs: f64,
    pub completed: u64,
    pub failed: u64,
    /// Durable steps (accepted, committed, tool result committed) per second of run time.
    pub steps_per_sec: f64,
    /// Accepted steps of the batch's tasks.
    pub steps: u64,
    /// The worker processes' CPU time per step (omitted when it cannot be told apart: one
    /// process that also runs the wire proxy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_cpu_us_per_step: Option<f64>,
    /// What the steps cost the PostgreSQL server (`Measure::server`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerCostReport>,
}

/// Queues the tasks through `store`, then runs them with `processes` worker processes (`1`:
/// this process, through `worker_store`, which may reach the same database another way).
/// `join` is how to start one more worker process on a batch: it gets the batch id and must
/// run `work` to the end and exit (the CLI re-runs itself with `bench queue --join`).
#[allow(clippy::too_many_arguments)]
pub async fn run_queue_bench(
    store: Arc<dyn Store>,
    worker_store: Arc<dyn Store>,
    tasks: usize,
    steps: u32,
    concurrency: usize,
    processes: usize,
    join: impl Fn(&str) -> std::io::Result<tokio::process::Child>,
    measure: Measure<'_>,
) -> Result<QueueReport, String> {
    let started = Instant::now();
    let batch = submit(store.as_ref(), tasks, steps).await?;
    let submit_secs = started.elapsed().as_secs_f64();
    let server = match measure.server {
        Some(url) => ServerCost::start(url).await?,
        None => None,
    };
    let own_cpu = process_cpu();
    let children_cpu_before = children_cpu();
    let started = Instant::now();
    if processes <= 1 {
        work(worker_store, &batch, steps, concurrency).await?;
    } else {
        let mut children = Vec::new();
        for _ in 0..processes {
            children.push(join(&batch).map_err(|e| format!("cannot start a worker process: {e}"))?);
        }
        for mut child in children {
            let status = child
                .wait()
                .await
                .map_err(|e| format!("waiting for a worker process: {e}"))?;
            if !status.success() {
                return Err(format!("a worker process failed: {status}"));
            }
        }
    }
    let run_secs = started.elapsed().as_secs_f64();
    let worker_cpu = if processes > 1 {
        Some(children_cpu().saturating_sub(children_cpu_before))
    } else {
        measure
            .own_cpu_is_workers
            .then(|| process_cpu().saturating_sub(own_cpu))
    };
    let rows = store.batch_tasks(&batch).await.map_err(|e| e.to_string())?;
    let completed = rows
        .iter()
        .filter(|t| t.status == Some(skillstate_store::TaskStatus::Completed))
        .count() as u64;
    let failed = rows
        .iter()
        .filter(|t| t.status == Some(skillstate_store::TaskStatus::Failed))
        .count() as u64;
    let steps_done: u64 = rows.iter().map(|t| t.version).sum();
    Ok(QueueReport {
        tasks,
        steps_per_task: steps,
        processes: processes.max(1),
        concurrency,
        submit_secs,
        run_secs,
        completed,
        failed,
        steps_per_sec: steps_done as f64 / run_secs.max(1e-9),
        steps: steps_done,
        worker_cpu_us_per_step: worker_cpu
            .map(|cpu| cpu.as_secs_f64() * 1e6 / steps_done.max(1) as f64),
        server: match server {
            Some(server) => Some(server.finish(steps_done).await?),
            None => None,
        },
    })
}

/// What `run_queue_bench` measures besides throughput.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measure<'a> {
    /// A `postgres://` URL reaching the workers' server directly: its cost per step
    /// (`ServerCost`) is read before and after the run.
    pub server: Option<&'a str>,
    /// Whether this process's CPU time during a one-process run is the worker's alone (not
    /// when the wire proxy runs in it too).
    pub own_cpu_is_workers: bool,
}

/// How soon queued work starts on idle workers (`bench queue --start-latency`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StartLatency {
    /// Whether the workers waited on the store's work signal (LISTEN/NOTIFY) or polled.
    pub signal: bool,
    /// Single tasks queued one at a time onto idle workers: queued (the submit returned) →
    /// its first step committed, in ms.
    pub single_p50_ms: f64,
    pub single_p99_ms: f64,
    pub singles: usize,
    /// A batch of `batch_tasks` queued onto idle workers (a chunk of 1,000 tasks per
    /// transaction): its first chunk committed → the first step of any of its tasks, in ms.
    pub batch_first_step_ms: f64,
    /// The same first step from the start of queueing, which includes building the first
    /// chunk's tasks.
    pub batch_first_step_from_queueing_ms: f64,
    pub batch_tasks: usize,
}

/// Starts an idle worker on `worker_store` (no batch filter, `concurrency` slots), queues
/// `singles` one-step tasks one at a time, each once the previous has started, then one batch
/// of `batch_tasks`, and measures how long each waited to start (`StartLatency`). With
/// `signal` false the worker polls every 500 ms (the default poll) instead of waiting on the
/// store's signal.
pub async fn start_latency(
    store: Arc<dyn Store>,
    worker_store: Arc<dyn Store>,
    singles: usize,
    batch_tasks: usize,
    concurrency: usize,
    signal: bool,
) -> Result<StartLatency, String> {
    const STEPS: u32 = 1;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopLevel::Run);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let options = WorkerOptions {
        concurrency,
        wake_on_signal: signal,
        ..WorkerOptions::default()
    };
    let worker = tokio::spawn(run_worker(
        worker_store,
        Arc::new(CounterHost { steps: STEPS }),
        options,
        stop_rx,
        Some(events_tx),
    ));
    // The worker goes idle (its first look finds nothing).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut waits = Vec::with_capacity(singles);
    for _ in 0..singles {
        submit(store.as_ref(), 1, STEPS).await?;
        let queued = Instant::now();
        let started = first_step(&mut events).await?;
        waits.push(started.saturating_duration_since(queued).as_secs_f64() * 1000.0);
        // The task finishes and the worker is idle again before the next one.
        tokio::time::sleep(Duration::from_millis(20)).await;
        while events.try_recv().is_ok() {}
    }
    // The tasks are enqueued a chunk per transaction, and the first chunk can start before
    // the last is in: the first step is awaited on a task of its own, so it is timed when it
    // happens, not when the submit next yields.
    let waiter = tokio::spawn(async move { first_step(&mut events).await });
    let queueing = Instant::now();
    let (_, first_chunk) = submit_noting_first(store.as_ref(), batch_tasks, STEPS).await?;
    let started = waiter
        .await
        .map_err(|e| format!("waiting for the batch's first step: {e}"))??;
    let ms = |from: Instant| started.saturating_duration_since(from).as_secs_f64() * 1000.0;
    let (batch_first_step_ms, batch_first_step_from_queueing_ms) = (ms(first_chunk), ms(queueing));
    let _ = stop_tx.send(StopLevel::Now);
    let _ = worker.await;
    waits.sort_by(f64::total_cmp);
    let at = |q: f64| {
        waits
            .get(((waits.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Ok(StartLatency {
        signal,
        single_p50_ms: at(0.5),
        single_p99_ms: at(0.99),
        singles,
        batch_first_step_ms,
        batch_first_step_from_queueing_ms,
        batch_tasks,
    })
}

/// When the next task's first step was committed (its event arrived).
async fn first_step(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<skillstate_runtime::WorkerEvent>,
) -> Result<Instant, String> {
    const START_TIMEOUT: Duration = Duration::from_secs(30);
    let started = tokio::time::timeout(START_TIMEOUT, async {
        while let Some(event) = events.recv().await {
            if let skillstate_runtime::WorkerEvent::Step { step: 1, .. } = event {
                return Ok(Instant::now());
            }
        }
        Err("the worker stopped".to_owned())
    })
    .await;
    started.unwrap_or_else(|_| {
        Err(format!(
            "no task started within {} s",
            START_TIMEOUT.as_secs()
        ))
    })
}
