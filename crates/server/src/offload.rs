//! CPU-heavy work a request triggers (building a task: loading and compiling the skill's
//! schema, checking an initial state, setting up an environment; checking a state patch;
//! rebuilding a world for a fork; compiling a board's schema) runs here, never on the async
//! workers that answer other requests and `/healthz`.
//!
//! The work runs on a fixed set of threads of this server's own (`threads` of them, started on
//! first use and kept: a state PATCH offloads its check, and starting a thread for each one cost
//! more than the check), taking pieces in the order they came. The request waits for its piece
//! at most the server's work deadline, the wait for a free thread included: then it answers 503
//! problem+json and abandons the work. A piece abandoned before a thread took it never runs; one
//! abandoned while running keeps its thread until it ends, so runaway work cannot occupy more
//! than the threads there are. A panicking piece answers 500 and leaves its thread serving. The
//! threads end when the server's state is dropped; a shutdown does not wait on them.

use std::future::Future;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::problem::ApiError;

type Job = Box<dyn FnOnce() + Send>;

/// The threads and deadline (shared by clones of the server's state).
#[derive(Debug, Clone)]
pub(crate) struct Offload {
    pool: Arc<Pool>,
    deadline: Duration,
}

struct Pool {
    /// Most threads.
    threads: usize,
    jobs: Sender<Job>,
    /// Shared by the threads: the next free one takes the next piece.
    queue: Arc<Mutex<Receiver<Job>>>,
    /// Threads started so far.
    started: Mutex<usize>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl Offload {
    pub(crate) fn new(threads: usize, deadline: Duration) -> Self {
        let (sender, receiver) = channel::<Job>();
        Self {
            pool: Arc::new(Pool {
                threads: threads.max(1),
                jobs: sender,
                queue: Arc::new(Mutex::new(receiver)),
                started: Mutex::new(0),
            }),
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
        let handle = tokio::runtime::Handle::current();
        let (done_tx, done_rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // Abandoned while it waited for a thread: nobody wants the answer.
            if done_tx.is_closed() {
                return;
            }
            let output = handle.block_on(work);
            let _ = done_tx.send(output);
        });
        self.pool
            .submit(job)
            .map_err(|error| ApiError::Unavailable {
                detail: format!(
                    "{what}: the server cannot start a thread now ({error}); retry later"
                ),
            })?;
        match tokio::time::timeout_at(deadline, done_rx).await {
            Ok(Ok(output)) => Ok(output),
            // The piece ended without answering: it panicked.
            Ok(Err(_)) => Err(ApiError::Internal(format!("{what} failed unexpectedly"))),
            Err(_) => Err(late()),
        }
    }
}

impl Pool {
    /// Queues `job`, starting another thread while fewer than `threads` run.
    fn submit(&self, job: Job) -> std::io::Result<()> {
        {
            let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
            if *started < self.threads {
                let receiver = self.queue.clone();
                let spawned = std::thread::Builder::new()
                    .name("skillstate-work".into())
                    .spawn(move || serve(&receiver));
                match spawned {
                    Ok(_) => *started += 1,
                    // Threads already running take the work; with none, the caller hears why.
                    Err(error) if *started == 0 => return Err(error),
                    Err(_) => {}
                }
            }
        }
        self.jobs
            .send(job)
            .map_err(|_| std::io::Error::other("the work threads stopped"))
    }
}

/// One thread of the pool: takes pieces until every sender is gone.
fn serve(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let receiver = receiver.lock().unwrap_or_else(|e| e.into_inner());
            receiver.recv()
        };
        let Ok(job) = job else { return };
        // A panic drops the piece's answer channel (its request answers 500); the thread goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    /// Blocks its thread for `ms`, as CPU-heavy work does.
    fn busy(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_pieces_run_at_once_than_there_are_threads_and_every_one_answers() {
        let offload = Offload::new(2, Duration::from_secs(10));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let pieces = (0..6).map(|n| {
            let (offload, running, most) = (offload.clone(), running.clone(), most.clone());
            async move {
                offload
                    .run("a piece", async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // Each piece waits (at most 5 s) until two run, so a pool that ran
                        // them one at a time fails here however fast the machine is.
                        let until = std::time::Instant::now() + Duration::from_secs(5);
                        while most.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < until {
                            busy(1);
                        }
                        running.fetch_sub(1, Ordering::SeqCst);
                        n * 10
                    })
                    .await
            }
        });
        let answers: Vec<usize> = futures_util::future::join_all(pieces)
            .await
            .into_iter()
            .map(|answer| answer.expect("every piece answers"))
            .collect();
        assert_eq!(answers, vec![0, 10, 20, 30, 40, 50]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_piece_abandoned_while_waiting_for_a_thread_never_runs() {
        let offload = Offload::new(1, Duration::from_millis(100));
        let first = offload.run("the first piece", async { busy(400) });
        let ran = Arc::new(AtomicBool::new(false));
        let second = {
            let ran = ran.clone();
            offload.run("the second piece", async move {
                ran.store(true, Ordering::SeqCst)
            })
        };
        let (first, second) = tokio::join!(first, second);
        for late in [first.map(|_| ()), second] {
            match late {
                Err(ApiError::Unavailable { detail }) => {
                    assert!(detail.contains("took longer than"), "{detail}")
                }
                other => panic!("expected a 503, got {other:?}"),
            }
        }
        // The first piece ends on its thread; the second, abandoned in the queue, is skipped.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!ran.load(Ordering::SeqCst));
        // And the thread serves the next one.
        let offload = Offload {
            deadline: Duration::from_secs(10),
            ..offload
        };
        assert_eq!(
            offload.run("the third piece", async { 3 }).await.ok(),
            Some(3)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_piece_answers_500_and_its_thread_goes_on() {
        let offload = Offload::new(1, Duration::from_secs(10));
        let panicked = offload
            .run("a panicking piece", async {
                if busy_and_true() {
                    panic!("inside the piece");
                }
            })
            .await;
        assert!(
            matches!(panicked, Err(ApiError::Internal(_))),
            "{panicked:?}"
        );
        assert_eq!(
            offload.run("the next piece", async { 7 }).await.ok(),
            Some(7)
        );
    }

    fn busy_and_true() -> bool {
        busy(1);
        true
    }
}
