//! A worker's drain signal: a flag the runner reads at step boundaries, and a notification
//! that anything waiting on the worker's behalf (a shared rate-limit slot) wakes on at once.
//! One value for both, so whoever is woken by the drain finds the flag already set.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Clone, Default)]
pub struct Drain {
    flag: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Drain {
    /// Starts the drain: the flag is set before anyone waiting is woken.
    pub fn start(&self) {
        if !self.flag.swap(true, Ordering::SeqCst) {
            self.notify.notify_waiters();
        }
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// The flag itself, for a runner's `with_stop`.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Returns once the drain has started (at once if it has).
    pub async fn started(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a drain starting in between still wakes us.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_when_the_drain_starts_and_a_late_one_returns_at_once() {
        let drain = Drain::default();
        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.started().await }
        });
        tokio::task::yield_now().await;
        assert!(!drain.is_set());
        drain.start();
        waiting.await.unwrap();
        drain.started().await;
        assert!(drain.flag().load(Ordering::SeqCst));
    }
}
