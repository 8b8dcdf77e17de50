//! Idle workers wake on events (`Queue::work_signal`): one connection per store LISTENs on
//! `skillstate_work:<schema>`, which the triggers of schema 17 notify when work may have become
//! claimable, and bumps a counter every waiter watches. A notification carries nothing to
//! trust: a waiter that wakes claims, which reads the rows. When the listening connection is
//! lost, notifications sent meanwhile are lost with it, so a reconnect counts as one (waiters
//! look again); through a transaction pooler, which cannot hold a LISTEN, there is no signal and
//! workers poll.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::watch;

use super::PostgresStore;
use crate::Result;

/// How often the listening task checks that its store still exists when nothing arrives.
const ALIVE_CHECK: Duration = Duration::from_secs(30);
/// The pause after a failed reconnect before the next attempt.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// The store's work signal, started by the first worker that asks.
pub(super) type Signal = Arc<tokio::sync::OnceCell<Arc<watch::Sender<u64>>>>;

impl PostgresStore {
    pub(super) async fn work_signal_rx(&self) -> Result<Option<watch::Receiver<u64>>> {
        if self.pool.transaction_pooler() {
            return Ok(None);
        }
        let sender = self
            .wake
            .get_or_try_init(|| async {
                let pool = self.pool.pool().clone();
                let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
                    .fetch_one(&pool)
                    .await?;
                let mut listener = PgListener::connect_with(&pool).await?;
                listener
                    .listen(&format!("skillstate_work:{schema}"))
                    .await?;
                let (sender, _) = watch::channel(0u64);
                let sender = Arc::new(sender);
                tokio::spawn(listen(listener, Arc::downgrade(&sender)));
                Ok::<_, crate::StoreError>(sender)
            })
            .await?;
        Ok(Some(sender.subscribe()))
    }
}

/// Bumps the counter on every notification (and on every reconnect) until the store is gone.
async fn listen(mut listener: PgListener, signal: Weak<watch::Sender<u64>>) {
    loop {
        let received = tokio::time::timeout(ALIVE_CHECK, listener.try_recv()).await;
        let Some(sender) = signal.upgrade() else {
            return;
        };
        match received {
            // Nothing arrived: the store is still there, so wait again.
            Err(_elapsed) => continue,
            Ok(Ok(Some(_))) => {}
            // The connection was lost and opened again (listening again): what was sent
            // meanwhile is lost, so waiters look for themselves.
            Ok(Ok(None)) => tracing::debug!("the work listener reconnected"),
            // Reconnecting failed: waiters poll meanwhile (their fallback), and look again
            // after the pause, when the next attempt is made.
            Ok(Err(error)) => {
                tracing::warn!(%error, "the work listener lost its connection; workers poll until it is back");
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
        sender.send_modify(|n| *n = n.wrapping_add(1));
    }
}
