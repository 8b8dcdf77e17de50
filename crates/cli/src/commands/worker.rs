//! `skillstate worker`: claims queued tasks of any batch (or one) from the database and runs
//! them; any number of workers on any number of machines may share one PostgreSQL database.
//! The first SIGTERM or Ctrl-C drains (claim nothing more, stop each task at its next step
//! boundary, release its lease), a second one exits at once.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use async_trait::async_trait;
use skillstate_providers::ModelProvider;
use skillstate_runtime::{
    HostedTask, StopLevel, TaskHost, WorkerEvent, WorkerOptions, WorkerStats, run_worker,
};
use skillstate_store::{TaskRecord, TaskStatus};
use tokio::sync::{mpsc, watch};

use super::world_of_task;
use crate::config::{Config, lease_policy, load_config, open_store};
use crate::model::build_model;
use crate::toolbox::Toolbox;

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// Tasks this process runs at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=4096))]
    concurrency: u16,
    /// Claim only tasks of this batch (id or unique prefix).
    #[arg(long)]
    batch: Option<String>,
    /// Exit once nothing is left to claim (instead of waiting for more work).
    #[arg(long)]
    until_idle: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while the worker runs (steps, rejected
    /// answers, tool errors, tokens, model latency, tasks settled, leases lost, queue depth).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Rebuilds a stored task's world and model the way `skillstate resume` does.
pub struct CliHost {
    pub config: Config,
    /// HTTP providers are shared by every task of one model spec: one connection pool and one
    /// in-process rate limiter per process, not per task. (Scripted models and the oracle keep
    /// per-task state and are built for each task.)
    shared: std::sync::Mutex<std::collections::HashMap<String, Arc<dyn ModelProvider>>>,
}

impl CliHost {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            shared: Default::default(),
        }
    }

    fn model_for(&self, task: &TaskRecord) -> Result<Arc<dyn ModelProvider>, String> {
        let stateless = task.model.starts_with("openai:") || task.model.starts_with("anthropic:");
        if stateless
            && let Ok(shared) = self.shared.lock()
            && let Some(model) = shared.get(&task.model)
        {
            return Ok(model.clone());
        }
        let kind = task
            .environment
            .as_ref()
            .and_then(|e| e.get("kind"))
            .and_then(|k| k.as_str());
        let model = build_model(&task.model, &self.config.model, kind)
            .map_err(|e| format!("cannot build the model `{}`: {e:#}", task.model))?;
        if stateless && let Ok(mut shared) = self.shared.lock() {
            shared.insert(task.model.clone(), model.clone());
        }
        Ok(model)
    }
}

#[async_trait]
impl TaskHost for CliHost {
    async fn open(&self, task: &TaskRecord) -> Result<HostedTask, String> {
        let model = self.model_for(task)?;
        // Rebuilding a simulated world computes its whole episode up front: on a blocking
        // thread, so the runtime's workers keep answering (the service shares them).
        let (record, config) = (task.clone(), self.config.clone());
        let handle = tokio::runtime::Handle::current();
        let world = tokio::task::spawn_blocking(move || {
            handle.block_on(world_of_task(&record, &config, false))
        })
        .await
        .map_err(|e| format!("cannot rebuild the task's world: {e}"))?
        .map_err(|e| format!("cannot rebuild the task's world: {e:#}"))?;
        Ok(HostedTask {
            env: world.env,
            model,
            resources: world
                .toolbox
                .map(|t| Box::new(t) as Box<dyn std::any::Any + Send + Sync>),
        })
    }

    async fn close(&self, hosted: HostedTask) {
        if let Some(resources) = hosted.resources
            && let Ok(toolbox) = resources.downcast::<Toolbox>()
        {
            toolbox.shutdown().await;
        }
    }
}

/// A stop signal for a worker: the first SIGTERM/SIGINT asks it to drain, the second to stop
/// at once. `label` names the command in the messages.
pub fn stop_on_signals(label: &'static str) -> watch::Receiver<StopLevel> {
    let (sender, receiver) = watch::channel(StopLevel::Run);
    tokio::spawn(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => Some(signal),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops {label}");
                    None
                }
            };
        let mut seen = 0;
        loop {
            tokio::select! {
                result = tokio::signal::ctrl_c() => {
                    if result.is_err() {
                        return;
                    }
                }
                Some(()) = async {
                    match terminate.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            seen += 1;
            if seen == 1 {
                errln!(
                    "{label}: draining — no new tasks; running ones stop at their next step and stay queued (signal again to stop at once)"
                );
                let _ = sender.send(StopLevel::Drain);
            } else {
                errln!("{label}: stopping at once");
                let _ = sender.send(StopLevel::Now);
                return;
            }
        }
    });
    receiver
}

/// The options a worker of this configuration runs with.
pub fn worker_options(config: &Config, label: &str, concurrency: usize) -> WorkerOptions {
    WorkerOptions {
        concurrency,
        lease: lease_policy(config, label),
        secrets: config.secrets(),
        ..WorkerOptions::default()
    }
}

pub async fn run(db: &str, config_path: Option<&Path>, args: WorkerArgs) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    let store = open_store(db, &config).await?;
    let mut options = worker_options(&config, "skillstate worker", usize::from(args.concurrency));
    if let Some(batch) = &args.batch {
        options.batch = Some(store.batch(batch).await?.id);
    }
    options.until_idle = args.until_idle;
    let (metrics_done, metrics_stop) = tokio::sync::oneshot::channel::<()>();
    if let Some(addr) = args.metrics_addr {
        // Installed before the first claim, so nothing the worker does goes uncounted.
        skillstate_server::metrics::install();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-addr {addr}: cannot listen"))?;
        errln!("metrics at http://{}/metrics", listener.local_addr()?);
        let serving = skillstate_server::serve_metrics(listener, store.clone(), async move {
            let _ = metrics_stop.await;
        });
        tokio::spawn(async move {
            if let Err(error) = serving.await {
                tracing::warn!(%error, "the metrics listener stopped");
            }
        });
    }
    let stop = stop_on_signals("worker");
    let host = Arc::new(CliHost::new(config));
    let (sender, receiver) = mpsc::unbounded_channel();
    let printer = tokio::spawn(print_events(receiver));
    errln!(
        "worker (pid {}) claiming {} with concurrency {} from {db}",
        std::process::id(),
        options
            .batch
            .as_deref()
            .map(|b| format!("tasks of batch {b}"))
            .unwrap_or_else(|| "tasks of every batch".into()),
        options.concurrency
    );
    let stopped = stop.clone();
    let stats = run_worker(store, host, options, stop, Some(sender)).await;
    if *stopped.borrow() == StopLevel::Now {
        errln!(
            "stopped at once: tasks that were running stay leased until their leases expire, then any worker resumes them from their journals"
        );
        std::process::exit(130);
    }
    let _ = printer.await;
    let _ = metrics_done.send(());
    let stats = stats?;
    errln!("{}", stats_line(&stats));
    Ok(ExitCode::SUCCESS)
}

fn stats_line(stats: &WorkerStats) -> String {
    format!(
        "worker done: {} claimed, {} completed, {} failed, {} paused, {} to retry later, {} released, {} taken over by another worker",
        stats.claimed,
        stats.completed,
        stats.failed,
        stats.paused,
        stats.retried,
        stats.released,
        stats.lost
    )
}

/// One line per task the queue is done with (or gave back), on stderr.
async fn print_events(mut events: mpsc::UnboundedReceiver<WorkerEvent>) {
    while let Some(event) = events.recv().await {
        match event {
            WorkerEvent::Settled {
                task,
                status,
                steps,
                failure,
            } => match (status, failure) {
                (TaskStatus::Failed, Some(failure)) => {
                    errln!("task {task} failed after {steps} step(s): {failure}")
                }
                _ => errln!("task {task} {} after {steps} step(s)", status.as_str()),
            },
            WorkerEvent::Retrying {
                task,
                tries,
                failure,
                ..
            } => errln!("task {task} failed ({failure}); retry {tries} queued with backoff"),
            WorkerEvent::Released { task } => errln!("task {task} released (still queued)"),
            WorkerEvent::LostLease { message, .. } => errln!("{message}"),
            WorkerEvent::BatchStopped { batch, reason } => {
                errln!("batch {batch} stopped: {reason}")
            }
            WorkerEvent::Claimed { .. } | WorkerEvent::Step { .. } => {}
        }
    }
}
