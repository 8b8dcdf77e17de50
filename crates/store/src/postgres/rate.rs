//! Shared rate windows on PostgreSQL: every caller of a scope locks the scope's row (`SELECT …
//! FOR UPDATE`) before it reads and writes the window, so workers on many machines take turns
//! and together never exceed the quota. Times come from the server's clock.

use super::{NOW_MS, PostgresStore};
use crate::Result;
use crate::queue::{RateDecision, RateLimit};
use crate::queue_rows::{RATE_WINDOW_MS, RateEntry, rate_decision};

pub(super) async fn acquire(
    store: &PostgresStore,
    scope: &str,
    limit: &RateLimit,
    tokens: u64,
) -> Result<RateDecision> {
    let tokens = tokens.min(i64::MAX as u64);
    let mut tx = store.pool.begin().await?;
    sqlx::query("INSERT INTO rate_scopes (scope) VALUES ($1) ON CONFLICT (scope) DO NOTHING")
        .bind(scope)
        .execute(&mut *tx)
        .await?;
    // Taken after the lock, so the window read below is the one the previous holder left.
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {NOW_MS} FROM rate_scopes WHERE scope = $1 FOR UPDATE"
    )))
    .bind(scope)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM rate_events WHERE scope = $1 AND at <= $2")
        .bind(scope)
        .bind(now - RATE_WINDOW_MS)
        .execute(&mut *tx)
        .await?;
    let window: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT at, requests, tokens FROM rate_events WHERE scope = $1 ORDER BY at")
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
        sqlx::query("INSERT INTO rate_events (scope, at, requests, tokens) VALUES ($1, $2, 1, $3)")
            .bind(scope)
            .bind(now)
            .bind(tokens as i64)
            .execute(&mut *tx)
            .await?;
    }
    super::db::commit(tx).await?;
    Ok(decision)
}

pub(super) async fn add_tokens(store: &PostgresStore, scope: &str, tokens: u64) -> Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO rate_events (scope, at, requests, tokens) VALUES ($1, {NOW_MS}, 0, $2)"
    )))
    .bind(scope)
    .bind(tokens.min(i64::MAX as u64) as i64)
    .execute(&store.pool)
    .await?;
    Ok(())
}
