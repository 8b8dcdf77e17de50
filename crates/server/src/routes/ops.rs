//! For operators and tools: liveness, readiness, and the OpenAPI document. No key needed.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::app::AppState;
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

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    summary = "The OpenAPI document",
    tag = "operations",
    responses((status = 200, description = "This API's OpenAPI 3.1 document", body = Object))
)]
pub async fn openapi(State(state): State<AppState>) -> Response {
    let mut response = state.openapi.to_string().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
