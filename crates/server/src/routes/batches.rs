//! Batches: the tenant's batches (`GET /v1/batches`), one batch's figures (`GET
//! /v1/batches/{id}`: counts by status, tokens, cost, ETA, the slowest and the failed tasks —
//! what `skillstate batch status` shows, computed by [`crate::batch_report`]), and its kill
//! switch (`POST /v1/batches/{id}/stop` and `/reopen`, as `skillstate batch stop` and `batch
//! reopen`). A batch's tasks are listed by `GET /v1/tasks?batch=<id>`.
//!
//! Tenancy: batches have no tenant of their own; a batch is visible to a tenant when it has
//! tasks and every one of them is the tenant's. `POST /v1/tasks:batch` records its tasks as one
//! batch of the caller's tenant; `skillstate batch submit` makes batches of tasks of no tenant,
//! visible to no API key (as their tasks are). Another tenant's batch, one mixing tenants and
//! a missing one are the same 404.

use axum::Extension;
use axum::extract::{Path, Request, State};
use serde::{Deserialize, Serialize};
use skillstate_store::{BatchQuery, BatchRecord, BatchState, StoreError};
use utoipa::{IntoParams, ToSchema};

use super::tasks::{DEFAULT_PAGE, MAX_PAGE};
use crate::auth::Caller;
use crate::batch_report::{self, BatchInfo, Counts, Metrics, Report, TaskRow, now_millis};
use crate::context::AppState;
use crate::context::is_task_id;
use crate::json::{ApiQuery, optional_json};
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{Redaction, rfc3339};

/// The slowest tasks a batch's figures show, as `batch status` does.
pub const SLOWEST: usize = 5;
/// The failed tasks a batch's figures list (`failed_total` counts them all).
pub const FAILED_SHOWN: usize = 20;

/// The longest stop reason accepted, in bytes.
pub const MAX_REASON: usize = 2000;

/// Why a batch stops; the body of `POST /v1/batches/{id}/stop` is optional.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StopBatchRequest {
    /// Shown as the batch's `stop_reason` (1-2000 bytes, no control characters). Default: the
    /// API key that stopped it. A batch stopped already keeps its first reason.
    pub reason: Option<String>,
}

/// The page of a batch listing.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListBatchesQuery {
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Batches per page (1-500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// One batch of a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchListItem {
    pub id: String,
    pub name: String,
    /// `open` (workers claim its queued tasks) or `stopped`.
    pub state: String,
    pub stop_reason: Option<String>,
    /// The model its settings name, if one.
    pub model: Option<String>,
    /// The skill its settings name, if one.
    pub skill: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
}

/// A page of batches, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchPage {
    pub batches: Vec<BatchListItem>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// A batch's figures: what `skillstate batch status` shows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchView {
    pub batch: BatchInfo,
    /// Tasks by where they stand.
    pub counts: Counts,
    /// Tokens, cost, rates, percentiles and the ETA.
    pub metrics: Metrics,
    /// The slowest tasks (finished or running), slowest first, at most 5.
    pub slowest: Vec<TaskRow>,
    /// Failed tasks (for good, or waiting for a retry) with their reasons, at most 20.
    pub failed: Vec<TaskRow>,
    /// All failed tasks.
    pub failed_total: u64,
    /// When the figures were computed.
    #[schema(format = DateTime)]
    pub generated_at: String,
}

fn state_name(state: BatchState) -> &'static str {
    match state {
        BatchState::Open => "open",
        BatchState::Stopped => "stopped",
    }
}

impl BatchListItem {
    fn of(batch: &BatchRecord) -> Self {
        Self {
            id: batch.id.clone(),
            name: batch.name.clone(),
            state: state_name(batch.state).to_owned(),
            stop_reason: batch.stop_reason.clone(),
            model: batch_report::setting(batch, "model"),
            skill: batch_report::setting(batch, "skill"),
            created_at: rfc3339(batch.created_at),
        }
    }
}

/// Lists the tenant's batches, newest first.
#[utoipa::path(
    get,
    path = "/v1/batches",
    operation_id = "listBatches",
    summary = "List batches",
    description = "The batches whose every task belongs to this API key's tenant (those `POST /v1/tasks:batch` made), newest first. Their tasks: `GET /v1/tasks?batch=<id>`.",
    tag = "batches",
    params(ListBatchesQuery),
    responses(
        (status = 200, description = "A page of batches, newest first", body = BatchPage),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_batches(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListBatchesQuery>,
) -> Result<axum::Json<BatchPage>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range; give 1 to {MAX_PAGE}"
        )));
    }
    if let Some(cursor) = &query.cursor
        && !is_task_id(cursor)
    {
        return Err(ApiError::bad_request(format!(
            "cursor `{cursor}` is not one this server gave; pass back `next_cursor` unchanged"
        )));
    }
    let mut batches = match caller.tenant_filter() {
        Some(tenant) => {
            state
                .store
                .list_batches_page(&BatchQuery {
                    tenant,
                    after: query.cursor.clone(),
                    limit: limit + 1,
                })
                .await?
        }
        // The local key of `skillstate view`: every batch of the database, in the same order.
        None => {
            let mut all = state.store.list_batches().await?;
            all.retain(|b| query.cursor.as_ref().is_none_or(|after| b.id < *after));
            all.sort_by(|a, b| b.id.cmp(&a.id));
            all.truncate(limit as usize + 1);
            all
        }
    };
    let more = batches.len() > limit as usize;
    batches.truncate(limit as usize);
    let next_cursor = if more {
        batches.last().map(|b| b.id.clone())
    } else {
        None
    };
    Ok(axum::Json(BatchPage {
        batches: batches.iter().map(BatchListItem::of).collect(),
        next_cursor,
    }))
}

/// The 404 for a batch id: missing, not a batch id, or not the tenant's.
fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "no batch `{id}` exists for this API key's tenant; list them with GET /v1/batches"
    ))
}

/// Gets a batch's figures.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}",
    operation_id = "getBatch",
    summary = "Get a batch's status",
    description = "What `skillstate batch status` shows: tasks by status, tokens (counted and provider-reported), cost (at the price configured for the batch's model), rates, percentiles of steps and durations, the ETA, the slowest tasks and the failed ones with their reasons.",
    tag = "batches",
    params(("id" = String, Path, description = "The batch's id")),
    responses(
        (status = 200, description = "The batch's figures", body = BatchView),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such batch for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_batch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<BatchView>, ApiError> {
    let batch = visible_batch(&state, &caller, &id).await?;
    batch_view(&state, batch).await.map(axum::Json)
}

/// The batch `id` (a full id) when the caller sees it; the same 404 otherwise.
async fn visible_batch(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<BatchRecord, ApiError> {
    if !is_task_id(id) {
        return Err(no_batch(id));
    }
    match state.store.batch_tenant(id).await {
        Ok(tenant) if caller.sees(tenant.as_deref()) => {}
        Ok(_) | Err(StoreError::NoSuchBatch(_)) => return Err(no_batch(id)),
        Err(other) => return Err(other.into()),
    }
    match state.store.batch(id).await {
        Ok(batch) if batch.id == id => Ok(batch),
        Ok(_) | Err(StoreError::NoSuchBatch(_) | StoreError::AmbiguousBatch { .. }) => {
            Err(no_batch(id))
        }
        Err(other) => Err(other.into()),
    }
}

/// A batch's figures, as `GET /v1/batches/{id}` answers them.
async fn batch_view(state: &AppState, batch: BatchRecord) -> Result<BatchView, ApiError> {
    let mut tasks = state.store.batch_tasks(&batch.id).await?;
    // A failure quotes rejection messages, which may quote a value: none that the task's
    // state schema marks write-only.
    for task in &mut tasks {
        if let Some(failure) = task.failure.take() {
            let shown = match state.store.task(&task.id).await {
                Ok(record) => Redaction::of_task(&record).text(failure),
                Err(_) => "the failure's reason cannot be shown (its task is unreadable)".into(),
            };
            task.failure = Some(shown);
        }
    }
    let model = batch_report::setting(&batch, "model");
    let skill = batch_report::setting(&batch, "skill");
    let price = model.as_deref().and_then(|m| state.prices.get(m));
    let report = Report::build(batch, &tasks, model, skill, price, now_millis());
    let failures = report.failures();
    Ok(BatchView {
        failed_total: failures.len() as u64,
        failed: failures.into_iter().take(FAILED_SHOWN).cloned().collect(),
        slowest: report.slowest(SLOWEST).into_iter().cloned().collect(),
        generated_at: rfc3339(report.generated_at),
        batch: report.batch,
        counts: report.counts,
        metrics: report.metrics,
    })
}

/// 422 for a reason that is empty, too long or holds control characters.
fn check_reason(reason: &str) -> Result<(), ApiError> {
    let problem = if reason.len() > MAX_REASON {
        format!(
            "is {} bytes; at most {MAX_REASON} are accepted",
            reason.len()
        )
    } else if reason.trim().is_empty() {
        "is empty; say why the batch stops, or leave `reason` out".to_owned()
    } else if reason.chars().any(char::is_control) {
        "holds a control character (a line break, a tab, NUL…); give one line of text".to_owned()
    } else {
        return Ok(());
    };
    Err(ApiError::invalid(
        "the request is not valid",
        vec![FieldError::new("invalid", "/reason", problem)],
    ))
}

/// Stops a batch by hand.
///
/// Workers claim none of its queued tasks until it is reopened; tasks running now go on. A
/// batch stopped already (by hand, or by `on_error: stop`) stays stopped with its first reason
/// (200, the batch as it is).
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/stop",
    operation_id = "stopBatch",
    summary = "Stop a batch",
    description = "Workers claim none of the batch's queued tasks until `POST /v1/batches/{id}/reopen`; tasks running now go on. The optional body gives the reason (`stop_reason`); a batch stopped already keeps its first reason. Answers the batch's figures as `GET /v1/batches/{id}` does.",
    tag = "batches",
    params(("id" = String, Path, description = "The batch's id")),
    request_body(content = Option<StopBatchRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "The batch, stopped", body = BatchView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The API key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such batch for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The reason is empty, too long or holds control characters, or the body has unknown fields", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn stop_batch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<axum::Json<BatchView>, ApiError> {
    let batch = visible_batch(&state, &caller, &id).await?;
    let request: StopBatchRequest = optional_json(request, &state).await?;
    let reason = match request.reason {
        Some(reason) => {
            check_reason(&reason)?;
            reason.trim().to_owned()
        }
        None => format!("stopped through the API (key {})", caller.key_id),
    };
    state.store.stop_batch(&batch.id, &reason).await?;
    let batch = state.store.batch(&batch.id).await?;
    batch_view(&state, batch).await.map(axum::Json)
}

/// Reopens a stopped batch.
///
/// Workers claim its queued tasks again; nothing is requeued (failed tasks stay failed). An
/// open batch stays as it is (200).
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/reopen",
    operation_id = "reopenBatch",
    summary = "Reopen a stopped batch",
    description = "Opens the batch again and clears its `stop_reason`: workers claim its queued tasks. Nothing is requeued. Answers the batch's figures as `GET /v1/batches/{id}` does.",
    tag = "batches",
    params(("id" = String, Path, description = "The batch's id")),
    responses(
        (status = 200, description = "The batch, open", body = BatchView),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The API key is limited to board pointers", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such batch for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn reopen_batch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<BatchView>, ApiError> {
    let batch = visible_batch(&state, &caller, &id).await?;
    let batch = state.store.reopen_batch(&batch.id).await?;
    batch_view(&state, batch).await.map(axum::Json)
}
