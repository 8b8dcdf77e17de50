//! For operators: liveness and readiness. No key needed. (The OpenAPI document, which names
//! every route, is served by `crate::openapi`.)

use std::time::Duration;

use axum::extract::State;

use crate::context::AppState;
use crate::problem::{ApiError, Problem};
use crate::views::Health;

/// How long readiness waits for the store.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    summary = "Liveness",
    tag = "operations",
    responses((status = 200, description = "The process is up", body = Health))
)]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".into(),
    })
}

/// Whether the service can serve requests: the store answers a query within 2 s.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    summary = "Readiness",
    tag = "operations",
    responses(
        (status = 200, description = "The store is reachable", body = Health),
        (status = 503, description = "The store is not reachable", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Health>, ApiError> {
    // A lookup by a hash no key has: one indexed read that touches no tenant's data.
    let probe = state.store.key_by_hash("readyz");
    match tokio::time::timeout(READY_TIMEOUT, probe).await {
        Ok(Ok(_)) => Ok(axum::Json(Health {
            status: "ok".into(),
        })),
        Ok(Err(error)) => {
            tracing::warn!(%error, "readiness: the store failed");
            Err(ApiError::Unavailable {
                detail: "the store is not reachable; see the server's log".into(),
            })
        }
        Err(_) => Err(ApiError::Unavailable {
            detail: format!(
                "the store did not answer within {} s",
                READY_TIMEOUT.as_secs()
            ),
        }),
    }
}
