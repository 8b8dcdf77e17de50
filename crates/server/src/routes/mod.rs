//! The handlers, one module per resource, and what they share: finding a task the caller's
//! tenant owns, and holding a task still while it is changed from outside a runner.

pub mod events;
pub mod inbox;
pub mod journal;
pub mod ops;
pub mod state;
pub mod tasks;

use std::time::Duration;

use skillstate_store::{LeaseClaim, StoreError, TaskRecord};

use crate::app::AppState;
use crate::auth::Caller;
use crate::problem::ApiError;

/// Whether `id` is a task id as the store makes them: a lower-case hyphenated UUID. Anything
/// else is never passed to the store, whose lookups also accept id prefixes.
pub(crate) fn is_task_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|uuid| uuid.hyphenated().to_string() == id)
}

/// The task `id` if the caller's tenant owns it; a missing task, a malformed id and another
/// tenant's task (or one created outside the service) are the same 404.
pub(crate) async fn owned_task(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<TaskRecord, ApiError> {
    if !is_task_id(id) {
        return Err(ApiError::no_task(id));
    }
    let task = match state.store.task(id).await {
        Ok(task) => task,
        Err(StoreError::NotFound(_) | StoreError::Ambiguous { .. }) => {
            return Err(ApiError::no_task(id));
        }
        Err(other) => return Err(other.into()),
    };
    if task.id != id || task.tenant.as_deref() != Some(caller.tenant.as_str()) {
        return Err(ApiError::no_task(id));
    }
    Ok(task)
}

/// A step number from the path.
pub(crate) fn parse_step(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "`{text}` is not a step number; steps are counted from 1 (0 is the initial state)"
        ))
    })
}

/// How long the server keeps trying to take a task's lease while the store reports the task
/// missing although it exists. Taking a lease is an UPDATE followed by a read of the lease;
/// when the UPDATE loses to a holder that releases the lease before the read, the read finds
/// no lease and the store answers `NotFound`. Nothing was written, so trying again is safe;
/// [`lost_lease_race`] tells this apart from a task that is really gone.
pub(crate) const LEASE_RACE_WAIT: Duration = Duration::from_secs(5);

/// Whether a `NotFound` from taking `task`'s lease was the race of [`LEASE_RACE_WAIT`] (the
/// task exists) and the deadline allows another try, after a short pause.
pub(crate) async fn lost_lease_race(
    state: &AppState,
    task: &str,
    deadline: tokio::time::Instant,
) -> bool {
    if tokio::time::Instant::now() >= deadline {
        return false;
    }
    match state.store.task(task).await {
        Ok(found) if found.id == task => {
            tokio::time::sleep(Duration::from_millis(2)).await;
            true
        }
        _ => false,
    }
}

/// How long the server holds a task's lease while it changes the task (cancel, delete); it
/// releases it at once, so this bounds only a server that dies in between.
const HOLD_TTL: Duration = Duration::from_secs(10);

/// The task's execution lease, held by the server for one change made outside any runner, so
/// no runner (a worker, `skillstate run`) is in the middle of the task meanwhile.
pub(crate) struct Hold {
    task: String,
    token: String,
}

impl Hold {
    /// Takes `task`'s lease; 409 with `Retry-After` while a runner holds it.
    pub(crate) async fn take(
        state: &AppState,
        caller: &Caller,
        task: &str,
    ) -> Result<Self, ApiError> {
        let claim = LeaseClaim {
            token: uuid::Uuid::now_v7().to_string(),
            holder: format!("skillstate server (API key {})", caller.key_id),
            // Not a process identity: nobody takes this lease over early; it is released
            // within the request or expires after HOLD_TTL.
            process: format!("server {}", std::process::id()),
        };
        let ttl_ms = HOLD_TTL.as_millis() as u64;
        let deadline = tokio::time::Instant::now() + LEASE_RACE_WAIT;
        loop {
            match state.store.acquire_lease(task, &claim, ttl_ms, None).await {
                Ok(_) => break,
                Err(StoreError::NotFound(_)) if lost_lease_race(state, task, deadline).await => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(Self {
            task: task.to_owned(),
            token: claim.token,
        })
    }

    /// Gives the lease back. A failure is logged: the lease then expires on its own.
    pub(crate) async fn release(self, state: &AppState) {
        if let Err(error) = state.store.release_lease(&self.task, &self.token).await {
            tracing::warn!(task = %self.task, %error, "could not release the server's hold on a task; it expires on its own");
        }
    }
}
