//! RFC 9457 problem details: every error response of the API is `application/problem+json`.
//!
//! Handlers fail with an [`ApiError`]; each variant has one status and one problem type
//! (`urn:skillstate:problem:<slug>`, stable for programs). Store and runtime errors are mapped
//! by kind, never by message: their texts are written for a terminal (they name commands, and
//! some name files or SQL), so the API writes its own detail. Internal errors answer 500 with a
//! generic detail; the real error goes to the log with tracing.
//!
//! [`finish_problems`] is the outermost middleware: it fills `instance` with the request's path
//! and turns every other error response (an unknown route, a wrong method, a body over the
//! limit, a timeout, a panic) into a problem too, so no error ever leaves as plain text.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use skillstate_core::Rejection;
use skillstate_runtime::RuntimeError;
use skillstate_store::{StoreError, time};
use utoipa::ToSchema;

use crate::config::ServerConfig;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem detail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// What kind of problem this is: `urn:skillstate:problem:<slug>`, stable for programs.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind, the same for every occurrence.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong this time, and what to do about it.
    pub detail: String,
    /// The request path the problem occurred at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// For validation failures: every error found, each with the JSON pointer it is about.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

/// One validation error: what kind, where (a JSON pointer into the request body, or into the
/// state the request would produce) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    /// `schema`, `read_only`, `state_budget`, `json`, `field`, ... (the validation stage).
    pub kind: String,
    /// RFC 6901 JSON pointer; empty for the whole document.
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    pub fn new(kind: &str, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            pointer: pointer.into(),
            message: message.into(),
        }
    }

    /// A rejection of the validation pipeline, its pointer put under `prefix` (`/state`, say,
    /// when the rejection points into a state given at that place of the request).
    pub fn from_rejection(rejection: &Rejection, prefix: &str) -> Self {
        Self::new(
            rejection.kind.as_str(),
            format!("{prefix}{}", rejection.pointer),
            rejection.message.clone(),
        )
    }

    /// The same error, at `prefix` + its pointer (an item of a batch: `/tasks/3`).
    pub fn under(mut self, prefix: &str) -> Self {
        self.pointer = format!("{prefix}{}", self.pointer);
        self
    }
}

/// Everything a handler can fail with; each variant is one status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401, with `WWW-Authenticate: Bearer`.
    #[error("unauthorized: {detail}")]
    Unauthorized { detail: String },
    /// 403: the API key may not do this (a key limited to board pointers, elsewhere).
    #[error("forbidden: {detail}")]
    Forbidden { detail: String },
    /// 404: no such resource, or one the caller's tenant does not own (the two are the same
    /// answer, so a tenant never learns what another has).
    #[error("not found: {detail}")]
    NotFound { detail: String },
    /// 400: the request cannot be read (malformed JSON, a bad parameter or header).
    #[error("bad request: {detail}")]
    BadRequest {
        detail: String,
        errors: Vec<FieldError>,
    },
    /// 400: the JSON body nests deeper than the server accepts.
    #[error("the JSON body nests deeper than {limit} levels")]
    TooDeep { limit: usize },
    /// 413: the body is larger than the server accepts.
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// 415: the body is not of a media type the route reads.
    #[error("unsupported media type: {detail}")]
    UnsupportedMediaType { detail: String },
    /// 422: the request is well-formed JSON but not acceptable; `errors` lists every problem
    /// with its pointer.
    #[error("invalid request: {detail}")]
    Invalid {
        detail: String,
        errors: Vec<FieldError>,
    },
    /// 409: the task's current situation does not allow this now (it is being run, it is
    /// finished, ...).
    #[error("conflict: {detail}")]
    Conflict {
        detail: String,
        /// Seconds after which a retry may succeed (`Retry-After`).
        retry_after: Option<u64>,
    },
    /// 412: a conditional write named a version that is no longer current.
    #[error("precondition failed: {detail}")]
    PreconditionFailed { detail: String },
    /// 412 with the pointers it is about: a board write whose rebase met others' changes.
    #[error("precondition failed: {detail}")]
    PreconditionFailedWith {
        detail: String,
        errors: Vec<FieldError>,
    },
    /// 428: a write that must be conditional came without `If-Match`.
    #[error("precondition required: {detail}")]
    PreconditionRequired { detail: String },
    /// 410: what was asked for existed but was compacted away.
    #[error("gone: {detail}")]
    Gone { detail: String },
    /// 503: the server cannot answer now (the store is unreachable, the request timed out).
    #[error("unavailable: {detail}")]
    Unavailable { detail: String },
    /// 500. The message is logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The detail every 500 carries: nothing about the server's insides.
const INTERNAL_DETAIL: &str = "the server failed to handle this request; it was logged. Retry later, and report it if it persists";

impl ApiError {
    pub fn not_found(detail: impl Into<String>) -> Self {
        ApiError::NotFound {
            detail: detail.into(),
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::BadRequest {
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    pub fn invalid(detail: impl Into<String>, errors: Vec<FieldError>) -> Self {
        ApiError::Invalid {
            detail: detail.into(),
            errors,
        }
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        ApiError::Conflict {
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The 404 for a task id: missing, not a task id, or another tenant's.
    pub fn no_task(id: &str) -> Self {
        ApiError::not_found(format!(
            "no task `{id}` exists for this API key's tenant; list them with GET /v1/tasks"
        ))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::BadRequest { .. } | ApiError::TooDeep { .. } => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::PreconditionFailed { .. } | ApiError::PreconditionFailedWith { .. } => {
                StatusCode::PRECONDITION_FAILED
            }
            ApiError::PreconditionRequired { .. } => StatusCode::PRECONDITION_REQUIRED,
            ApiError::Gone { .. } => StatusCode::GONE,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The problem this error is answered with (without `instance`, which the middleware
    /// adds).
    pub fn problem(&self) -> Problem {
        let (slug, title) = match self {
            ApiError::Unauthorized { .. } => {
                ("unauthorized", "Missing, unknown or revoked API key")
            }
            ApiError::Forbidden { .. } => ("forbidden", "Not allowed for this API key"),
            ApiError::NotFound { .. } => ("not-found", "Not found"),
            ApiError::BadRequest { .. } => ("bad-request", "The request cannot be read"),
            ApiError::TooDeep { .. } => ("json-too-deep", "JSON nested too deeply"),
            ApiError::TooLarge { .. } => ("body-too-large", "Request body too large"),
            ApiError::UnsupportedMediaType { .. } => {
                ("unsupported-media-type", "Unsupported media type")
            }
            ApiError::Invalid { .. } => ("validation-failed", "The request is not valid"),
            ApiError::Conflict { .. } => ("conflict", "Conflicts with the task's current status"),
            ApiError::PreconditionFailed { .. } => ("stale-version", "The version is not current"),
            ApiError::PreconditionFailedWith { .. } => (
                "board-conflict",
                "Others changed what the patch touches since its version",
            ),
            ApiError::PreconditionRequired { .. } => {
                ("precondition-required", "If-Match is required")
            }
            ApiError::Gone { .. } => ("compacted", "No longer kept"),
            ApiError::Unavailable { .. } => ("unavailable", "Service unavailable"),
            ApiError::Internal(_) => ("internal", "Internal server error"),
        };
        let detail = match self {
            ApiError::Unauthorized { detail }
            | ApiError::Forbidden { detail }
            | ApiError::PreconditionFailedWith { detail, .. }
            | ApiError::NotFound { detail }
            | ApiError::BadRequest { detail, .. }
            | ApiError::UnsupportedMediaType { detail }
            | ApiError::Invalid { detail, .. }
            | ApiError::Conflict { detail, .. }
            | ApiError::PreconditionFailed { detail }
            | ApiError::PreconditionRequired { detail }
            | ApiError::Gone { detail }
            | ApiError::Unavailable { detail } => detail.clone(),
            ApiError::TooDeep { limit } => format!(
                "the JSON body nests arrays and objects deeper than {limit} levels, the most this server reads; send a flatter document"
            ),
            ApiError::TooLarge { limit } => format!(
                "the request body is larger than {limit} bytes, the most this server reads; send less per request (split a batch)"
            ),
            ApiError::Internal(_) => INTERNAL_DETAIL.to_owned(),
        };
        let errors = match self {
            ApiError::BadRequest { errors, .. }
            | ApiError::Invalid { errors, .. }
            | ApiError::PreconditionFailedWith { errors, .. } => errors.clone(),
            _ => Vec::new(),
        };
        Problem {
            kind: format!("urn:skillstate:problem:{slug}"),
            title: title.to_owned(),
            status: self.status().as_u16(),
            detail,
            instance: None,
            errors,
        }
    }

    /// A store error of a conditional state write: a stale version is 412, not 409.
    pub fn from_state_write(error: StoreError) -> Self {
        match error {
            StoreError::Conflict {
                expected, actual, ..
            } => ApiError::PreconditionFailed {
                detail: format!(
                    "the task is at version {actual}, not {expected}: another writer committed first; GET the state again (its ETag is the current version) and retry with that If-Match"
                ),
            },
            other => other.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            // Full ids only reach the store, so an ambiguous prefix cannot happen; answer as
            // for a missing task all the same (the count would tell about other tasks).
            StoreError::NotFound(id) | StoreError::Ambiguous { prefix: id, .. } => {
                ApiError::no_task(&id)
            }
            StoreError::NoSuchStep { step, version, .. } => ApiError::not_found(format!(
                "step {step} does not exist: the task has {version} accepted steps"
            )),
            StoreError::Compacted { step, .. } => ApiError::Gone {
                detail: format!(
                    "the journal before step {step} was compacted; those steps are no longer kept"
                ),
            },
            StoreError::Conflict {
                expected, actual, ..
            } => ApiError::conflict(format!(
                "the task moved from version {expected} to {actual} meanwhile; read it again and retry"
            )),
            StoreError::Leased { lease, .. } => ApiError::Conflict {
                detail: format!(
                    "the task is being run by a worker right now (since {}); retry after it stops — its lease expires at {} unless it is renewed",
                    time::utc(lease.acquired_at),
                    time::utc(lease.expires_at)
                ),
                retry_after: Some(seconds_until(lease.expires_at)),
            },
            StoreError::LeaseLost { .. } => ApiError::Conflict {
                detail: "another runner took the task over meanwhile; retry".into(),
                retry_after: Some(1),
            },
            StoreError::NoSuchBoard(id) => ApiError::no_board(&id),
            StoreError::BoardMoved {
                expected, actual, ..
            } => ApiError::PreconditionFailed {
                detail: format!(
                    "the board is at version {actual}, not {expected}: another writer committed first; GET its state again and retry with that If-Match"
                ),
            },
            StoreError::BoardExists { name } => ApiError::conflict(format!(
                "this tenant has a board named `{name}` already; choose another name"
            )),
            StoreError::NoSuchBoardVersion {
                version, current, ..
            } => ApiError::not_found(format!(
                "version {version} does not exist: the board has {current} writes"
            )),
            StoreError::BadEventPosition(position) => ApiError::bad_request(format!(
                "`{position}` is not an event position of this server; pass back an event's id, or none to start from the first"
            )),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> Self {
        match error {
            RuntimeError::Store(store) => store.into(),
            RuntimeError::NotResumable { message, .. } => ApiError::conflict(message),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// Whole seconds from now until `millis` (unix), at least 1.
pub(crate) fn seconds_until(millis: i64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    u64::try_from((millis - now + 999) / 1000)
        .unwrap_or(0)
        .max(1)
}

/// The problem an error response carries, for [`finish_problems`] to complete.
#[derive(Clone)]
struct PendingProblem(Problem);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(message) = &self {
            tracing::error!(error = %message, "request failed");
        }
        let status = self.status();
        let problem = self.problem();
        let mut response = problem_response(status, &problem);
        match &self {
            ApiError::Unauthorized { .. } => {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"skillstate\""),
                );
            }
            ApiError::Conflict {
                retry_after: Some(seconds),
                ..
            } => {
                if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
            }
            _ => {}
        }
        response.extensions_mut().insert(PendingProblem(problem));
        response
    }
}

fn problem_response(status: StatusCode, problem: &Problem) -> Response {
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// The outermost middleware: every error response leaves as a problem with `instance` set to
/// the request path. Errors made by layers and by the router itself (404 for an unknown route,
/// 405, 413, timeouts, panics) are replaced by the problem of their status, keeping their
/// headers (`Allow`, say).
pub async fn finish_problems(
    State(config): State<Arc<ServerConfig>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, _body) = response.into_parts();
    let mut problem = match parts.extensions.remove::<PendingProblem>() {
        Some(PendingProblem(problem)) => problem,
        None => problem_for_status(status, &config),
    };
    problem.instance = Some(path);
    let body = serde_json::to_vec(&problem).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    Response::from_parts(parts, Body::from(body))
}

/// The problem of an error response made outside the handlers, by its status alone.
fn problem_for_status(status: StatusCode, config: &ServerConfig) -> Problem {
    let error = match status {
        StatusCode::NOT_FOUND => ApiError::not_found(
            "no such route; the routes are listed in the OpenAPI document at /openapi.json",
        ),
        StatusCode::METHOD_NOT_ALLOWED => {
            let mut problem = ApiError::bad_request("").problem();
            problem.kind = "urn:skillstate:problem:method-not-allowed".into();
            problem.title = "Method not allowed".into();
            problem.status = status.as_u16();
            problem.detail =
                "this route does not take this method; the Allow header lists the ones it takes"
                    .into();
            return problem;
        }
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge {
            limit: config.body_limit,
        },
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::REQUEST_TIMEOUT => ApiError::Unavailable {
            detail: "the request took longer than this server allows and was stopped; it may or may not have taken effect — read the resource again before retrying".into(),
        },
        status if status.is_server_error() => ApiError::Internal(String::new()),
        _ => ApiError::bad_request("the request cannot be handled as sent"),
    };
    let mut problem = error.problem();
    problem.status = status.as_u16();
    problem
}
