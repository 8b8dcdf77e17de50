//! Why a task's state holds a value (`GET /v1/tasks/{id}/state/provenance?pointer=…`): the
//! steps that wrote it, each with its patch, the observation it answered and its author, from
//! the runtime's `provenance` (a replay of the journal checked against its recorded hash,
//! redacted for the task's reader). The replay runs off the async workers, under the work
//! deadline.

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use skillstate_runtime::RuntimeError;
use skillstate_runtime::provenance::provenance;
use utoipa::IntoParams;

use super::owned_task;
use super::recall::bad_parameter;
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiQuery;
use crate::problem::{ApiError, Problem};
use crate::views::ProvenanceView;

/// The longest pointer asked about, in bytes.
const MAX_POINTER_BYTES: usize = 1024;

/// A provenance question's parameters (read one by one by [`parse`]; this type only describes
/// them to the OpenAPI document).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProvenanceQuery {
    /// The state location (RFC 6901), such as `/inventory/shelf_122`; empty: the whole state.
    #[param(max_length = 1024, example = "/inventory/shelf_122")]
    pub pointer: String,
    /// `true`: every write the journal keeps, not only those since the value last changed.
    pub all: Option<bool>,
}

/// The pointer and `all`, each problem a 422 naming its parameter.
fn parse(pairs: Vec<(String, String)>) -> Result<(String, bool), ApiError> {
    let (mut pointer, mut all) = (None, None);
    for (name, value) in pairs {
        let slot = match name.as_str() {
            "pointer" => &mut pointer,
            "all" => &mut all,
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(bad_parameter(
                    &shown,
                    "is not a parameter of this route; it takes pointer and all",
                ));
            }
        };
        if slot.is_some() {
            return Err(bad_parameter(&name, "is given twice; give it once"));
        }
        *slot = Some(value);
    }
    let Some(pointer) = pointer else {
        return Err(bad_parameter(
            "pointer",
            "is missing; name the state location, such as /inventory/shelf_122 (empty: the whole state)",
        ));
    };
    if pointer.len() > MAX_POINTER_BYTES || !(pointer.is_empty() || pointer.starts_with('/')) {
        return Err(bad_parameter(
            "pointer",
            "must be a JSON pointer into the state of at most 1024 bytes, such as /inventory/shelf_122",
        ));
    }
    let all = match all.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            let shown: String = other.chars().take(64).collect();
            return Err(bad_parameter(
                "all",
                format!("is `{shown}`; give true or false"),
            ));
        }
    };
    Ok((pointer, all))
}

/// Tells where a value of a task's state came from.
///
/// Lists the steps that wrote at, above or below `pointer`, newest first, each with the value
/// there right after it, its whole patch, the observation the model was answering and its
/// author (the model, or the API key of a write through `PATCH …/state`). Without `all`, the
/// writes since the value last changed; with `all=true`, every one the journal keeps. The
/// answer comes from a replay of the journal, checked against the hash its last step recorded.
/// Values the state schema marks `writeOnly` read `"[redacted]"`, in values, patches and
/// observations alike.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/state/provenance",
    operation_id = "getStateProvenance",
    summary = "Where a state value came from",
    tag = "state",
    params(("id" = String, Path, description = "The task's id"), ProvenanceQuery),
    responses(
        (status = 200, description = "The current value and the writes behind it", body = ProvenanceView),
        (status = 400, description = "The query string cannot be read", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "This API key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The journal's oldest kept snapshot is gone", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A parameter is not valid; `errors[0].pointer` names it", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The replay took longer than the server's work deadline", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn state_provenance(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> Result<axum::Json<ProvenanceView>, ApiError> {
    let (pointer, all) = parse(pairs)?;
    let task = owned_task(&state, &caller, &id).await?;
    let store = state.store.clone();
    let found = state
        .offload
        .run("replaying the task's journal", async move {
            provenance(store.as_ref(), &task, &pointer, all).await
        })
        .await?
        .map_err(|error| match error {
            RuntimeError::BadPointer { message, .. } => bad_parameter("pointer", message),
            other => other.into(),
        })?;
    Ok(axum::Json(ProvenanceView::of(found)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn refused(list: &[(&str, &str)]) -> String {
        match parse(pairs(list)) {
            Err(ApiError::Invalid { errors, .. }) => errors[0].pointer.clone(),
            other => panic!("{list:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn parameters_are_read_and_named() {
        assert_eq!(
            parse(pairs(&[("pointer", "/a/b"), ("all", "true")])).unwrap(),
            ("/a/b".to_owned(), true)
        );
        assert_eq!(
            parse(pairs(&[("pointer", "")])).unwrap(),
            (String::new(), false)
        );
        assert_eq!(refused(&[]), "/pointer");
        assert_eq!(refused(&[("pointer", "a")]), "/pointer");
        assert_eq!(refused(&[("pointer", "/a"), ("pointer", "/b")]), "/pointer");
        assert_eq!(refused(&[("pointer", "/a"), ("all", "yes")]), "/all");
        assert_eq!(refused(&[("pointer", "/a"), ("why", "1")]), "/why");
    }
}
