//! A task's current state, with its version as the ETag.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::owned_task;
use crate::app::AppState;
use crate::auth::Caller;
use crate::problem::{ApiError, Problem};

/// The ETag of a state at `version`: the version, quoted.
pub fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// Whether an `If-None-Match` / `If-Match` list names `etag` (or is `*`). Weak validators
/// (`W/"12"`) compare by their value.
pub(crate) fn matches_etag(header: &str, etag: &str) -> bool {
    header.split(',').map(str::trim).any(|candidate| {
        candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate) == etag
    })
}

/// Gets a task's current state.
///
/// The body is the state itself. `ETag` is its version (the number of accepted steps,
/// quoted); send it back as `If-Match` to write the state, or as `If-None-Match` to get a 304
/// while it is unchanged.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/state",
    operation_id = "getState",
    summary = "Get a task's state",
    tag = "state",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("If-None-Match" = Option<String>, Header, description = "An ETag from an earlier read: 304 while the state is still at that version")
    ),
    responses(
        (status = 200, description = "The state (a JSON object, as the skill's state schema describes it)", body = Object,
            headers(("ETag" = String, description = "The state's version, quoted: `\"12\"`"))),
        (status = 304, description = "Unchanged since the version named in If-None-Match",
            headers(("ETag" = String, description = "The state's version, quoted"))),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_state(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    let tag = etag(task.version);
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches_etag(v, &tag));
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        axum::Json::<Value>(task.state).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&tag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_match_lists_stars_and_weak_forms() {
        assert!(matches_etag("\"3\"", "\"3\""));
        assert!(matches_etag("\"1\", W/\"3\"", "\"3\""));
        assert!(matches_etag("*", "\"3\""));
        assert!(!matches_etag("\"31\"", "\"3\""));
        assert!(!matches_etag("3", "\"3\""));
    }
}
