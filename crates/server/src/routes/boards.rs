//! Boards through the service: create and list a tenant's boards, read a board's state (ETag =
//! version), write it under the concurrent-write rule (If-Match names the version the patch was
//! computed on; a patch on an older version is rebased when what it touches did not change
//! since, and refused with 412 and the fresh values otherwise), read the journal of writes and
//! any version's state.
//!
//! A key limited to board pointers (`skillstate keys create --reads … --writes …`) sees only
//! the projection of its reads, and a write outside its writes is refused with 422 naming the
//! pointer — the same answer as a read-only field, since it is the patch, not the key, that
//! must change.

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use skillstate_core::board::{Pointer, check_writes, project, project_schema, rebase};
use skillstate_core::validate::validate_patch;
use skillstate_core::{StatePatch, StateSchema};
use skillstate_store::{
    BoardAuthor, BoardRecord, BoardWrite, NewBoard, StoreError, board_state_at,
};
use utoipa::IntoParams;

use super::state::{etag, if_match_version, matches_etag, read_patch};
use crate::auth::Caller;
use crate::context::AppState;
use crate::context::is_task_id;
use crate::json::{ApiJson, ApiQuery};
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{
    BoardHistory, BoardList, BoardListItem, BoardView, BoardWritePage, BoardWriteView,
    CreateBoardRequest, shown_state,
};

/// The state budget of a board write (core's, which a schema change checks too).
pub use skillstate_core::board::BOARD_STATE_TOKENS;

/// How often a write whose board moved between its read and its commit is tried again before
/// the caller is told to retry. Writes sent to this process take turns
/// ([`crate::board_turns`]), so only writers it cannot see move the board under a write:
/// member tasks' steps and other server processes. Each lost try means one of theirs landed.
const COMMIT_ATTEMPTS: usize = 32;

/// Writes per page when the caller gives no `limit`, and the most it may ask for.
pub const DEFAULT_WRITE_PAGE: u32 = 100;
pub const MAX_WRITE_PAGE: u32 = 1000;

impl ApiError {
    /// The 404 for a board id: missing, not a board id, or another tenant's.
    pub fn no_board(id: &str) -> Self {
        ApiError::not_found(format!(
            "no board `{id}` exists for this API key's tenant; list them with GET /v1/boards"
        ))
    }
}

/// The board `id` if the caller's tenant owns it; a missing board, a malformed id and another
/// tenant's board (or one created outside the service) are the same 404.
pub(crate) async fn owned_board(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<BoardRecord, ApiError> {
    if !is_task_id(id) {
        return Err(ApiError::no_board(id));
    }
    let tenant = caller.tenant_filter();
    match state.store.board(id, tenant.as_deref()).await {
        Ok(board) if board.id == id && caller.sees(board.tenant.as_deref()) => Ok(board),
        Ok(_) | Err(StoreError::NoSuchBoard(_)) => Err(ApiError::no_board(id)),
        Err(other) => Err(other.into()),
    }
}

/// 403 for a key limited to board pointers, on what such a key may not do.
fn unscoped_only(caller: &Caller, what: &str) -> Result<(), ApiError> {
    match caller.scope {
        Some(_) => Err(ApiError::Forbidden {
            detail: format!(
                "this API key is limited to board pointers (its reads and writes); {what} needs a key of the tenant without limits"
            ),
        }),
        None => Ok(()),
    }
}

/// What the caller may see of `state` (of a board with `schema`): its reads when the key is
/// limited, write-only values redacted.
fn visible(caller: &Caller, schema: &Value, state: Value) -> Value {
    let state = match &caller.scope {
        Some(scope) => project(&state, scope),
        None => state,
    };
    shown_state(schema, state)
}

fn with_etag(mut response: Response, version: u64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&etag(version)) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// Creates a board owned by the API key's tenant.
///
/// The schema is compiled and checked (JSON Schema 2020-12) and the initial state validated
/// against it; each problem is reported with its pointer into the request (`/schema/…`,
/// `/initial_state/…`).
#[utoipa::path(
    post,
    path = "/v1/boards",
    operation_id = "createBoard",
    summary = "Create a board",
    tag = "boards",
    request_body(content = CreateBoardRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The board was created", body = BoardView,
            headers(("Location" = String, description = "The board's URL"),
                    ("ETag" = String, description = "The state's version, quoted: `\"0\"`"))),
        (status = 400, description = "Malformed JSON or too deeply nested", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tenant has a board of this name", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The request is not valid; `errors` has each problem with its pointer", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn create_board(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(request): ApiJson<CreateBoardRequest>,
) -> Result<Response, ApiError> {
    unscoped_only(&caller, "creating a board")?;
    let initial_state = request
        .initial_state
        .unwrap_or_else(|| Value::Object(Default::default()));
    let mut errors = Vec::new();
    if let Err(reason) = check_board_name(&request.name) {
        errors.push(FieldError::new("field", "/name", reason));
    }
    // Compiling a caller's schema and checking the state against it may compute at length:
    // off the async workers, under the work deadline.
    let (schema, checked) = (request.schema.clone(), initial_state.clone());
    errors.extend(
        state
            .offload
            .run("compiling the board's schema", async move {
                board_schema_errors(schema, &checked)
            })
            .await?,
    );
    if !errors.is_empty() {
        return Err(ApiError::invalid("the board request is not valid", errors));
    }
    let created = state
        .store
        .create_board(NewBoard {
            name: request.name,
            schema: request.schema,
            initial_state,
            tenant: Some(caller.tenant.clone()),
        })
        .await;
    let board = match created {
        Ok(board) => board,
        Err(StoreError::BoardExists { name }) => {
            return Err(ApiError::conflict(format!(
                "this tenant has a board named `{name}` already; choose another name, or use that board (GET /v1/boards lists them)"
            )));
        }
        Err(StoreError::BadBoardName { reason, .. }) => {
            return Err(ApiError::invalid(
                "the board request is not valid",
                vec![FieldError::new("field", "/name", reason)],
            ));
        }
        Err(other) => return Err(other.into()),
    };
    let mut response = (
        StatusCode::CREATED,
        axum::Json(BoardView::of(&board, Vec::new())),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("/v1/boards/{}", board.id)) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(with_etag(response, board.version))
}

/// What is wrong with a new board's schema and initial state, each with its pointer.
fn board_schema_errors(schema: Value, initial_state: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match StateSchema::compile_all(schema) {
        Err(defects) => {
            errors.extend(defects.into_iter().map(|d| {
                FieldError::new("schema_defect", format!("/schema{}", d.pointer), d.message)
            }))
        }
        Ok(schema) => {
            if !initial_state.is_object() {
                errors.push(FieldError::new(
                    "field",
                    "/initial_state",
                    "a board's state is a JSON object",
                ));
            } else {
                let reader = schema.whole_view();
                errors.extend(schema.violations(initial_state).iter().map(|v| {
                    let v = v.render(&reader);
                    FieldError::new("schema", format!("/initial_state{}", v.pointer), v.message)
                }));
            }
        }
    }
    errors
}

/// The name rules of the store (`NewBoard::name`), checked before anything is compiled so
/// every problem of a request is reported at once.
fn check_board_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().count() > 100 {
        return Err("a board name has 1 to 100 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("a board name holds only letters, digits, `-`, `_` and `.`".into());
    }
    if uuid::Uuid::try_parse(name).is_ok() {
        return Err("a board name cannot read as a board id".into());
    }
    Ok(())
}

/// Lists the tenant's boards, newest first.
#[utoipa::path(
    get,
    path = "/v1/boards",
    operation_id = "listBoards",
    summary = "List boards",
    tag = "boards",
    responses(
        (status = 200, description = "The tenant's boards", body = BoardList),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_boards(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<axum::Json<BoardList>, ApiError> {
    let boards = state
        .store
        .list_boards(caller.tenant_filter().as_deref())
        .await?;
    Ok(axum::Json(BoardList {
        boards: boards.iter().map(BoardListItem::of).collect(),
    }))
}

/// Gets a board: its name, version, schema and members (not its state: GET …/state).
///
/// A key limited to board pointers gets the schema projected to its reads: the subschemas of
/// what it reads whole, and on the way to them only `type`, `readOnly`/`writeOnly`, the
/// `required` members and `properties` that lead to a read — nothing that names, counts or
/// constrains the members it cannot read (docs/service-boards.md, "Boards over HTTP").
#[utoipa::path(
    get,
    path = "/v1/boards/{id}",
    operation_id = "getBoard",
    summary = "Get a board",
    tag = "boards",
    params(("id" = String, Path, description = "The board's id")),
    responses(
        (status = 200, description = "The board", body = BoardView,
            headers(("ETag" = String, description = "The state's version, quoted"))),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_board(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let board = owned_board(&state, &caller, &id).await?;
    let members = match state.store.board_members(&board.id).await {
        Ok(members) => members,
        Err(StoreError::NoSuchBoard(_)) => return Err(ApiError::no_board(&id)),
        Err(other) => return Err(other.into()),
    };
    let mut view = BoardView::of(&board, members);
    if let Some(scope) = &caller.scope {
        view.schema = project_schema(&board.schema, &scope.reads);
    }
    let response = axum::Json(view).into_response();
    Ok(with_etag(response, board.version))
}

/// Gets a board's current state.
///
/// `ETag` is its version (the number of writes, quoted); send it back as `If-Match` to write,
/// or as `If-None-Match` to get a 304 while it is unchanged. A key limited to board pointers
/// sees only its reads; values the schema marks `writeOnly` read `"[redacted]"`.
#[utoipa::path(
    get,
    path = "/v1/boards/{id}/state",
    operation_id = "getBoardState",
    summary = "Get a board's state",
    tag = "boards",
    params(
        ("id" = String, Path, description = "The board's id"),
        ("If-None-Match" = Option<String>, Header, description = "An ETag from an earlier read: 304 while the state is still at that version")
    ),
    responses(
        (status = 200, description = "The state (a JSON object)", body = Object,
            headers(("ETag" = String, description = "The state's version, quoted: `\"12\"`"))),
        (status = 304, description = "Unchanged since the version named in If-None-Match",
            headers(("ETag" = String, description = "The state's version, quoted"))),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_board_state(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let board = owned_board(&state, &caller, &id).await?;
    let tag = etag(board.version);
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches_etag(v, &tag));
    let response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        axum::Json::<Value>(visible(&caller, &board.schema, board.state)).into_response()
    };
    Ok(with_etag(response, board.version))
}

/// Writes a board's state.
///
/// The body is an RFC 7396 merge patch (`application/merge-patch+json`, an object) or RFC 6902
/// operations (`application/json-patch+json`, an array); `application/json` takes either.
/// `If-Match` (required: 428 without it) names the version the patch was computed on. When
/// others wrote since, the patch is rebased onto the newest version if none of the locations
/// it touches changed since (the rule of docs/boards.md, "Several agents, one state"), and refused
/// with 412 otherwise: `errors` lists each conflicting pointer with its fresh value. The
/// patch is checked against the board's schema (read-only locations included) and, for a key
/// limited to board pointers, against its writes — 422 with each error's pointer. The write
/// is journaled with the API key as its author.
#[utoipa::path(
    patch,
    path = "/v1/boards/{id}/state",
    operation_id = "patchBoardState",
    summary = "Write a board's state",
    tag = "boards",
    params(
        ("id" = String, Path, description = "The board's id"),
        ("If-Match" = String, Header, description = "The ETag (version) of the state the patch was computed on: `\"12\"`")
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
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 412, description = "What the patch touches changed since the version in If-Match (`errors`: the conflicting pointers and their fresh values), or that version does not exist", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a merge patch or JSON Patch body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The patch is refused; `errors` has each problem with its pointer", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "No If-Match", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn patch_board_state(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let mut board = owned_board(&state, &caller, &id).await?;
    let if_match = if_match_version(request.headers())?;
    let patch = read_patch(request, &state, "board").await?;
    let parsed = StatePatch::from_value(&patch).map_err(|problem| {
        ApiError::invalid(
            "the patch is malformed",
            vec![FieldError::new("patch", problem.pointer, problem.message)],
        )
    })?;
    if if_match > board.version {
        return Err(ApiError::PreconditionFailed {
            detail: format!(
                "the board is at version {}; version {if_match} does not exist yet. GET the state and send its ETag as If-Match",
                board.version
            ),
        });
    }
    // Compiling the schema and checking the patch are the CPU-heavy part: off the async
    // workers, under the work deadline (abandoned then; they write nothing).
    let mut schema = compiled_schema(&state, &board).await?;
    // From here to the commit, this process's other writes to the board wait. The board read
    // above may be stale by then; its commit then fails once and is judged again on the
    // newest, under the turn.
    let _turn = state.board_turns.turn(&board.id).await;
    // The state the patch was computed on, for the rebase of a stale write.
    let base = if if_match == board.version {
        board.state.clone()
    } else {
        board_state_at(state.store.as_ref(), &board.id, if_match).await?
    };
    for _ in 0..COMMIT_ATTEMPTS {
        if let Some(scope) = &caller.scope {
            check_writes(&parsed, &board.state, scope).map_err(|rejections| {
                refused(
                    "the patch writes outside this API key's writes",
                    &rejections,
                )
            })?;
        }
        let rebased_from = if if_match == board.version {
            None
        } else {
            match rebase(&parsed, &base, &board.state) {
                Ok(_) => Some(if_match),
                Err(conflict) => {
                    return Err(conflict_error(
                        &caller,
                        &board,
                        if_match,
                        &conflict.pointers,
                    ));
                }
            }
        };
        let checked = {
            let (schema, current, patch) = (schema.clone(), board.state.clone(), patch.clone());
            let reads = caller.scope.as_ref().map(|scope| scope.reads.clone());
            state
                .offload
                .run("checking the patch", async move {
                    let reader = match &reads {
                        Some(reads) => schema.view_of(reads),
                        None => schema.whole_view(),
                    };
                    validate_patch(&schema, BOARD_STATE_TOKENS, &current, &patch, &reader)
                })
                .await?
        };
        let accepted = checked.map_err(|rejections| {
            refused(
                "the patch was refused by the board's state rules",
                &rejections,
            )
        })?;
        let write = BoardWrite {
            patch: patch.clone(),
            state_hash: accepted.state_hash,
            new_state: accepted.new_state,
            author: BoardAuthor::Key {
                key: caller.key_id.clone(),
            },
            rebased_from,
        };
        match state
            .store
            .commit_board_write(&board.id, board.version, &write)
            .await
        {
            Ok(version) => {
                let response =
                    axum::Json::<Value>(visible(&caller, &board.schema, write.new_state))
                        .into_response();
                return Ok(with_etag(response, version));
            }
            // Someone committed between the read and this commit: judged again on the newest.
            Err(StoreError::BoardMoved { .. }) => {
                board = owned_board(&state, &caller, &id).await?;
                // A schema change (`board upgrade`) is a write too: judge by the new one.
                if board.schema != *schema.document() {
                    schema = compiled_schema(&state, &board).await?;
                }
            }
            Err(StoreError::NoSuchBoard(_)) => return Err(ApiError::no_board(&id)),
            Err(other) => return Err(other.into()),
        }
    }
    Err(ApiError::PreconditionFailed {
        detail: format!(
            "the board kept moving while this write was committed ({COMMIT_ATTEMPTS} attempts); GET the state again and retry"
        ),
    })
}

/// `board`'s stored schema compiled, off the async workers.
async fn compiled_schema(
    state: &AppState,
    board: &BoardRecord,
) -> Result<std::sync::Arc<StateSchema>, ApiError> {
    let stored = board.schema.clone();
    let schema = state
        .offload
        .run("compiling the board's schema", async move {
            StateSchema::compile(stored)
        })
        .await?
        .map_err(|defect| {
            ApiError::Internal(format!(
                "board {}: the stored schema does not compile at {}: {}",
                board.id, defect.pointer, defect.message
            ))
        })?;
    Ok(std::sync::Arc::new(schema))
}

/// A 422 listing `rejections`. Their texts were rendered for the caller by core: schema
/// problems through the caller's reads, with no value of the board quoted; scope refusals name
/// the patch's own pointers.
fn refused(detail: &str, rejections: &[skillstate_core::Rejection]) -> ApiError {
    ApiError::invalid(
        detail,
        rejections
            .iter()
            .map(|r| FieldError::from_rejection(r, ""))
            .collect(),
    )
}

/// The 412 of a conflicting write: each conflicting pointer with its fresh value (when the
/// caller may read it).
fn conflict_error(
    caller: &Caller,
    board: &BoardRecord,
    base: u64,
    pointers: &[Pointer],
) -> ApiError {
    let shown = shown_state(&board.schema, board.state.clone());
    let readable = |pointer: &Pointer| match &caller.scope {
        Some(scope) => scope.can_read(pointer),
        None => true,
    };
    let errors = pointers
        .iter()
        .map(|pointer| {
            let message = if !readable(pointer) {
                format!("changed since version {base}, outside this API key's reads")
            } else {
                match pointer.get(&shown) {
                    Some(fresh) => format!("changed since version {base}; now {fresh}"),
                    None => format!("changed since version {base}; now absent"),
                }
            };
            FieldError::new("conflict", pointer.to_string(), message)
        })
        .collect();
    ApiError::PreconditionFailedWith {
        detail: format!(
            "others wrote what this patch touches since version {base} (the board is at version {}): recompute the patch from the fresh values in `errors` and send it with If-Match \"{}\"",
            board.version, board.version
        ),
        errors,
    }
}

/// The page of a board's journal.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListWritesQuery {
    /// Only writes after this version (default 0: from the first); the previous page's
    /// `next_after`.
    pub after: Option<u64>,
    /// Writes per page (1-1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Lists a board's writes, oldest first: each version's patch as applied, the hash of the state
/// after it, its author (a task's step, an API key, the command line) and the version it was
/// rebased from. Not for keys limited to board pointers (the journal shows every write).
#[utoipa::path(
    get,
    path = "/v1/boards/{id}/writes",
    operation_id = "listBoardWrites",
    summary = "List a board's writes",
    tag = "boards",
    params(("id" = String, Path, description = "The board's id"), ListWritesQuery),
    responses(
        (status = 200, description = "A page of writes", body = BoardWritePage),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_board_writes(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ListWritesQuery>,
) -> Result<axum::Json<BoardWritePage>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_WRITE_PAGE);
    if !(1..=MAX_WRITE_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range; give 1 to {MAX_WRITE_PAGE}"
        )));
    }
    let board = owned_board(&state, &caller, &id).await?;
    unscoped_only(&caller, "reading the journal of writes")?;
    let after = query.after.unwrap_or(0);
    let from = after.saturating_add(1);
    // One more than the page, to know whether another follows.
    let to = from.saturating_add(u64::from(limit));
    let mut writes = match state.store.board_writes(&board.id, from, to).await {
        Ok(writes) => writes,
        Err(StoreError::NoSuchBoard(_)) => return Err(ApiError::no_board(&id)),
        Err(other) => return Err(other.into()),
    };
    let more = writes.len() > limit as usize;
    writes.truncate(limit as usize);
    // Patches of earlier versions: hidden by every schema the board had.
    let history = BoardHistory::of(state.store.as_ref(), &board.id).await?;
    let show_hash = !history.hides_values();
    let views: Vec<BoardWriteView> = writes
        .iter()
        .map(|w| BoardWriteView::of(w, history.patch(w.patch.clone()), show_hash))
        .collect();
    let next_after = if more {
        views.last().map(|w| w.version)
    } else {
        None
    };
    Ok(axum::Json(BoardWritePage {
        writes: views,
        next_after,
    }))
}

/// Gets a board's state at any version (0 = the initial state), rebuilt from its journal with
/// every recorded hash checked. A key limited to board pointers sees only its reads.
#[utoipa::path(
    get,
    path = "/v1/boards/{id}/writes/{version}/state",
    operation_id = "getBoardStateAt",
    summary = "Get a board's state at a version",
    tag = "boards",
    params(
        ("id" = String, Path, description = "The board's id"),
        ("version" = u64, Path, description = "The version, from 0 (the initial state)")
    ),
    responses(
        (status = 200, description = "The state at that version", body = Object),
        (status = 400, description = "Not a version number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant, or no such version", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error (a journal that fails its hash check included)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn board_state_at_version(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, version)): Path<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let version = version.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "`{version}` is not a version number; versions are counted from 0 (the initial state)"
        ))
    })?;
    let board = owned_board(&state, &caller, &id).await?;
    match board_state_at(state.store.as_ref(), &board.id, version).await {
        Ok(at) => {
            // An earlier version: hidden by every schema the board had.
            let history = BoardHistory::of(state.store.as_ref(), &board.id).await?;
            let at = match &caller.scope {
                Some(scope) => project(&at, scope),
                None => at,
            };
            Ok(axum::Json(shown_state(&board.schema, history.state(at))))
        }
        Err(StoreError::NoSuchBoardVersion { current, .. }) => Err(ApiError::not_found(format!(
            "version {version} does not exist: the board has {current} writes"
        ))),
        Err(StoreError::NoSuchBoard(_)) => Err(ApiError::no_board(&id)),
        Err(other) => Err(other.into()),
    }
}
