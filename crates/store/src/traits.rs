//! The store's contract, one trait per concern. `Store` is all of them together; every backend
//! implements each one in its own module (`sqlite/tasks.rs`, `postgres/journal.rs`, ...), and
//! the conformance suite (`tests/conformance.rs`) is the contract both must pass.
//!
//! Callers holding an `Arc<dyn Store>` bring the concern traits into scope with
//! `use skillstate_store::prelude::*;`.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::recall::{HitCursor, RawHit, RecallQuery};

use crate::boards::Boards;
use crate::inbox::Inbox;
use crate::model::*;
use crate::queue::Queue;
use crate::service::{Events, Keys, Tenancy};
use crate::{LeasedWrite, Result};

/// Everything a backend offers: tasks, their journal, execution leases, the work queue, what
/// the HTTP service needs (API keys, tenants, events), and boards shared by several tasks.
pub trait Store:
    Tasks + Journal + Leases + Queue + Keys + Tenancy + Events + Inbox + Boards + Release + Send + Sync
{
}

impl<
    T: Tasks
        + Journal
        + Leases
        + Queue
        + Keys
        + Tenancy
        + Events
        + Inbox
        + Boards
        + Release
        + Send
        + Sync,
> Store for T
{
}

/// Letting go of the database before the store is dropped.
#[async_trait]
pub trait Release: Send + Sync {
    /// Finishes the writes already handed over, then closes every connection of this store
    /// and stops its threads, and returns once they are gone: the database file or server
    /// is no longer used by this process (dropping a store lets go of it too, but in the
    /// background). Whatever the store is asked afterwards fails with an error.
    async fn release(&self);
}

/// Tasks as wholes: creating, finding, listing, forking, compacting and deleting them.
#[async_trait]
pub trait Tasks: Send + Sync {
    /// Creates a task at version 0 with its initial state, snapshot and opening observation.
    async fn create_task(&self, task: NewTask, initial_state: &Value) -> Result<TaskRecord>;
    /// Finds a task by full id or unique id prefix.
    async fn task(&self, id_or_prefix: &str) -> Result<TaskRecord>;
    /// The state of the task whose full id is `id` (no prefixes), with what checking a write
    /// of it needs; `NotFound` when there is none. Cheaper than `task` where the record's
    /// other parts are not needed (the service's state routes).
    async fn task_state(&self, id: &str) -> Result<TaskState>;
    async fn list_tasks(&self) -> Result<Vec<TaskSummary>>;
    /// Creates a task that continues `parent` after its step `step`: same skill, tools,
    /// context and model; `state` at version `step`; the parent's journal, observations,
    /// intents and snapshots up to that step copied; the parent and step recorded. One
    /// transaction.
    async fn fork_task(
        &self,
        parent: &str,
        step: u64,
        state: &Value,
        env_checkpoint: Option<&Value>,
    ) -> Result<TaskRecord>;
    /// Stores `state_before` (the state after step `keep_from - 1`) as a snapshot, then drops
    /// the journal, observation and intent rows of earlier steps and the older snapshots. One
    /// transaction. Returns the number of rows deleted.
    async fn compact_task(&self, task: &str, keep_from: u64, state_before: &Value) -> Result<u64>;
    /// Deletes a task and everything it owns.
    async fn delete_task(&self, task: &str) -> Result<()>;
    /// Deletes whole storage partitions of finished tasks: every partition (PostgreSQL: the
    /// tasks created in one period, docs/storage.md) whose tasks are all completed or failed
    /// and last updated before `updated_before` (unix milliseconds) is dropped, and its tasks
    /// deleted as [`delete_task`](Self::delete_task) deletes one. With `dry_run` nothing
    /// changes and the partitions that would go are returned. Tasks in no returned partition
    /// are left to `delete_task`; a backend without partitions (SQLite) returns none.
    async fn retire_partitions(
        &self,
        updated_before: i64,
        dry_run: bool,
    ) -> Result<Vec<RetiredPartition>> {
        let _ = (updated_before, dry_run);
        Ok(Vec::new())
    }
    /// Bytes the task occupies, by kind.
    async fn storage_stats(&self, task: &str) -> Result<StorageStats>;
    /// The skill versions `task` ran, oldest first: each from the step it began at (0 for the
    /// one it was created with).
    async fn task_versions(&self, task: &str) -> Result<Vec<TaskVersion>>;
    /// The skill version stored under `hash`, checked against it.
    async fn skill_version(&self, hash: &str) -> Result<SkillChange>;
    /// Every stored skill version, by name and then age, with the tasks that run it now.
    async fn skill_versions(&self) -> Result<Vec<SkillVersionSummary>>;
    /// The W3C `traceparent` stored with `task` (full id) by the request that created it
    /// (`TaskOwner::trace_context`); `None` when it has none. `NotFound` for an unknown task.
    async fn trace_context(&self, task: &str) -> Result<Option<String>>;
    /// Schedules `task`, still at `expected_version` (else `Conflict`), to move to `change`
    /// once its waiting action is settled (`TaskRecord::upgrade_to`), or unschedules it
    /// (`None`). The version is stored now.
    async fn schedule_upgrade(
        &self,
        task: &str,
        expected_version: u64,
        change: Option<(&SkillChange, &str)>,
    ) -> Result<()>;
}

/// The step journal of one task: writing steps, rejections and tool results, and reading them
/// back.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Appends a rejected answer; the state is untouched.
    async fn record_rejection(&self, task: &str, entry: &JournalEntry) -> Result<()>;
    /// Commits an accepted step atomically, if the task is still at `expected_version`.
    async fn commit_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()>;
    /// Records a tool's result and the next observation atomically.
    async fn record_action_result(&self, task: &str, result: &ActionResult) -> Result<()>;
    async fn set_status(
        &self,
        task: &str,
        status: TaskStatus,
        outcome: Option<&Value>,
    ) -> Result<()>;
    async fn journal(&self, task: &str) -> Result<Vec<JournalEntry>>;
    async fn observation(&self, task: &str, step: u64) -> Result<Option<String>>;
    /// Every recorded observation as `(step, text)`, in step order.
    async fn observations(&self, task: &str) -> Result<Vec<(u64, String)>>;
    async fn intents(&self, task: &str) -> Result<Vec<IntentRecord>>;
    /// The action intent of `task` at `step`, if any: one row, however long the history
    /// (what a write or a pause asks before it goes on).
    async fn intent(&self, task: &str, step: u64) -> Result<Option<IntentRecord>>;
    /// The latest snapshot at or before `step`, as `(step, state)`; `None` when gc compacted
    /// everything up to there away.
    async fn snapshot_before(&self, task: &str, step: u64) -> Result<Option<(u64, Value)>>;
    /// `(step, patch, state_hash)` of accepted steps in `from..=to`, in order.
    async fn accepted_patches(
        &self,
        task: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Value, String)>>;
    /// The span of accepted steps in the journal, for checking its continuity cheaply.
    async fn journal_extent(&self, task: &str) -> Result<JournalExtent>;
    /// Entries of the task's recall index that match `query` (its words, pointer, kinds and
    /// step range), newest first unless `query.oldest_first`, starting after `after`, at most
    /// `limit`. The index is written in the transaction of what it indexes: a committed step
    /// is found, a rolled-back one never. What a reader may see of a hit is decided by
    /// `RawHit::reveal`. No such task: no hits.
    async fn search_journal(
        &self,
        task: &str,
        query: &RecallQuery,
        after: Option<HitCursor>,
        limit: usize,
    ) -> Result<Vec<RawHit>>;
}

/// Execution leases: one runner drives a task at a time.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes the execution lease of `task` for `ttl_ms`: granted when nobody holds it, it has
    /// expired, `claim.token` holds it already (a renewal), or `replacing` names the token
    /// that holds it now (taking over from a holder known to be dead). Otherwise
    /// `StoreError::Leased` says who holds it. One atomic statement.
    async fn acquire_lease(
        &self,
        task: &str,
        claim: &LeaseClaim,
        ttl_ms: u64,
        replacing: Option<&str>,
    ) -> Result<LeaseInfo>;
    /// Extends the lease held by `token`; `StoreError::LeaseLost` when `token` no longer holds
    /// it.
    async fn renew_lease(&self, task: &str, token: &str, ttl_ms: u64) -> Result<()>;
    /// Gives the lease up, if `token` still holds it.
    async fn release_lease(&self, task: &str, token: &str) -> Result<()>;
    /// Makes `write` as the runner whose lease `token` is: the lease is checked first, in the
    /// same transaction as the write, so a runner that lost it (frozen past its time to live
    /// while another runner took the task over) gets `StoreError::LeaseLost` naming the new
    /// holder and since when, before any other check of the write (the task's version, a
    /// pending intent) can speak, and nothing of the write is kept. Otherwise exactly the
    /// write's own method (`commit_step`, `record_rejection`, `record_action_result`,
    /// `set_status`, `commit_step_with_board`). Returns what the write reports back: the
    /// board's new version for a step with a board write, and, where the store learned it with
    /// a step's commit, whether messages wait in the task's inbox ([`Written`]).
    async fn write_under_lease(
        &self,
        task: &str,
        token: &str,
        write: LeasedWrite<'_>,
    ) -> Result<Written>;
    /// The current lease of `task`, expired or not.
    async fn lease(&self, task: &str) -> Result<Option<LeaseInfo>>;
    /// Commits an accepted step written from outside any runner (state written through the
    /// API) without taking the lease: refused with `StoreError::Leased` naming the holder
    /// while anyone holds an unexpired lease on `task`, and with `Conflict` when the task is
    /// no longer at `expected_version`; otherwise exactly `Journal::commit_step`. The lease
    /// check and the commit are one transaction, so the step never interleaves with a
    /// runner's (a runner that takes the lease afterwards reads the new state), and the
    /// write costs one commit instead of three (take the lease, commit, release it).
    async fn commit_unleased_step(
        &self,
        task: &str,
        expected_version: u64,
        commit: &StepCommit,
    ) -> Result<()>;
}

/// A storage partition [`Tasks::retire_partitions`] dropped (or would drop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiredPartition {
    /// Its name: the tables' suffix (`legacy`, `p20261201000000`).
    pub name: String,
    /// The end of its period (unix milliseconds): it held tasks created before.
    pub to_ms: i64,
    /// The ids of the tasks deleted with it.
    pub tasks: Vec<String>,
}

/// What a task occupies in the store, in bytes of stored text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StorageStats {
    /// Accepted steps.
    pub steps: u64,
    /// Journal rows (answers, patches, actions, errors, hashes, usage).
    pub journal_bytes: u64,
    /// Action intents and their results.
    pub intent_bytes: u64,
    pub observation_bytes: u64,
    pub snapshot_bytes: u64,
}

impl StorageStats {
    /// Journal and intent bytes per accepted step, observations excluded.
    pub fn journal_bytes_per_step(&self) -> f64 {
        (self.journal_bytes + self.intent_bytes) as f64 / self.steps.max(1) as f64
    }
}
