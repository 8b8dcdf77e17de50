//! Shared rate windows on SQLite: each call is one `BEGIN IMMEDIATE` transaction, which holds
//! the database's write lock from its first statement, so every caller of every process reads
//! and writes a window in turn.

use super::SqliteStore;
use crate::queue::{RateDecision, RateLimit};
use crate::queue_rows::{RATE_WINDOW_MS, RateEntry, rate_decision};
use crate::{Result, now_millis};

pub(super) async fn acquire(
    store: &SqliteStore,
    scope: &str,
    limit: &RateLimit,
    tokens: u64,
) -> Result<RateDecision> {
    let now = now_millis();
    let tokens = tokens.min(i64::MAX as u64);
    let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query("DELETE FROM rate_events WHERE scope = ? AND at <= ?")
        .bind(scope)
        .bind(now - RATE_WINDOW_MS)
        .execute(&mut *tx)
        .await?;
    let window: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT at, requests, tokens FROM rate_events WHERE scope = ? ORDER BY at")
            .bind(scope)
            .fetch_all(&mut *tx)
            .await?;
    let window: Vec<RateEntry> = window
        .into_iter()
        .map(|(at, requests, tokens)| RateEntry {
            at,
            requests: requests.max(0) as u64,
            tokens: tokens.max(0) as u64,
        })
        .collect();
    let decision = rate_decision(limit, now, &window, tokens);
    if decision == RateDecision::Granted {
        sqlx::query("INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 1, ?)")
            .bind(scope)
            .bind(now)
            .bind(tokens as i64)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(decision)
}

pub(super) async fn add_tokens(store: &SqliteStore, scope: &str, tokens: u64) -> Result<()> {
    sqlx::query("INSERT INTO rate_events (scope, at, requests, tokens) VALUES (?, ?, 0, ?)")
        .bind(scope)
        .bind(now_millis())
        .bind(tokens.min(i64::MAX as u64) as i64)
        .execute(store.pool())
        .await?;
    Ok(())
}
