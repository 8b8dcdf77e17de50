//! A task's current state, with its version as the ETag: read it, and write it with a patch
//! that names the version it replaces.

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use skillstate_core::validate::Document;
use skillstate_runtime::{StateWrite, StateWriteError, check_patch_ahead, write_state_read};
use skillstate_store::{StoreError, TaskState};

use crate::auth::{Caller, KeyedState};
use crate::context::AppState;
use crate::context::is_task_id;
use crate::json::{parse_body_quoting, read_body};
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{Redaction, shown_state};

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
/// The body is the state itself; values the state schema marks `writeOnly` read
/// `"[redacted]"`. `ETag` is its version (the number of accepted steps,
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
    keyed: Option<Extension<KeyedState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let task = owned_state(&state, &caller, &id, keyed).await?;
    let tag = etag(task.version);
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches_etag(v, &tag));
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        axum::Json::<Value>(shown_state(&task.schema, task.state)).into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&tag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    Ok(response)
}

/// The state of task `id` if the caller's tenant owns it; a missing task, a malformed id and
/// another tenant's task (or one created outside the service) are the same 404, as for
/// `owned_task`. Reads only what the state routes need of the task, and nothing when the key
/// check read it already (`keyed`).
async fn owned_state(
    state: &AppState,
    caller: &Caller,
    id: &str,
    keyed: Option<Extension<KeyedState>>,
) -> Result<TaskState, ApiError> {
    if !is_task_id(id) {
        return Err(ApiError::no_task(id));
    }
    let read = match keyed {
        Some(Extension(KeyedState(task))) if task.id == id => Ok(task),
        _ => state.store.task_state(id).await,
    };
    let task = match read {
        Ok(task) => task,
        Err(StoreError::NotFound(_)) => return Err(ApiError::no_task(id)),
        Err(other) => return Err(other.into()),
    };
    if !caller.sees(task.tenant.as_deref()) {
        return Err(ApiError::no_task(id));
    }
    Ok(task)
}

/// The media types a state write reads.
pub const MERGE_PATCH: &str = "application/merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";

/// The version an `If-Match` header names: exactly one strong ETag, `"<version>"`.
pub(crate) fn if_match_version(headers: &HeaderMap) -> Result<u64, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Err(ApiError::PreconditionRequired {
            detail: "a state write must name the version it replaces: GET the state and send its ETag as If-Match (`If-Match: \"12\"`)".into(),
        });
    };
    value
        .to_str()
        .ok()
        .map(str::trim)
        .and_then(|v| v.strip_prefix('"'))
        .and_then(|v| v.strip_suffix('"'))
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "If-Match must be one ETag of this task's state, as GET …/state returned it (`\"12\"`); `*`, weak and multiple ETags are not accepted",
            )
        })
}

/// Writes a task's state through the same checks as a model's answer.
///
/// The body is an RFC 7396 merge patch (`application/merge-patch+json`, an object) or RFC 6902
/// operations (`application/json-patch+json`, an array); `application/json` takes either.
/// `If-Match` (required: 428 without it) names the version the patch applies to; a stale one
/// is 412. The patch is checked like a model's `state_patch` — patch shape, read-only
/// locations, the state schema, the state budget — and refused with 422 listing each error and
/// its JSON pointer. An accepted write is journaled as a step whose author is the API key, so
/// time travel, replay and hash checks cover it.
///
/// A write never interleaves with a runner: while a runner drives the task (mid-step, between
/// steps, waiting for its model) the write is refused with 409 at once rather than waiting for
/// the step's commit — the runner's next step would be based on a state it did not see. A
/// task whose last action is still in flight or waits for a human (approval, a reply) is 409
/// too: settle it first. Of state writes naming the same version, the first to commit wins
/// and the others are 412.
#[utoipa::path(
    patch,
    path = "/v1/tasks/{id}/state",
    operation_id = "patchState",
    summary = "Write a task's state",
    tag = "state",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("If-Match" = String, Header, description = "The ETag (version) of the state the patch applies to: `\"12\"`")
    ),
    request_body(
        description = "An RFC 7396 merge patch (object) or RFC 6902 JSON Patch (array of operations)",
        content(
            (Object = "application/merge-patch+json"),
            (Vec<Object> = "application/json-patch+json"),
        )
    ),
    responses(
        (status = 200, description = "The state after the write", body = Object,
            headers(("ETag" = String, description = "The new version, quoted"))),
        (status = 400, description = "Malformed JSON or If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A runner is driving the task, or an action of it is in flight or waits for a human", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "If-Match names a version that is no longer current", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a merge patch or JSON Patch body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The patch is refused; `errors` has each problem with its pointer", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "No If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn patch_state(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    keyed: Option<Extension<KeyedState>>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let task = owned_state(&state, &caller, &id, keyed).await?;
    let if_match = if_match_version(request.headers())?;
    let patch = read_patch(request, &state, "state").await?;
    // The CPU-heavy half (schema compiled, patch checked) off the async workers, under the work
    // deadline; abandoned at the deadline, it writes nothing.
    // The task and the patch go to the check and come back with it (they are not copied).
    let (task, patch, checked) = state
        .offload
        .run("checking the patch", async move {
            let checked = check_patch_ahead(&task, &patch);
            (task, patch, checked)
        })
        .await?;
    let written = match checked {
        Ok(checked) => {
            let write = StateWrite {
                task: &task.id,
                if_match,
                patch: &patch,
                author: &caller.key_id,
                checked: Some(&checked),
            };
            write_state_read(&state.store, &task, &write).await
        }
        Err(error) => Err(error),
    };
    let written = match written {
        Ok(written) => written,
        Err(error) => {
            // Whatever the error repeats of the state or the patch is redacted as the task's.
            let redaction = match state.store.task(&task.id).await {
                Ok(record) => Redaction::of_write(&record, &patch),
                Err(_) => Redaction::unknown(),
            };
            return Err(redaction.error(write_error(error)));
        }
    };
    let mut response =
        axum::Json::<Value>(shown_state(&task.schema, written.state)).into_response();
    if let Ok(value) = HeaderValue::from_str(&etag(written.version)) {
        response.headers_mut().insert(header::ETAG, value);
    }
    Ok(response)
}

fn write_error(error: StateWriteError) -> ApiError {
    match error {
        StateWriteError::Stale {
            expected, current, ..
        } => ApiError::PreconditionFailed {
            detail: format!(
                "the state is at version {current}, not {expected}: another writer committed first; GET it again (its ETag is the current version), reapply the change and send that If-Match"
            ),
        },
        StateWriteError::Rejected { rejections } => ApiError::invalid(
            "the patch was refused by the skill's state rules",
            rejections
                .iter()
                .map(|r| {
                    let mut error = FieldError::from_rejection(r, "");
                    error.message = match r.document {
                        Document::Output => format!("{} (pointer into the patch)", r.message),
                        Document::State => {
                            format!("{} (pointer into the state after the patch)", r.message)
                        }
                    };
                    error
                })
                .collect(),
        ),
        StateWriteError::Busy { .. } => ApiError::conflict(
            "a runner is driving the task right now and its state changes with every step; write once it stops (or pauses)",
        ),
        StateWriteError::Pending { step, what, .. } => ApiError::conflict(format!(
            "the task's action at step {step} is {what}; settle it first (approve, reject or reply), then write"
        )),
        StateWriteError::Store(error) => ApiError::from_state_write(error),
        other => ApiError::Internal(other.to_string()),
    }
}

/// A PATCH body under the limits: a merge patch object (`application/merge-patch+json`), a
/// JSON Patch array (`application/json-patch+json`), or either as `application/json`. `what`
/// names what is written, for the 415 answer.
pub(crate) async fn read_patch(
    request: Request,
    state: &AppState,
    what: &str,
) -> Result<Value, ApiError> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let expects = match content_type.as_str() {
        MERGE_PATCH => Some(true),
        JSON_PATCH => Some(false),
        "application/json" => None,
        other => {
            return Err(ApiError::UnsupportedMediaType {
                detail: format!(
                    "a {what} write is `{MERGE_PATCH}` (an object) or `{JSON_PATCH}` (an array of operations), not `{}`",
                    if other.is_empty() { "none" } else { other }
                ),
            });
        }
    };
    let body = read_body(request, state).await?;
    let patch: Value = parse_body_quoting(&body, state.config.max_json_depth, &state.secrets)?;
    match (expects, &patch) {
        (Some(true), Value::Object(_)) | (Some(false), Value::Array(_)) => {}
        (None, Value::Object(_) | Value::Array(_)) => {}
        _ => {
            return Err(ApiError::invalid(
                "the body is not a patch of this media type",
                vec![FieldError::new(
                    "patch",
                    "",
                    format!(
                        "a merge patch is a JSON object and a JSON Patch a JSON array (Content-Type `{content_type}`)"
                    ),
                )],
            ));
        }
    }
    Ok(patch)
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
