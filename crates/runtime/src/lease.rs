//! One runner per task: the execution lease.
//!
//! Before a runner touches a task (run, resume, approve, reject, reply) it takes the task's
//! lease in the store, renews it in the background every third of its time to live, checks it
//! before every model call, commit and tool call, and releases it when it stops. A second
//! process gets `StoreError::Leased` naming the holder and since when. It may take the task
//! over once the lease expired, or at once when the holder is a process of this same machine
//! (same boot, same PID namespace) that no longer exists — a `kill -9` does not lock a task
//! for the lease's whole time to live.
//!
//! Every write a runner makes goes through its lease ([`TaskWriter`]): the store checks the
//! lease in the same transaction as the write (`Leases::write_under_lease`), so a runner that
//! was frozen past its lease while another runner took the task over stops with "lost the
//! lease to <holder> at <time>" and writes nothing — whatever it was about to write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use skillstate_store::{DEFAULT_LEASE_SECS, LeaseClaim, LeasedWrite, Store, StoreError, Written};
use tokio::task::JoinHandle;

use crate::RuntimeError;
use crate::step_loop::now_millis;

/// How a runner leases its tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Time to live of a lease that is not renewed.
    pub ttl: Duration,
    /// Who is running, for people: `skillstate run`, `worker 3`.
    pub label: String,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(DEFAULT_LEASE_SECS),
            label: "skillstate".into(),
        }
    }
}

/// A lease this process holds; renewed until released or dropped.
pub(crate) struct HeldLease {
    store: Arc<dyn Store>,
    task: String,
    token: String,
    lost: Lost,
    heartbeat: JoinHandle<()>,
}

/// Who took the lease over and when (`holder`, Unix milliseconds), once it is lost.
type Lost = Arc<Mutex<Option<(String, i64)>>>;

fn mark_lost(lost: &Lost, error: &StoreError) {
    let (holder, at) = match error {
        StoreError::LeaseLost { holder, at, .. } => (holder.clone(), *at),
        _ => (
            "another runner (the lease could not be renewed in time)".to_owned(),
            now_millis(),
        ),
    };
    if let Ok(mut lost) = lost.lock() {
        lost.get_or_insert((holder, at));
    }
}

impl HeldLease {
    /// Takes `task`'s lease, taking it over from a holder that is provably gone.
    pub(crate) async fn acquire(
        store: Arc<dyn Store>,
        task: &str,
        policy: &LeasePolicy,
    ) -> Result<Self, RuntimeError> {
        let claim = LeaseClaim {
            token: uuid::Uuid::now_v7().to_string(),
            holder: format!(
                "`{}` (pid {} on {})",
                policy.label,
                std::process::id(),
                host_name()
            ),
            process: process_identity(),
        };
        let ttl_ms = u64::try_from(policy.ttl.as_millis()).unwrap_or(u64::MAX);
        match store.acquire_lease(task, &claim, ttl_ms, None).await {
            Ok(_) => {}
            Err(StoreError::Leased { lease, .. }) if holder_is_gone(&lease.process) => {
                tracing::info!(task, holder = %lease.holder, "taking over from a holder that no longer runs");
                store
                    .acquire_lease(task, &claim, ttl_ms, Some(&lease.token))
                    .await?;
                crate::metrics::lease_taken_over();
            }
            Err(other) => return Err(other.into()),
        }
        let lost: Lost = Arc::default();
        let heartbeat = tokio::spawn(renew(
            store.clone(),
            task.to_owned(),
            claim.token.clone(),
            policy.ttl,
            lost.clone(),
        ));
        Ok(Self {
            store,
            task: task.to_owned(),
            token: claim.token,
            lost,
            heartbeat,
        })
    }

    /// Keeps renewing a lease this process took at `taken` (a worker's claim), on a schedule
    /// counted from that moment: whatever the worker does before the task runs (opening its
    /// world, reading its record) does not eat into the lease's life.
    pub(crate) fn adopt(
        store: Arc<dyn Store>,
        task: &str,
        token: &str,
        ttl: Duration,
        taken: tokio::time::Instant,
    ) -> Self {
        let lost: Lost = Arc::default();
        let heartbeat = tokio::spawn(renew_from(
            store.clone(),
            task.to_owned(),
            token.to_owned(),
            ttl,
            lost.clone(),
            taken,
        ));
        Self {
            store,
            task: task.to_owned(),
            token: token.to_owned(),
            lost,
            heartbeat,
        }
    }

    /// Stops renewing without giving the lease up (its owner settles it).
    pub(crate) fn keep(self) {
        self.heartbeat.abort();
    }

    /// `Err` once the lease could not be renewed: another runner may own the task now.
    pub(crate) fn check(&self) -> Result<(), RuntimeError> {
        let lost = self.lost.lock().ok().and_then(|lost| lost.clone());
        match lost {
            Some((holder, at)) => Err(StoreError::LeaseLost {
                task: self.task.clone(),
                holder,
                at,
            }
            .into()),
            None => Ok(()),
        }
    }

    /// Makes `write` under this lease, checked by the store in the same transaction.
    pub(crate) async fn write(&self, write: LeasedWrite<'_>) -> Result<Written, RuntimeError> {
        self.check()?;
        match self
            .store
            .write_under_lease(&self.task, &self.token, write)
            .await
        {
            Ok(written) => Ok(written),
            Err(error @ StoreError::LeaseLost { .. }) => {
                mark_lost(&self.lost, &error);
                Err(error.into())
            }
            Err(error) => Err(error.into()),
        }
    }

    pub(crate) async fn release(self) {
        self.heartbeat.abort();
        if let Err(error) = self.store.release_lease(&self.task, &self.token).await {
            tracing::warn!(task = %self.task, %error, "could not release the execution lease; it expires by itself");
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// Renews every third of the time to live, counted from when the lease was taken; a renewal
/// refused (someone else holds the lease) marks the lease lost. A failed renewal (database
/// briefly unreachable) is retried until the lease would have expired, and then counts as lost
/// too. Renewals keep to their schedule: a slow one does not push the next one back.
async fn renew(store: Arc<dyn Store>, task: String, token: String, ttl: Duration, lost: Lost) {
    renew_from(store, task, token, ttl, lost, tokio::time::Instant::now()).await;
}

async fn renew_from(
    store: Arc<dyn Store>,
    task: String,
    token: String,
    ttl: Duration,
    lost: Lost,
    taken: tokio::time::Instant,
) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let every = (ttl / 3).max(Duration::from_millis(50));
    let mut schedule = tokio::time::interval_at(taken + every, every);
    schedule.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_renewed = taken;
    loop {
        schedule.tick().await;
        let asked = tokio::time::Instant::now();
        match store.renew_lease(&task, &token, ttl_ms).await {
            Ok(()) => last_renewed = asked,
            Err(error @ StoreError::LeaseLost { .. }) => {
                mark_lost(&lost, &error);
                return;
            }
            Err(error) => {
                tracing::warn!(%task, %error, "could not renew the execution lease");
                if last_renewed.elapsed() >= ttl {
                    mark_lost(&lost, &error);
                    return;
                }
            }
        }
    }
}

/// Where a runner's writes of one task go: through the lease it holds (the store checks the
/// lease in the same transaction as each write), or, for a runner that holds none, straight to
/// the store. The runner writes a task only through this.
pub(crate) struct TaskWriter<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) lease: Option<&'a HeldLease>,
}

impl TaskWriter<'_> {
    /// Makes `write` on `task`; `LeaseLost` (naming the new holder) before anything else when
    /// the lease was taken over. Returns what the store reported back ([`Written`]).
    pub(crate) async fn write(
        &self,
        task: &str,
        write: LeasedWrite<'_>,
    ) -> Result<Written, RuntimeError> {
        if let Some(lease) = self.lease.filter(|lease| lease.task == task) {
            return lease.write(write).await;
        }
        let store = self.store;
        match write {
            LeasedWrite::Step {
                expected_version,
                commit,
            } => store.commit_step(task, expected_version, commit).await?,
            LeasedWrite::Rejection(entry) => store.record_rejection(task, entry).await?,
            LeasedWrite::ActionResult(result) => store.record_action_result(task, result).await?,
            LeasedWrite::Status { status, outcome } => {
                store.set_status(task, status, outcome).await?
            }
            LeasedWrite::StepWithBoard {
                expected_task_version,
                commit,
                board,
                expected_board_version,
                write,
            } => {
                return Ok(Written::board(Some(
                    store
                        .commit_step_with_board(
                            task,
                            expected_task_version,
                            commit,
                            board,
                            expected_board_version,
                            write,
                        )
                        .await?,
                )));
            }
        }
        Ok(Written::default())
    }
}

/// `linux <boot id> <pid namespace> <pid> <start time>`: enough for another process of the same
/// machine to tell whether this one still exists (a reused pid has another start time).
pub(crate) fn process_identity() -> String {
    let pid = std::process::id();
    format!(
        "linux {} {} {pid} {}",
        boot_id(),
        pid_namespace(),
        start_time(pid).unwrap_or_default()
    )
}

/// `true` only when `process` names a process of this machine and PID namespace that no
/// longer exists. Anything else (another machine, another container, unreadable) is alive as
/// far as we can tell: its lease has to expire.
pub(crate) fn holder_is_gone(process: &str) -> bool {
    let parts: Vec<&str> = process.split(' ').collect();
    let ["linux", boot, namespace, pid, started] = parts.as_slice() else {
        return false;
    };
    if boot.is_empty() || *boot != boot_id() || *namespace != pid_namespace() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    match start_time(pid) {
        None => std::path::Path::new("/proc/self").exists(),
        Some(now) => now != *started,
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; fields after it don't.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19).map(str::to_owned)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "this host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_dead_pid_is_gone() {
        assert!(!holder_is_gone(&process_identity()));
        // A child that has exited and been reaped no longer exists.
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let identity = format!(
            "linux {} {} {pid} {}",
            boot_id(),
            pid_namespace(),
            start_time(pid).unwrap_or_else(|| "0".into())
        );
        child.wait().expect("wait");
        assert!(holder_is_gone(&identity));
        // Another machine or an unparsable identity is never presumed dead.
        assert!(!holder_is_gone(&format!(
            "linux other-boot {} {pid} 1",
            pid_namespace()
        )));
        assert!(!holder_is_gone("something else"));
    }
}
