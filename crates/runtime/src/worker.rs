//! Workers: claim queued tasks from the store, run each under its claim's lease, retry failures
//! with backoff, and drain on request.
//!
//! Any number of worker processes may share one database (PostgreSQL across machines): the
//! store's claim is atomic, so a task is run by one worker at a time. A worker that dies leaves
//! its tasks leased until the leases expire (at once for a dead process of the same machine);
//! the next claim resumes each from its journal under the usual intent rules.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::secrets::Redactor;
use skillstate_providers::ModelProvider;
use skillstate_store::{
    BatchRecord, Claimed, LeaseClaim, LeasedWrite, OnError, Settle, Store, StoreError, TaskRecord,
    TaskStatus,
};
use skillstate_tools::{DEFAULT_CALL_LIMIT, Environment};
use tokio::sync::{Mutex, mpsc, watch};
use tokio::task::JoinSet;

use crate::lease::{HeldLease, LeasePolicy, process_identity};
use crate::rate::SharedRateLimit;
use crate::step_loop::now_millis;
use crate::{Drain, RunObserver, RuntimeError, is_retryable};

/// What a claimed task runs with, rebuilt from its stored record.
pub struct HostedTask {
    pub env: Box<dyn Environment>,
    pub model: Arc<dyn ModelProvider>,
    /// Whatever the host must keep alive while the task runs (an MCP tool box), handed back to
    /// `TaskHost::close`.
    pub resources: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Builds the world and the model of stored tasks (the CLI knows how: skills, tool boxes,
/// provider settings).
#[async_trait]
pub trait TaskHost: Send + Sync {
    /// `Err` carries a message for the task's failure record.
    async fn open(&self, task: &TaskRecord) -> Result<HostedTask, String>;
    /// Releases what `open` started.
    async fn close(&self, hosted: HostedTask) {
        let _ = hosted;
    }
}

/// How long to wait before whole-task retry `tries` (1-based): `base × 2^(tries-1)`, at most
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    pub fn delay(&self, tries: u32) -> Duration {
        let factor = 1u32
            .checked_shl(tries.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Tasks run at once.
    pub concurrency: usize,
    /// Claim only tasks of this batch.
    pub batch: Option<String>,
    pub lease: LeasePolicy,
    /// How often an idle worker looks for work when the store cannot signal it (SQLite, a
    /// transaction pooler; it also wakes at the next backoff's end).
    pub poll: Duration,
    /// Where the store signals new work (`Queue::work_signal`: PostgreSQL's LISTEN/NOTIFY),
    /// the longest an idle worker waits for a signal before it looks anyway.
    pub idle_poll: Duration,
    /// Wait on the store's work signal where it has one (the default); `false` polls every
    /// `poll` whatever the store (the queue bench's comparison).
    pub wake_on_signal: bool,
    /// Return once nothing is left to claim or running in this worker (`batch run`), instead
    /// of waiting for more work (`worker`).
    pub until_idle: bool,
    pub backoff: Backoff,
    pub tool_limit: Duration,
    pub secrets: Redactor,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            batch: None,
            lease: LeasePolicy {
                label: "skillstate worker".into(),
                ..LeasePolicy::default()
            },
            poll: Duration::from_millis(500),
            idle_poll: Duration::from_secs(5),
            wake_on_signal: true,
            until_idle: false,
            backoff: Backoff::default(),
            tool_limit: DEFAULT_CALL_LIMIT,
            secrets: Redactor::default(),
        }
    }
}

/// How a worker is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopLevel {
    Run,
    /// Claim nothing more; running tasks stop at their next step boundary and their leases are
    /// released, so another worker continues them.
    Drain,
    /// Return now; whatever is in flight is abandoned (every write is a transaction, so nothing
    /// is half-written; the leases expire).
    Now,
}

/// What a worker reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    Claimed {
        task: String,
        tries: u32,
        /// The task's lease had expired without being released (its last runner died or
        /// stalled): this worker took it over.
        took_over: bool,
    },
    Step {
        task: String,
        step: u64,
        prompt_tokens: usize,
        accepted: bool,
    },
    /// The task completed, failed for good or paused; the queue is done with it.
    Settled {
        task: String,
        status: TaskStatus,
        steps: u64,
        failure: Option<String>,
    },
    /// The task failed and is queued again, claimable at `not_before` (unix ms).
    Retrying {
        task: String,
        tries: u32,
        not_before: i64,
        failure: String,
    },
    /// Stopped at a step boundary because the worker drains; still queued.
    Released {
        task: String,
    },
    /// Another worker holds the task now (this one's lease expired); nothing more was written.
    /// `message` says to whom the lease went and when ("lost the lease to … at …").
    LostLease {
        task: String,
        message: String,
    },
    BatchStopped {
        batch: String,
        reason: String,
    },
}

/// Totals of one worker's run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    pub claimed: u64,
    pub completed: u64,
    pub failed: u64,
    pub paused: u64,
    pub retried: u64,
    pub released: u64,
    pub lost: u64,
}

type Events = Option<mpsc::UnboundedSender<WorkerEvent>>;

fn emit(events: &Events, event: WorkerEvent) {
    crate::metrics::worker_event(&event);
    if let Some(sender) = events {
        let _ = sender.send(event);
    }
}

/// Claims and runs tasks until stopped (or, with `until_idle`, until nothing is left).
pub async fn run_worker(
    store: Arc<dyn Store>,
    host: Arc<dyn TaskHost>,
    options: WorkerOptions,
    mut stop: watch::Receiver<StopLevel>,
    events: Events,
) -> Result<WorkerStats, RuntimeError> {
    let options = Arc::new(options);
    let drain = Drain::default();
    let batches: Arc<Mutex<HashMap<String, BatchRecord>>> = Arc::default();
    let mut running: JoinSet<Result<Outcome, RuntimeError>> = JoinSet::new();
    let mut stats = WorkerStats::default();
    let ttl_ms = u64::try_from(options.lease.ttl.as_millis()).unwrap_or(u64::MAX);
    let mut serial = 0u64;
    // Where the store can signal new work (PostgreSQL's LISTEN/NOTIFY), an idle worker waits on
    // it and polls only as a fallback; elsewhere it polls every `poll`.
    let mut wake = match options.wake_on_signal {
        true => store.work_signal().await?,
        false => None,
    };
    loop {
        // Seen before claiming: a signal that arrives while claiming ends the wait below.
        if let Some(wake) = wake.as_mut() {
            wake.borrow_and_update();
        }
        let level = *stop.borrow();
        if level >= StopLevel::Drain {
            drain.start();
        }
        if level == StopLevel::Now {
            running.abort_all();
            return Ok(stats);
        }
        // Claim while there is room.
        let mut claimed_any = false;
        while level == StopLevel::Run && running.len() < options.concurrency.max(1) {
            serial += 1;
            let claim = LeaseClaim {
                token: uuid::Uuid::now_v7().to_string(),
                holder: format!(
                    "`{}` slot {serial} (pid {})",
                    options.lease.label,
                    std::process::id()
                ),
                process: process_identity(),
            };
            let taken = tokio::time::Instant::now();
            let Some(claimed) = store
                .claim_task(&claim, ttl_ms, options.batch.as_deref())
                .await?
            else {
                break;
            };
            // The heartbeat starts now, not when the task's world is ready.
            let lease = HeldLease::adopt(
                store.clone(),
                &claimed.task_id,
                &claimed.lease.token,
                options.lease.ttl,
                taken,
            );
            claimed_any = true;
            stats.claimed += 1;
            emit(
                &events,
                WorkerEvent::Claimed {
                    task: claimed.task_id.clone(),
                    tries: claimed.tries,
                    took_over: claimed.took_over,
                },
            );
            running.spawn(run_one(
                store.clone(),
                host.clone(),
                options.clone(),
                batches.clone(),
                drain.clone(),
                events.clone(),
                claimed,
                lease,
            ));
        }
        if running.is_empty() && level >= StopLevel::Drain {
            return Ok(stats);
        }
        if running.is_empty() && !claimed_any && options.until_idle {
            // Nothing claimable now: done unless a retry waits on its backoff.
            match store.next_wakeup(options.batch.as_deref()).await? {
                None => return Ok(stats),
                Some(at) => {
                    // `at` may be when another worker's lease runs out; that worker usually
                    // settles its task much sooner, and then nothing is left to wait for:
                    // look again at least every poll interval.
                    let wait = u64::try_from(at - now_millis()).unwrap_or(0);
                    let wait = Duration::from_millis(wait.clamp(10, 60_000)).min(options.poll);
                    sleep_or_stop(&mut stop, wait).await;
                    continue;
                }
            }
        }
        let room = running.len() < options.concurrency.max(1);
        let idle = match &wake {
            // Signalled: wait for the signal, or until the next backoff or lease ends, or the
            // fallback poll.
            Some(_) if room && !claimed_any => {
                let until = store.next_wakeup(options.batch.as_deref()).await?;
                until.map_or(options.idle_poll, |at| {
                    let wait = u64::try_from(at - now_millis()).unwrap_or(0);
                    Duration::from_millis(wait.max(10)).min(options.idle_poll)
                })
            }
            Some(_) => options.idle_poll,
            None => options.poll,
        };
        let signalled = async {
            match wake.as_mut() {
                Some(wake) => {
                    if wake.changed().await.is_err() {
                        // The store's signal is gone: poll from now on.
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = signalled, if room => {}
            joined = running.join_next(), if !running.is_empty() => {
                if let Some(joined) = joined {
                    match joined {
                        Ok(Ok(outcome)) => outcome.count(&mut stats),
                        Ok(Err(error)) => return Err(error),
                        Err(error) if error.is_cancelled() => {}
                        Err(error) => {
                            tracing::error!(%error, "a task runner panicked");
                        }
                    }
                }
            }
            _ = stop.changed() => {}
            _ = tokio::time::sleep(idle), if room => {}
        }
    }
}

async fn sleep_or_stop(stop: &mut watch::Receiver<StopLevel>, wait: Duration) {
    tokio::select! {
        _ = stop.changed() => {}
        _ = tokio::time::sleep(wait) => {}
    }
}

enum Outcome {
    Settled(TaskStatus),
    Retrying,
    Released,
    Lost,
}

impl Outcome {
    fn count(self, stats: &mut WorkerStats) {
        match self {
            Outcome::Settled(TaskStatus::Completed) => stats.completed += 1,
            Outcome::Settled(TaskStatus::Failed) => stats.failed += 1,
            Outcome::Settled(_) => stats.paused += 1,
            Outcome::Retrying => stats.retried += 1,
            Outcome::Released => stats.released += 1,
            Outcome::Lost => stats.lost += 1,
        }
    }
}

/// Forwards the runner's progress as worker events.
struct StepEvents {
    task: String,
    events: Events,
}

impl RunObserver for StepEvents {
    fn attempt(
        &mut self,
        step: u64,
        _attempt: u32,
        prompt_tokens: usize,
        result: Result<&skillstate_core::AcceptedStep, &skillstate_core::RejectedStep>,
    ) {
        emit(
            &self.events,
            WorkerEvent::Step {
                task: self.task.clone(),
                step,
                prompt_tokens,
                accepted: result.is_ok(),
            },
        );
    }
}

async fn batch_of(
    store: &dyn Store,
    cache: &Mutex<HashMap<String, BatchRecord>>,
    id: &str,
) -> Result<BatchRecord, RuntimeError> {
    if let Some(batch) = cache.lock().await.get(id) {
        return Ok(batch.clone());
    }
    let batch = store.batch(id).await?;
    cache.lock().await.insert(id.to_owned(), batch.clone());
    Ok(batch)
}

/// Runs one claimed task and settles its claim. Errors are the store's (the database is gone);
/// a task that cannot run is recorded as failed instead.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    store: Arc<dyn Store>,
    host: Arc<dyn TaskHost>,
    options: Arc<WorkerOptions>,
    batches: Arc<Mutex<HashMap<String, BatchRecord>>>,
    drain: Drain,
    events: Events,
    claimed: Claimed,
    lease: HeldLease,
) -> Result<Outcome, RuntimeError> {
    let id = claimed.task_id.clone();
    let token = claimed.lease.token.clone();
    let batch = match &claimed.batch_id {
        Some(batch) => Some(batch_of(store.as_ref(), &batches, batch).await?),
        None => None,
    };
    let task = store.task(&id).await?;
    // Messages reopen any failed task; without them only a retry can continue it (read only
    // for a failed task: nothing else depends on it).
    let messaged =
        task.status == TaskStatus::Failed && !store.pending_messages(&id).await?.is_empty();
    if task.status == TaskStatus::Failed && !is_retryable(task.outcome.as_ref()) && !messaged {
        // Requeued, but a retry cannot change this failure (`max_steps`, a broken world): the
        // queue is done with it and its recorded failure stays as it was.
        let failure = failure_text(task.outcome.as_ref());
        return settle_done(&store, &events, &id, &token, task.version, failure).await;
    }
    // A task queued by a traced request continues its trace (read only when traces are on).
    let trace_parent = if crate::trace_context::enabled() {
        store.trace_context(&id).await?
    } else {
        None
    };
    let run = match run_hosted(
        &store,
        host.as_ref(),
        &options,
        &drain,
        &events,
        (&task, messaged, trace_parent),
        lease,
        batch.as_ref(),
    )
    .await
    {
        RunEnd::Ran(run) => run,
        RunEnd::Lost(message) => {
            emit(&events, WorkerEvent::LostLease { task: id, message });
            return Ok(Outcome::Lost);
        }
        RunEnd::Broken(message) => {
            // The task could not run at all (its world or model cannot be built, its journal is
            // broken): it fails, with the reason, if this worker still holds it.
            let outcome = json!({"reason": "worker", "message": message});
            let failed = LeasedWrite::Status {
                status: TaskStatus::Failed,
                outcome: Some(&outcome),
            };
            match store.write_under_lease(&id, &token, failed).await {
                Ok(_) => {}
                Err(error @ StoreError::LeaseLost { .. }) => {
                    emit(
                        &events,
                        WorkerEvent::LostLease {
                            task: id,
                            message: error.to_string(),
                        },
                    );
                    return Ok(Outcome::Lost);
                }
                Err(other) => return Err(other.into()),
            }
            crate::RunOutcome {
                task_id: id.clone(),
                status: TaskStatus::Failed,
                steps: task.version,
                outcome: Some(outcome),
            }
        }
    };
    if run.status == TaskStatus::Running {
        // Drained at a step boundary: still queued, for the next claim.
        let _ = store.release_lease(&id, &token).await;
        emit(&events, WorkerEvent::Released { task: id });
        return Ok(Outcome::Released);
    }
    let failure = (run.status == TaskStatus::Failed).then(|| failure_text(run.outcome.as_ref()));
    let max_retry = batch.as_ref().map(|b| b.max_retry).unwrap_or(0);
    let settle = if run.status == TaskStatus::Failed
        && claimed.tries < max_retry
        && is_retryable(run.outcome.as_ref())
        && !drain.is_set()
    {
        let delay = options.backoff.delay(claimed.tries + 1);
        Settle::RetryAt {
            not_before: now_millis() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2),
        }
    } else {
        Settle::Done
    };
    match store
        .settle_claim(&id, &token, &settle, failure.as_deref())
        .await
    {
        Ok(()) => {}
        Err(error @ StoreError::LeaseLost { .. }) => {
            emit(
                &events,
                WorkerEvent::LostLease {
                    task: id,
                    message: error.to_string(),
                },
            );
            return Ok(Outcome::Lost);
        }
        Err(other) => return Err(other.into()),
    }
    if let Settle::RetryAt { not_before } = settle {
        emit(
            &events,
            WorkerEvent::Retrying {
                task: id,
                tries: claimed.tries + 1,
                not_before,
                failure: failure.unwrap_or_default(),
            },
        );
        return Ok(Outcome::Retrying);
    }
    if run.status == TaskStatus::Failed
        && let Some(batch) = batch.as_ref().filter(|b| b.on_error == OnError::Stop)
    {
        let reason = format!("task {id} failed: {}", failure.clone().unwrap_or_default());
        store.stop_batch(&batch.id, &reason).await?;
        emit(
            &events,
            WorkerEvent::BatchStopped {
                batch: batch.id.clone(),
                reason,
            },
        );
    }
    emit(
        &events,
        WorkerEvent::Settled {
            task: id,
            status: run.status,
            steps: run.steps,
            failure,
        },
    );
    Ok(Outcome::Settled(run.status))
}

/// Settles a failed task's claim as done, keeping its failure.
async fn settle_done(
    store: &Arc<dyn Store>,
    events: &Events,
    id: &str,
    token: &str,
    steps: u64,
    failure: String,
) -> Result<Outcome, RuntimeError> {
    match store
        .settle_claim(id, token, &Settle::Done, Some(&failure))
        .await
    {
        Ok(()) => {}
        Err(error @ StoreError::LeaseLost { .. }) => {
            emit(
                events,
                WorkerEvent::LostLease {
                    task: id.to_owned(),
                    message: error.to_string(),
                },
            );
            return Ok(Outcome::Lost);
        }
        Err(other) => return Err(other.into()),
    }
    emit(
        events,
        WorkerEvent::Settled {
            task: id.to_owned(),
            status: TaskStatus::Failed,
            steps,
            failure: Some(failure),
        },
    );
    Ok(Outcome::Settled(TaskStatus::Failed))
}

enum RunEnd {
    Ran(crate::RunOutcome),
    /// The lease went to another worker; this one wrote nothing more. Says to whom and when.
    Lost(String),
    /// The task could not be run; the message says why.
    Broken(String),
}

/// Opens the task's world and model and runs it under the claim's lease.
#[allow(clippy::too_many_arguments)]
async fn run_hosted(
    store: &Arc<dyn Store>,
    host: &dyn TaskHost,
    options: &WorkerOptions,
    drain: &Drain,
    events: &Events,
    (task, messaged, trace_parent): (&TaskRecord, bool, Option<String>),
    lease: HeldLease,
    batch: Option<&BatchRecord>,
) -> RunEnd {
    let mut hosted = match host.open(task).await {
        Ok(hosted) => hosted,
        Err(message) => return RunEnd::Broken(message),
    };
    let model: Arc<dyn ModelProvider> = match batch {
        Some(batch) if !batch.rate_limit.is_unlimited() => Arc::new(
            SharedRateLimit::new(
                hosted.model.clone(),
                store.clone(),
                format!("batch {} model {}", batch.id, task.model),
                batch.rate_limit,
            )
            .draining_on(drain.clone()),
        ),
        _ => hosted.model.clone(),
    };
    let mut observer = StepEvents {
        task: task.id.clone(),
        events: events.clone(),
    };
    // A failed task with messages is reopened by them (`Runner::run`), not retried.
    let retry = task.status == TaskStatus::Failed && !messaged;
    let outcome = {
        let mut runner =
            crate::Runner::new(store.clone(), model, hosted.env.as_mut(), &mut observer)
                .with_lease_policy(options.lease.clone())
                .with_secrets(&options.secrets)
                .with_tool_limit(options.tool_limit)
                .with_stop(drain.flag())
                .with_trace_parent(trace_parent);
        runner.run_claimed(&task.id, lease, retry).await
    };
    host.close(hosted).await;
    match outcome {
        Ok(run) => RunEnd::Ran(run),
        Err(RuntimeError::Store(
            error @ (StoreError::LeaseLost { .. } | StoreError::Conflict { .. }),
        )) => RunEnd::Lost(error.to_string()),
        Err(other) => RunEnd::Broken(other.to_string()),
    }
}

/// One line for a failed task's outcome: its reason and message.
pub fn failure_text(outcome: Option<&Value>) -> String {
    let reason = outcome
        .and_then(|o| o.get("reason"))
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    match outcome
        .and_then(|o| o.get("message"))
        .and_then(Value::as_str)
    {
        Some(message) => format!("{reason}: {message}"),
        None => reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let backoff = Backoff {
            base: Duration::from_secs(2),
            max: Duration::from_secs(10),
        };
        assert_eq!(backoff.delay(1), Duration::from_secs(2));
        assert_eq!(backoff.delay(2), Duration::from_secs(4));
        assert_eq!(backoff.delay(3), Duration::from_secs(8));
        assert_eq!(backoff.delay(4), Duration::from_secs(10));
        assert_eq!(backoff.delay(200), Duration::from_secs(10));
    }
}
