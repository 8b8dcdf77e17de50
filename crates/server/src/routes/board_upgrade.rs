//! A board's schema changed through the API (`POST /v1/boards/{id}:upgrade`), with the rules of
//! `skillstate board upgrade` (the runtime's `upgrade_board`): the migration, then the new
//! schema's checks with every error's pointer, then every member's scopes re-checked against
//! the new schema; dry run unless `apply`; committed as a write of its own, authored by the
//! API key.

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_core::StateSchema;
use skillstate_core::board::BoardMember;
use skillstate_runtime::board_upgrade::{
    BoardUpgrade, BoardUpgradeError, BoardUpgraded, upgrade_board,
};
use skillstate_store::BoardAuthor;
use utoipa::ToSchema;

use super::boards::owned_board;
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiJson;
use crate::problem::{ApiError, FieldError, Problem};

/// A board schema change.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardUpgradeRequest {
    /// The new JSON Schema (2020-12) of the board's state.
    #[schema(value_type = Object)]
    pub schema: Value,
    /// A JSON Patch (array) or JSON merge patch (object) applied to the board's current state
    /// first; none when the new schema accepts the state as it is.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub migration: Option<Value>,
    /// The version a dry run planned against (its `planned_at`): applied only while the board
    /// is still there (412 otherwise).
    #[serde(default)]
    pub planned_at: Option<u64>,
    /// Commit it; without it nothing is written.
    #[serde(default)]
    pub apply: bool,
}

/// What a board schema change did, or would do.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardUpgradeView {
    pub board: String,
    pub name: String,
    /// `moved` (committed) or `planned` (a dry run: nothing written).
    #[schema(example = "moved")]
    pub outcome: String,
    /// The version it was planned against.
    pub planned_at: u64,
    /// The version that records it (or would).
    pub version: u64,
    /// RFC 6902 operations from the state before to the state after; write-only values of
    /// either schema read `"[redacted]"`.
    #[schema(value_type = Vec<Object>)]
    pub diff: Value,
    /// The members whose scopes were checked: `{"kind": "key" | "task", "id": …}`.
    #[schema(value_type = Vec<Object>)]
    pub members: Value,
    pub applied: bool,
}

impl BoardUpgradeView {
    fn of(done: BoardUpgraded) -> Self {
        Self {
            outcome: if done.applied { "moved" } else { "planned" }.to_owned(),
            members: serde_json::to_value(&done.members).unwrap_or(Value::Null),
            board: done.board,
            name: done.name,
            planned_at: done.planned_at,
            version: done.version,
            diff: done.diff,
            applied: done.applied,
        }
    }
}

/// `POST /v1/boards/{id}:<method>`: the custom methods of a board (`:upgrade`), split off the
/// parameter as for tasks.
pub async fn board_method(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let id = match super::upgrade_target_id(&id, "board", "GET") {
        Ok(id) => id,
        Err(response) => return Ok(*response),
    };
    let ApiJson(body) =
        <ApiJson<BoardUpgradeRequest> as axum::extract::FromRequest<AppState>>::from_request(
            request, &state,
        )
        .await?;
    upgrade(&state, &caller, id, body)
        .await
        .map(|view| axum::Json(view).into_response())
}

/// Changes a board's schema.
///
/// The migration (if any) is applied to the board's current state, and the result must pass
/// the new schema (every error with its pointer into the migrated board), its read-only rule
/// and the board budget; then every member's scopes — the tenant's keys limited to board
/// pointers and the tasks attached to the board — must still name something in the new schema
/// (each refusal names the member and the pointer). Nothing changes on a refusal. Dry run
/// unless `apply`; applied, the change is a write of the board's journal authored by this API
/// key, and earlier versions keep the schema they were written under.
#[utoipa::path(
    post,
    path = "/v1/boards/{id}:upgrade",
    operation_id = "upgradeBoard",
    summary = "Change a board's schema",
    tag = "boards",
    params(("id" = String, Path, description = "The board's id")),
    request_body(content = BoardUpgradeRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What the change did (`moved`) or would do (`planned`)", body = BoardUpgradeView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A key limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing to change, or a member's scope cannot be read", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "The board moved on since `planned_at`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The schema does not compile, the migrated board breaks it, or a member's scope names nothing in it", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Checking the change took too long", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn upgrade(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: BoardUpgradeRequest,
) -> Result<BoardUpgradeView, ApiError> {
    let board = owned_board(state, caller, id).await?;
    if caller.scope.is_some() {
        return Err(ApiError::Forbidden {
            detail: "this API key is limited to board pointers; changing a board's schema needs a key of the tenant without limits".into(),
        });
    }
    if let Some(migration) = &request.migration
        && !(migration.is_array() || migration.is_object())
    {
        return Err(ApiError::invalid(
            "the migration is not a patch",
            vec![FieldError::new(
                "field",
                "/migration",
                "give a JSON Patch (an array of operations) or a JSON merge patch (an object)",
            )],
        ));
    }
    // Compiling a caller's schema may compute at length: off the async workers.
    let schema = {
        let document = request.schema.clone();
        state
            .offload
            .run("compiling the board's schema", async move {
                StateSchema::compile_all(document)
            })
            .await?
            .map_err(|defects| {
                ApiError::invalid(
                    "the new schema does not compile",
                    defects
                        .into_iter()
                        .map(|d| {
                            FieldError::new(
                                "schema_defect",
                                format!("/schema{}", d.pointer),
                                d.message,
                            )
                        })
                        .collect(),
                )
            })?
    };
    let tenant = caller.tenant_filter();
    let upgrade = BoardUpgrade {
        board: &board.id,
        tenant: tenant.as_deref(),
        schema: &schema,
        migration: request.migration.as_ref(),
        author: BoardAuthor::Key {
            key: caller.key_id.clone(),
        },
        planned_at: request.planned_at,
        apply: request.apply,
    };
    upgrade_board(state.store.as_ref(), &upgrade)
        .await
        .map(BoardUpgradeView::of)
        .map_err(upgrade_error)
}

fn member_text(member: &BoardMember) -> String {
    member.to_string()
}

/// The problem for each way a board schema change fails.
fn upgrade_error(error: BoardUpgradeError) -> ApiError {
    match error {
        BoardUpgradeError::Store(error) => error.into(),
        BoardUpgradeError::Refused {
            rejections, scopes, ..
        } => {
            let mut errors: Vec<FieldError> = rejections
                .iter()
                .map(|r| {
                    let mut error = FieldError::from_rejection(r, "");
                    error.message = format!("{} (pointer into the migrated board)", r.message);
                    error
                })
                .collect();
            errors.extend(scopes.iter().map(|refusal| {
                FieldError::new(
                    "scope",
                    refusal.pointer.clone(),
                    format!(
                        "{}'s {} name {}, which the new schema does not declare: {} (change the schema, or that member's scope first)",
                        member_text(&refusal.member),
                        refusal.list,
                        refusal.pointer,
                        refusal.reason
                    ),
                )
            }));
            ApiError::invalid(
                "the board cannot move to the new schema; nothing changed",
                errors,
            )
        }
        BoardUpgradeError::Stale {
            planned, actual, ..
        } => ApiError::PreconditionFailed {
            detail: format!(
                "the board is at version {actual}, not {planned}: plan the change again (a dry run shows the new diff) and send its planned_at"
            ),
        },
        BoardUpgradeError::Member {
            member, message, ..
        } => ApiError::conflict(format!(
            "{} cannot be checked against the new schema: {message}",
            member_text(&member)
        )),
        BoardUpgradeError::Unchanged { .. } => ApiError::conflict(
            "the board already has this schema and the migration changes nothing: nothing to upgrade",
        ),
    }
}
