//! CPU-heavy work a request triggers (building a task: loading and compiling the skill's
//! schema, checking an initial state, setting up an environment; rebuilding a world for a
//! fork; compiling a board's schema) runs here, never on the async workers that answer other
//! requests and `/healthz`.
//!
//! Each piece of work gets a thread of its own, out of a bounded number of permits, and the
//! request waits for it at most the server's work deadline: then it answers 503 problem+json
//! and abandons the work (the thread keeps its permit until it ends, so runaway work cannot
//! pile up beyond the bound). The threads are never joined: a shutdown does not wait on them,
//! and the process exits without them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};

use crate::problem::ApiError;

/// The pool's bound and deadline (shared by clones of the server's state).
#[derive(Debug, Clone)]
pub(crate) struct Offload {
    permits: Arc<Semaphore>,
    deadline: Duration,
}

impl Offload {
    pub(crate) fn new(threads: usize, deadline: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(threads.max(1))),
            deadline,
        }
    }

    /// Runs `work` to completion on a thread of the pool (driving its awaits with the current
    /// runtime), or answers 503 once the deadline passes: waiting for a free thread counts.
    /// `what` names the work in the problem ("preparing the task").
    pub(crate) async fn run<T, F>(&self, what: &str, work: F) -> Result<T, ApiError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.deadline;
        let late = || ApiError::Unavailable {
            detail: format!(
                "{what} took longer than {} s, so the server stopped waiting for it; nothing was created. Ask for less (a shorter horizon, a smaller state) or retry later",
                self.deadline.as_secs()
            ),
        };
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| late())?
            .map_err(|_| late())?;
        let handle = tokio::runtime::Handle::current();
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("skillstate-work".into())
            .spawn(move || {
                let _permit = permit;
                let output = handle.block_on(work);
                let _ = done_tx.send(output);
            })
            .map_err(|error| ApiError::Unavailable {
                detail: format!(
                    "{what}: the server cannot start a thread now ({error}); retry later"
                ),
            })?;
        match tokio::time::timeout_at(deadline, done_rx).await {
            Ok(Ok(output)) => Ok(output),
            // The thread ended without answering: it panicked.
            Ok(Err(_)) => Err(ApiError::Internal(format!("{what} failed unexpectedly"))),
            Err(_) => Err(late()),
        }
    }
}
