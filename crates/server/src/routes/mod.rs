//! The handlers, one module per resource (boards.rs: shared boards), and what they share:
//! finding a task the caller's tenant owns, and holding a task still while it is changed from outside a runner.

pub mod batches;
pub mod board_events;
pub mod board_upgrade;
pub mod boards;
pub mod events;
pub mod inbox;
pub mod journal;
pub mod ops;
pub mod provenance;
pub mod recall;
pub mod state;
pub mod tasks;
pub mod upgrade;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use skillstate_store::{LeaseClaim, StoreError, TaskRecord};
use tracing::Instrument;

use crate::auth::Caller;
use crate::context::{AppState, is_task_id};
use crate::problem::ApiError;

/// The id of `POST /v1/{kind}s/{id}:upgrade` (the one custom method of tasks and boards), from
/// the path parameter that holds both (the router cannot end a parameter with a suffix).
/// Another method is a 404 naming the one there is; no method at all is a 405 (`allow`: the
/// methods the plain path takes).
pub(crate) fn upgrade_target_id<'a>(
    param: &'a str,
    kind: &str,
    allow: &'static str,
) -> Result<&'a str, Box<axum::response::Response>> {
    use axum::response::IntoResponse;
    match param.rsplit_once(':') {
        Some((id, "upgrade")) => Ok(id),
        Some((_, method)) => Err(Box::new(
            ApiError::not_found(format!(
                "{kind}s have no method `{method}`; POST /v1/{kind}s/{{id}}:upgrade is the one there is"
            ))
            .into_response(),
        )),
        None => Err(Box::new(
            (
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                [(axum::http::header::ALLOW, allow)],
            )
                .into_response(),
        )),
    }
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
    if task.id != id || !caller.sees(task.tenant.as_deref()) {
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

/// How long the server's hold on a task's lease lasts unless given back. [`Hold::run`] gives it
/// back as soon as the change is made, whatever becomes of the request, so this bounds only a
/// server that dies in between.
const HOLD_TTL: Duration = Duration::from_secs(10);

/// The server holding a task's execution lease for one change made outside any runner (cancel,
/// delete), so that no runner (a worker, `skillstate run`) is in the middle of the task
/// meanwhile. It is taken and given back only by [`Hold::run`].
pub(crate) struct Hold;

impl Hold {
    /// Takes `task`'s lease, runs `change` (given the state and the task's id), and gives the
    /// lease back: the whole sequence in a tokio task of its own that the request awaits. A
    /// request cut off meanwhile (its client gone, its timeout reached), whose future is then
    /// dropped, drops only that wait: the change runs to its end and the lease is free at once,
    /// not after [`HOLD_TTL`] (which would keep workers and other writers off the task until
    /// then).
    ///
    /// 409 with `Retry-After` while a runner holds the lease. A panic in `change` gives the
    /// lease back too, then goes on in the request (a 500).
    pub(crate) async fn run<T, F, Fut>(
        state: &AppState,
        caller: &Caller,
        task: &str,
        change: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(AppState, String) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        let claim = LeaseClaim {
            token: uuid::Uuid::now_v7().to_string(),
            holder: format!("skillstate server (API key {})", caller.key_id),
            // Not a process identity: nobody takes this lease over early; it is given back
            // when the change is made, or expires after HOLD_TTL.
            process: format!("server {}", std::process::id()),
        };
        let state = state.clone();
        let task = task.to_owned();
        let held = tokio::spawn(
            async move {
                // Atomic on every backend: NotFound means the task is gone.
                state
                    .store
                    .acquire_lease(&task, &claim, HOLD_TTL.as_millis() as u64, None)
                    .await?;
                let made = AssertUnwindSafe(async { change(state.clone(), task.clone()).await })
                    .catch_unwind()
                    .await;
                // After a delete there is nothing left to release; that is no error.
                if let Err(error) = state.store.release_lease(&task, &claim.token).await {
                    tracing::warn!(%task, %error, "could not release the server's hold on a task; it expires on its own");
                }
                match made {
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            .instrument(tracing::Span::current()),
        );
        match held.await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(ApiError::Internal(format!(
                "the change under the task's lease did not finish: {error}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use serde_json::{Value, json};
    use skillstate_core::{ContextStrategy, SkillDefinition};
    use skillstate_store::{NewTask, SqliteStore, Store, Synchronous, TaskStatus};
    use tokio::sync::Notify;

    use super::*;
    use crate::factory::TaskFactory;
    use crate::policy::ResolvedRequest;

    struct NoFactory;

    #[async_trait::async_trait]
    impl TaskFactory for NoFactory {
        async fn prepare(&self, _: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
            Err(ApiError::Internal("no tasks here".into()))
        }
    }

    /// A store on a SQLite file with one task, the service over it, and a caller.
    async fn setup() -> (tempfile::TempDir, AppState, Caller, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hold.db");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(path.to_str().unwrap(), Synchronous::Normal)
                .await
                .unwrap(),
        );
        let task = NewTask {
            skill: SkillDefinition {
                name: "free".into(),
                description: "free-form state".into(),
                metadata: None,
                procedure: "anything".into(),
                schema: json!({"type": "object"}),
                initial_state: json!({}),
                settings: Default::default(),
                migrations: Vec::new(),
            },
            tools: Vec::new(),
            context: ContextStrategy::State,
            context_budget: None,
            model: "scripted:test".into(),
            environment: None,
            env_checkpoint: None,
            opening_observation: "start".into(),
        };
        let id = store.create_task(task, &json!({})).await.unwrap().id;
        let caller = Caller {
            tenant: "acme".into(),
            key_id: "key-1".into(),
            scope: None,
            whole_database: false,
        };
        (dir, AppState::new(store, Arc::new(NoFactory)), caller, id)
    }

    async fn wait_until_free(store: &dyn Store, id: &str) {
        let started = Instant::now();
        while store.lease(id).await.unwrap().is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "the hold outlived its request"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_dropped_request_leaves_its_change_to_finish_and_free_the_lease() {
        let (_dir, state, caller, id) = setup().await;
        let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let request = Hold::run(&state, &caller, &id, {
            let (entered, go) = (entered.clone(), go.clone());
            |state, id| async move {
                entered.notify_one();
                go.notified().await;
                Ok(state
                    .store
                    .set_status(&id, TaskStatus::Failed, None)
                    .await?)
            }
        });
        // The request is dropped while its change runs under the lease.
        tokio::select! {
            _ = request => panic!("the change cannot end before it may go on"),
            _ = entered.notified() => {}
        }
        assert!(state.store.lease(&id).await.unwrap().is_some());
        go.notify_one();
        wait_until_free(state.store.as_ref(), &id).await;
        assert_eq!(
            state.store.task(&id).await.unwrap().status,
            TaskStatus::Failed
        );
    }

    #[tokio::test]
    async fn a_panicking_change_frees_the_lease_and_panics_in_the_request() {
        let (_dir, state, caller, id) = setup().await;
        let request = tokio::spawn({
            let state = state.clone();
            let id = id.clone();
            async move {
                Hold::run(&state, &caller, &id, |_, _| async move {
                    if true {
                        panic!("the change broke");
                    }
                    Ok(())
                })
                .await
            }
        });
        let error = request.await.unwrap_err();
        assert!(error.is_panic());
        assert_eq!(state.store.lease(&id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_task_a_runner_holds_is_a_conflict_and_nothing_runs() {
        let (_dir, state, caller, id) = setup().await;
        let runner = LeaseClaim {
            token: "runner".into(),
            holder: "worker 1".into(),
            process: "elsewhere".into(),
        };
        state
            .store
            .acquire_lease(&id, &runner, 60_000, None)
            .await
            .unwrap();
        let refused = Hold::run(&state, &caller, &id, |_, _| async move {
            panic!("the change ran under someone else's lease")
        })
        .await;
        assert!(
            matches!(
                refused,
                Err::<(), _>(ApiError::Conflict {
                    retry_after: Some(_),
                    ..
                })
            ),
            "{refused:?}"
        );
        assert_eq!(
            state.store.lease(&id).await.unwrap().map(|l| l.token),
            Some("runner".to_owned())
        );
    }
}
