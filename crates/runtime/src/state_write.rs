//! State written by someone other than the model: an API client, an operator.
//!
//! Such a write is a step like any other: it names the version it replaces (`If-Match`), goes
//! through the same checks as a model's `state_patch` (patch shape, read-only locations,
//! schema, state budget), and is journaled as an accepted step with its author, so time
//! travel, replay and hash checks cover it. It never interleaves with a runner: its step
//! commits only while nobody holds the task's execution lease, checked in the same transaction
//! (`Leases::commit_unleased_step`), so a task that a live runner is driving (mid-step, between
//! steps, waiting on its model) is refused with `Busy` instead of racing it; so is a task whose
//! last action is still in flight or waiting for a human (`Pending`). The write itself takes no
//! lease: one commit, shared with whatever else commits at that moment.
//! The observation the task's next step would have started from carries over to the step
//! after the write, with a note that the state was changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use skillstate_core::{AcceptedPatch, Rejection, StateSchema, validate_patch};
use skillstate_store::{
    JournalEntry, LeaseInfo, LeasedWrite, NextObservation, StepCommit, Store, StoreError,
    TaskRecord, TaskState, Verdict,
};

use crate::lease::{HeldLease, LeasePolicy, holder_is_gone};
use crate::step_loop::now_millis;

/// Added to the observation the task's next step starts from.
const CHANGED_NOTE: &str =
    "(The state was changed outside this task since the last step; the state shown is current.)";

/// How state writers name themselves as lease holders.
const WRITER_LABEL: &str = "state write by";
/// How long a state write waits for another state write of the same task.
const WRITER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One state write.
#[derive(Debug, Clone)]
pub struct StateWrite<'a> {
    /// Full task id.
    pub task: &'a str,
    /// The version the writer read; the write applies only on top of it.
    pub if_match: u64,
    /// An RFC 7396 merge patch (object) or RFC 6902 operations (array).
    pub patch: &'a Value,
    /// Who writes, recorded in the journal (an API key id).
    pub author: &'a str,
    /// The patch checked ahead (`check_patch_ahead`), where the caller chose to spend the CPU;
    /// used only for the task and version it was made for, else the write checks it itself.
    pub checked: Option<&'a PatchCheck>,
}

/// The CPU-heavy half of a state write — the task's schema compiled, the patch checked against
/// its state (shape, read-only locations, schema, budget) — made ahead of the write, on whatever
/// thread the caller likes: the service makes it off its async workers, under its work
/// deadline, and abandons it at the deadline (it writes nothing). The write then only reads,
/// checks versions and pending actions in their usual order, and commits.
///
/// The write takes the outcome (its new state is the step's) instead of copying it: a check is
/// used once, and a write that has to read the task again checks the patch itself.
#[derive(Debug)]
pub struct PatchCheck {
    task: String,
    version: u64,
    outcome: Mutex<Option<Result<AcceptedPatch, Vec<Rejection>>>>,
}

impl PatchCheck {
    /// The outcome, for the task and version it was made for, unless a write took it already.
    fn take_for(&self, task: &TaskState) -> Option<Result<AcceptedPatch, Vec<Rejection>>> {
        if self.task != task.id || self.version != task.version {
            return None;
        }
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// Checks `patch` against `task` as its write will (see [`PatchCheck`]).
pub fn check_patch_ahead(task: &TaskState, patch: &Value) -> Result<PatchCheck, StateWriteError> {
    let schema = compiled_schema(task)?;
    Ok(PatchCheck {
        task: task.id.clone(),
        version: task.version,
        outcome: Mutex::new(Some(validate_patch(
            &schema,
            task.state_tokens,
            &task.state,
            patch,
            &schema.whole_view(),
        ))),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum StateWriteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The task is at another version than `If-Match` named.
    #[error(
        "task {task} is at version {current}, not {expected}: read the state again and reapply the change"
    )]
    Stale {
        task: String,
        expected: u64,
        current: u64,
    },
    /// The patch fails validation; each rejection has its kind and JSON pointer.
    #[error("the patch was rejected: {}", .rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Rejected { rejections: Vec<Rejection> },
    /// A runner holds the task's lease.
    #[error(
        "task {task} is being run by {holder}; its state changes with every step: send a message instead, or write once it stops"
    )]
    Busy { task: String, holder: String },
    /// An action of the task is in flight or waits for a human.
    #[error(
        "task {task} has an action at step {step} that is {what}; settle it first (approve, reject or reply)"
    )]
    Pending {
        task: String,
        step: u64,
        what: &'static str,
    },
    /// The task's stored skill cannot be rebuilt.
    #[error("task {task}: {message}")]
    StoredTask { task: String, message: String },
}

/// Applies `write` and returns the task as it is after it.
pub async fn write_state(
    store: &Arc<dyn Store>,
    write: &StateWrite<'_>,
) -> Result<TaskRecord, StateWriteError> {
    let mut task = store.task(write.task).await?;
    let written = write_state_read(store, &TaskState::of(&task), write).await?;
    task.version = written.version;
    task.state = written.state;
    task.updated_at = written.at;
    Ok(task)
}

/// What a state write made: the task's new version and state.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub version: u64,
    pub state: Value,
    /// When it was written (unix milliseconds, this process's clock).
    pub at: i64,
}

/// [`write_state`] for a task the caller has just read (`task` is `write.task`'s state, as
/// `Tasks::task_state` reads it; the service reads it anyway, to check its tenant). The version the write applies to is checked
/// again when it commits, so a record that is no longer current only makes the write stale.
///
/// The write takes no lease: its step commits only while nobody holds one
/// (`Leases::commit_unleased_step`), in one transaction with the version check, so it never
/// lands inside a runner's work and costs one commit. A holder that is provably gone (a dead
/// process of this machine) is taken over as runners take it over, and the write is then made
/// under that lease.
pub async fn write_state_read(
    store: &Arc<dyn Store>,
    task: &TaskState,
    write: &StateWrite<'_>,
) -> Result<Written, StateWriteError> {
    // Another state write may hold the lease for the moment of its write (one taking over from
    // a dead holder, or a process of an older version): wait for it (then the version check
    // decides), but never for a runner.
    let deadline = tokio::time::Instant::now() + WRITER_WAIT;
    let mut reread: Option<TaskState> = None;
    loop {
        let task = reread.as_ref().unwrap_or(task);
        let prepared = match prepare(store.as_ref(), task, write).await {
            Ok(prepared) => prepared,
            // A runner driving the task is what the writer needs to hear first.
            Err(refused) => return Err(busy_first(store.as_ref(), &task.id, refused).await),
        };
        let lease = match store
            .commit_unleased_step(&task.id, task.version, &prepared.commit)
            .await
        {
            Ok(()) => return Ok(prepared.written()),
            Err(StoreError::Conflict { actual, .. }) => {
                return Err(StateWriteError::Stale {
                    task: task.id.clone(),
                    expected: write.if_match,
                    current: actual,
                });
            }
            Err(StoreError::Leased { lease, .. }) => lease,
            Err(other) => return Err(other.into()),
        };
        if is_state_writer(&lease) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        } else if holder_is_gone(&lease.process) {
            return write_leased(store, write).await;
        } else {
            return Err(StateWriteError::Busy {
                task: task.id.clone(),
                holder: lease.holder,
            });
        }
        reread = Some(store.task_state(&task.id).await?);
    }
}

/// Whether `lease` is held by a state write (whose hold lasts one write).
fn is_state_writer(lease: &LeaseInfo) -> bool {
    lease.holder.starts_with(&format!("`{WRITER_LABEL} "))
}

/// `refused` — unless a runner holds the task's lease, which is then the answer (`Busy`), as
/// when the lease was taken before anything else was checked.
async fn busy_first(store: &dyn Store, task: &str, refused: StateWriteError) -> StateWriteError {
    if !matches!(
        refused,
        StateWriteError::Stale { .. }
            | StateWriteError::Pending { .. }
            | StateWriteError::Rejected { .. }
    ) {
        return refused;
    }
    match store.lease(task).await {
        Ok(Some(lease))
            if lease.expires_at > now_millis()
                && !is_state_writer(&lease)
                && !holder_is_gone(&lease.process) =>
        {
            StateWriteError::Busy {
                task: task.to_owned(),
                holder: lease.holder,
            }
        }
        _ => refused,
    }
}

/// The write under the task's lease, taken over from a holder that is gone.
async fn write_leased(
    store: &Arc<dyn Store>,
    write: &StateWrite<'_>,
) -> Result<Written, StateWriteError> {
    let policy = LeasePolicy {
        label: format!("{WRITER_LABEL} {}", write.author),
        ..LeasePolicy::default()
    };
    let lease = match HeldLease::acquire(store.clone(), write.task, &policy).await {
        Ok(lease) => lease,
        Err(crate::RuntimeError::Store(StoreError::Leased { lease, .. })) => {
            return Err(StateWriteError::Busy {
                task: write.task.to_owned(),
                holder: lease.holder,
            });
        }
        Err(crate::RuntimeError::Store(error)) => return Err(error.into()),
        Err(other) => {
            return Err(StateWriteError::StoredTask {
                task: write.task.to_owned(),
                message: other.to_string(),
            });
        }
    };
    let result = async {
        let task = store.task_state(write.task).await?;
        let prepared = prepare(store.as_ref(), &task, write).await?;
        let step = LeasedWrite::Step {
            expected_version: task.version,
            commit: &prepared.commit,
        };
        match lease.write(step).await {
            Ok(_) => Ok(prepared.written()),
            Err(crate::RuntimeError::Store(StoreError::Conflict { actual, .. })) => {
                Err(StateWriteError::Stale {
                    task: task.id,
                    expected: write.if_match,
                    current: actual,
                })
            }
            Err(crate::RuntimeError::Store(other)) => Err(other.into()),
            Err(other) => Err(StateWriteError::StoredTask {
                task: task.id,
                message: other.to_string(),
            }),
        }
    }
    .await;
    lease.release().await;
    result
}

/// A checked write, ready to commit.
struct Prepared {
    commit: StepCommit,
}

impl Prepared {
    /// What the write made, once its commit is in.
    fn written(self) -> Written {
        Written {
            version: self.commit.entry.step,
            state: self.commit.new_state,
            at: self.commit.entry.created_at,
        }
    }
}

/// Checks `write` against `task` as read: the version, no action waiting, the patch through
/// the state checks; and builds the step.
async fn prepare(
    store: &dyn Store,
    task: &TaskState,
    write: &StateWrite<'_>,
) -> Result<Prepared, StateWriteError> {
    if task.version != write.if_match {
        return Err(StateWriteError::Stale {
            task: task.id.clone(),
            expected: write.if_match,
            current: task.version,
        });
    }
    if let Some((step, what)) = pending_action(store, &task.id, task.version, task.status).await? {
        return Err(StateWriteError::Pending {
            task: task.id.clone(),
            step,
            what,
        });
    }
    let outcome = match write.checked.and_then(|check| check.take_for(task)) {
        Some(outcome) => outcome,
        None => {
            let schema = compiled_schema(task)?;
            validate_patch(
                &schema,
                task.state_tokens,
                &task.state,
                write.patch,
                &schema.whole_view(),
            )
        }
    };
    let accepted = outcome.map_err(|rejections| StateWriteError::Rejected { rejections })?;
    let commit = authored_step(
        task.version + 1,
        AuthoredStep {
            output: write.patch.to_string(),
            patch: accepted.patch.to_value(),
            state_hash: accepted.state_hash.clone(),
            new_state: accepted.new_state,
            author: write.author,
            note: CHANGED_NOTE,
        },
    );
    Ok(Prepared { commit })
}

/// The step of a task's action that is still in flight or waits for a human, with what it
/// waits for; `None` when no action is pending at `version`. A pending intent at the current
/// step appears only with a step (a new version), so a commit's version check covers one
/// appearing after this read.
pub(crate) async fn pending_action(
    store: &dyn Store,
    task: &str,
    version: u64,
    status: skillstate_store::TaskStatus,
) -> Result<Option<(u64, &'static str)>, StoreError> {
    let pending = store.intent(task, version).await?.filter(|i| !i.done);
    Ok(pending.map(|intent| {
        let what = match status {
            skillstate_store::TaskStatus::AwaitingApproval => "waiting for approval",
            skillstate_store::TaskStatus::AwaitingInput => "waiting for a reply",
            _ => "in flight",
        };
        (intent.step, what)
    }))
}

/// A step someone other than the model writes (a state write, an upgrade): what it records.
pub(crate) struct AuthoredStep<'a> {
    /// The journal row's output: what was asked for, as text.
    pub(crate) output: String,
    pub(crate) patch: Value,
    pub(crate) state_hash: String,
    pub(crate) new_state: Value,
    /// Who wrote it (an API key id, `operator`).
    pub(crate) author: &'a str,
    /// Added to the observation the task's next step would have read; it opens the step after
    /// this one.
    pub(crate) note: &'a str,
}

/// The commit of `written` as step `step`: an accepted journal row with its author and no
/// prompt, the observation the next model step would have read carried over to the step after
/// it with the note added (once) — by the store, inside the commit
/// (`NextObservation::Carried`).
pub(crate) fn authored_step(step: u64, written: AuthoredStep<'_>) -> StepCommit {
    StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: written.output,
            patch: Some(written.patch),
            action: None,
            errors: None,
            state_hash: Some(written.state_hash),
            prompt_tokens: 0,
            output_tokens: None,
            prompt_hash: String::new(),
            usage: None,
            latency_ms: 0,
            created_at: now_millis(),
            author: Some(written.author.to_owned()),
            board_version: None,
        },
        new_state: written.new_state,
        intent: None,
        status: None,
        previous_result: None,
        next_observation: Some(NextObservation::Carried {
            note: written.note.to_owned(),
        }),
        world: None,
        upgrade: None,
    }
}

/// Compiled state schemas: a task's schema is frozen when it is created, and the tasks of one
/// skill share it, so a write compiles none after the first.
///
/// Looked up first by the address of the task's schema value — the store hands out one shared
/// value per task while it keeps the task decoded (`TaskState::schema`), and each entry holds
/// its `Arc`, so an address in the map is never reused by another value — which spares a
/// write serialising the whole schema; else by the schema's JSON text, which finds the
/// compiled schema of another task of the same skill.
struct Schemas {
    by_address: HashMap<usize, (Arc<Value>, Arc<StateSchema>)>,
    by_text: HashMap<String, Arc<StateSchema>>,
}

static SCHEMAS: Mutex<Option<Schemas>> = Mutex::new(None);
/// Entries kept at most in each map; a full map starts over.
const SCHEMAS_KEPT: usize = 256;

fn compiled_schema(task: &TaskState) -> Result<Arc<StateSchema>, StateWriteError> {
    let address = Arc::as_ptr(&task.schema) as usize;
    let remember = |schema: &Arc<StateSchema>, key: Option<String>| {
        let mut schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
        let schemas = schemas.get_or_insert_with(|| Schemas {
            by_address: HashMap::new(),
            by_text: HashMap::new(),
        });
        if schemas.by_address.len() >= SCHEMAS_KEPT {
            schemas.by_address.clear();
        }
        schemas
            .by_address
            .insert(address, (task.schema.clone(), schema.clone()));
        if let Some(key) = key {
            if schemas.by_text.len() >= SCHEMAS_KEPT {
                schemas.by_text.clear();
            }
            schemas.by_text.insert(key, schema.clone());
        }
    };
    {
        let schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, schema)) = schemas
            .as_ref()
            .and_then(|schemas| schemas.by_address.get(&address))
        {
            return Ok(schema.clone());
        }
    }
    let key = task.schema.to_string();
    let known = SCHEMAS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|schemas| schemas.by_text.get(&key).cloned());
    if let Some(schema) = known {
        remember(&schema, None);
        return Ok(schema);
    }
    let schema = StateSchema::compile(Value::clone(&task.schema)).map_err(|defect| {
        StateWriteError::StoredTask {
            task: task.id.clone(),
            message: format!(
                "stored state schema is invalid at {}: {}",
                skillstate_core::json::pointer_for_humans(&defect.pointer, "schema"),
                defect.message
            ),
        }
    })?;
    let schema = Arc::new(schema);
    remember(&schema, Some(key));
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(schema: Arc<Value>) -> TaskState {
        TaskState {
            id: "t".into(),
            tenant: None,
            status: skillstate_store::TaskStatus::Running,
            version: 0,
            state: json!({}),
            schema,
            state_tokens: 1000,
        }
    }

    #[test]
    fn each_task_is_checked_against_its_own_schema_whichever_way_it_is_found() {
        let numbers = Arc::new(json!({"type": "object", "properties": {"a": {"type": "integer"}}}));
        let words = Arc::new(json!({"type": "object", "properties": {"a": {"type": "string"}}}));
        let first = compiled_schema(&task(numbers.clone())).unwrap();
        // The same shared value: found by its address.
        let again = compiled_schema(&task(numbers.clone())).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        // An equal value elsewhere (another task of the skill): found by its text.
        let equal = compiled_schema(&task(Arc::new(Value::clone(&numbers)))).unwrap();
        assert!(Arc::ptr_eq(&first, &equal));
        // Another schema is never answered from the first one's entries.
        let other = compiled_schema(&task(words)).unwrap();
        assert!(other.is_valid(&json!({"a": "x"})) && !other.is_valid(&json!({"a": 1})));
        assert!(first.is_valid(&json!({"a": 1})) && !first.is_valid(&json!({"a": "x"})));
    }
}
