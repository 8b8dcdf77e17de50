//! `skillstate batch stop` and `skillstate batch reopen`: stop a batch by hand (workers claim
//! none of its queued tasks; running ones go on) and open it again without requeueing anything.

use std::process::ExitCode;

use anyhow::Result;
use skillstate_store::prelude::*;
use skillstate_store::{BatchState, QueueState};

use super::db_flag;

/// The stop reason `batch stop` records when `--reason` is not given.
pub const DEFAULT_REASON: &str = "stopped by hand with skillstate batch stop";

/// Queued tasks of a batch: `(waiting, running)`, running being those under a live lease.
async fn queued(store: &dyn Store, batch: &str) -> Result<(u64, u64)> {
    let tasks = store.batch_tasks(batch).await?;
    let mut waiting = 0;
    let mut running = 0;
    for task in tasks.iter().filter(|t| t.queue == Some(QueueState::Queued)) {
        if task.leased {
            running += 1;
        } else {
            waiting += 1;
        }
    }
    Ok((waiting, running))
}

/// Stops the batch `id_or_prefix` names with `reason` (a stopped batch keeps its first reason).
pub async fn stop(
    store: &dyn Store,
    location: &str,
    id_or_prefix: &str,
    reason: Option<&str>,
) -> Result<ExitCode> {
    let reason = match reason.map(str::trim) {
        Some("") => anyhow::bail!(
            "--reason is empty; give a few words saying why the batch stops, or leave --reason out"
        ),
        Some(reason) => reason,
        None => DEFAULT_REASON,
    };
    let batch = store.batch(id_or_prefix).await?;
    let already = batch.state == BatchState::Stopped;
    store.stop_batch(&batch.id, reason).await?;
    let batch = store.batch(&batch.id).await?;
    let (waiting, running) = queued(store, &batch.id).await?;
    let shown_reason = batch.stop_reason.as_deref().unwrap_or(reason);
    let what = if already {
        format!("batch {} was already stopped ({shown_reason})", batch.id)
    } else {
        format!("batch {} stopped ({shown_reason})", batch.id)
    };
    outln!(
        "{what}: {waiting} task(s) stay queued and no worker claims them, {running} running task(s) finish; continue with: skillstate{} batch reopen {}",
        db_flag(location),
        batch.id
    );
    Ok(ExitCode::SUCCESS)
}

/// Opens the batch `id_or_prefix` names again; nothing is requeued.
pub async fn reopen(store: &dyn Store, location: &str, id_or_prefix: &str) -> Result<ExitCode> {
    let batch = store.batch(id_or_prefix).await?;
    let was = batch.state;
    let batch = store.reopen_batch(&batch.id).await?;
    let (waiting, _running) = queued(store, &batch.id).await?;
    let what = match was {
        BatchState::Stopped => format!("batch {} reopened", batch.id),
        BatchState::Open => format!("batch {} was already open", batch.id),
    };
    outln!(
        "{what}: {waiting} queued task(s) can be claimed; run them with: skillstate{0} worker --batch {1}   (or skillstate{0} batch resume {1})",
        db_flag(location),
        batch.id
    );
    Ok(ExitCode::SUCCESS)
}
