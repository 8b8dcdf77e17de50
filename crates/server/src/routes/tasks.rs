//! Tasks as wholes: create (one or a batch), list, get, cancel, delete.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use skillstate_store::{
    BatchQuery, NewBatch, NewTask, OnError, RateLimit, TaskOwner, TaskQuery, TaskRecord, TaskStatus,
};
use utoipa::{IntoParams, ToSchema};

use super::{Hold, owned_task};
use crate::auth::Caller;
use crate::context::AppState;
use crate::context::is_task_id;
use crate::factory::{CreateTaskRequest, is_label_name};
use crate::json::{ApiJson, ApiQuery};
use crate::policy::ResolvedRequest;
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{
    BatchCreated, CreatedTask, StatusName, TaskListItem, TaskPage, TaskView, Totals,
};

/// The header that makes a retried create return the first task.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Longest Idempotency-Key accepted.
pub const MAX_IDEMPOTENCY_KEY: usize = 200;

/// Tasks per page when the caller gives no `limit`, and the most it may ask for.
pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 500;

/// Creates a task.
///
/// The skill comes from the server's skills directory; the task's skill definition and tools
/// are frozen now. The task belongs to the API key's tenant. With an `Idempotency-Key`, a
/// retried create (same tenant, same key) returns the task the first one made, with status
/// 200 instead of 201; reusing a key for a different skill or model is a 422.
#[utoipa::path(
    post,
    path = "/v1/tasks",
    operation_id = "createTask",
    summary = "Create a task",
    tag = "tasks",
    params(
        ("Idempotency-Key" = Option<String>, Header,
            description = "Makes a retried create return the first task (1-200 visible ASCII characters)")
    ),
    request_body(content = CreateTaskRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The task was created", body = CreatedTask,
            headers(("Location" = String, description = "The task's URL"))),
        (status = 200, description = "The Idempotency-Key was used before: the task it created", body = CreatedTask,
            headers(("Location" = String, description = "The task's URL"))),
        (status = 400, description = "Malformed JSON, too deeply nested, or a bad Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The request is not valid; `errors` has each problem with its pointer", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn create_task(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CreateTaskRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let resolved = state
        .policy
        .resolve(&request)
        .map_err(|errors| ApiError::invalid("the task request is not valid", errors))?;
    let prepared = prepare(&state, resolved).await?;
    let (task, created) = create_owned(&state, &caller, &request, prepared, key, &None).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let view = created_view(&state, &task, created).await?;
    let mut response = (
        status,
        axum::Json(CreatedTask {
            created,
            task: view,
        }),
    )
        .into_response();
    set_location(&mut response, &task.id);
    Ok(response)
}

/// A batch create.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchCreateRequest {
    /// The tasks to create, each as for `createTask`.
    pub tasks: Vec<CreateTaskRequest>,
    /// The batch's name, for people (1-200 characters; default `api`).
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
}

/// Longest batch name accepted.
pub const MAX_BATCH_NAME: usize = 200;

/// Batches a replayed batch create looks through (newest first) for the one its
/// Idempotency-Key made.
const REPLAY_LOOKBACK: u32 = 1000;

/// Creates many tasks in one request.
///
/// Every task is checked (by the server and the skill) before any is created: one invalid
/// task refuses the whole batch with a 422 listing every problem, each pointer under
/// `/tasks/<index>`. Tasks are then created one by one in request order, as one batch (see
/// `GET /v1/batches/{id}`); should that fail midway (a 5xx), retry with the same
/// `Idempotency-Key`: item *i* uses `<key>/<i>`, so the tasks created before are returned,
/// not made again, and the rest join the same batch.
#[utoipa::path(
    post,
    path = "/v1/tasks:batch",
    operation_id = "createTasks",
    summary = "Create many tasks",
    tag = "tasks",
    params(
        ("Idempotency-Key" = Option<String>, Header,
            description = "Makes a retried batch return the tasks it created; item i uses `<key>/<i>`")
    ),
    request_body(content = BatchCreateRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "At least one task was created", body = BatchCreated),
        (status = 200, description = "Every task existed already (a repeated Idempotency-Key)", body = BatchCreated),
        (status = 400, description = "Malformed JSON, too deeply nested, or a bad Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Some task is not valid; nothing was created", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn create_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiJson(batch): ApiJson<BatchCreateRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let max = state.config.max_batch;
    if let Some(name) = &batch.name
        && !(1..=MAX_BATCH_NAME).contains(&name.chars().count())
    {
        return Err(ApiError::invalid(
            "the batch's name is not valid",
            vec![FieldError::new(
                "field",
                "/name",
                format!("give 1 to {MAX_BATCH_NAME} characters, or leave it out"),
            )],
        ));
    }
    if batch.tasks.is_empty() || batch.tasks.len() > max {
        return Err(ApiError::invalid(
            format!("a batch has 1 to {max} tasks"),
            vec![FieldError::new(
                "field",
                "/tasks",
                format!(
                    "{} tasks given; send 1 to {max} per request",
                    batch.tasks.len()
                ),
            )],
        ));
    }
    let mut errors = Vec::new();
    let mut prepared = Vec::with_capacity(batch.tasks.len());
    for (index, request) in batch.tasks.iter().enumerate() {
        let prefix = format!("/tasks/{index}");
        let resolved = match state.policy.resolve(request) {
            Ok(resolved) => resolved,
            Err(found) => {
                errors.extend(found.into_iter().map(|e| e.under(&prefix)));
                continue;
            }
        };
        match prepare(&state, resolved).await {
            Ok(task) => prepared.push(task),
            Err(ApiError::Invalid { errors: found, .. }) => {
                errors.extend(found.into_iter().map(|e| e.under(&prefix)));
            }
            Err(other) => return Err(other),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(
            "some tasks of the batch are not valid; nothing was created",
            errors,
        ));
    }
    let batch_id = batch_of(&state, &caller, &batch, &prepared, key.as_deref()).await?;
    let mut created_any = false;
    let mut tasks = Vec::with_capacity(prepared.len());
    for (index, (request, task)) in batch.tasks.iter().zip(prepared).enumerate() {
        let item_key = key.as_ref().map(|k| format!("{k}/{index}"));
        let (task, created) = create_owned(&state, &caller, request, task, item_key, &batch_id)
            .await
            .map_err(|error| match error {
                ApiError::Invalid { detail, errors } => ApiError::Invalid {
                    detail,
                    errors: errors
                        .into_iter()
                        .map(|e| e.under(&format!("/tasks/{index}")))
                        .collect(),
                },
                other => other,
            })?;
        created_any |= created;
        tasks.push(CreatedTask {
            created,
            task: created_view(&state, &task, created).await?,
        });
    }
    let status = if created_any {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        axum::Json(BatchCreated {
            batch: batch_id,
            tasks,
        }),
    )
        .into_response())
}

/// The batch a batch create puts its tasks in: the one an earlier request with the same
/// Idempotency-Key made (looked for among the tenant's newest batches), else a new one. Its
/// settings keep the skill and model when every task shares them; tasks run as unbatched ones
/// do (no retry, a failure stops nothing, no shared rate limit).
async fn batch_of(
    state: &AppState,
    caller: &Caller,
    request: &BatchCreateRequest,
    prepared: &[(NewTask, Value)],
    key: Option<&str>,
) -> Result<Option<String>, ApiError> {
    if let Some(key) = key {
        let mut after = None;
        let mut seen = 0;
        while seen < REPLAY_LOOKBACK {
            let page = state
                .store
                .list_batches_page(&BatchQuery {
                    tenant: caller.tenant.clone(),
                    after: after.clone(),
                    limit: 200,
                })
                .await?;
            if let Some(found) = page
                .iter()
                .find(|b| b.spec.get("idempotency_key").and_then(Value::as_str) == Some(key))
            {
                return Ok(Some(found.id.clone()));
            }
            let Some(last) = page.last() else { break };
            seen += page.len() as u32;
            after = Some(last.id.clone());
        }
    }
    let common = |field: fn(&NewTask) -> &str| {
        let first = prepared.first().map(|(task, _)| field(task))?;
        prepared
            .iter()
            .all(|(task, _)| field(task) == first)
            .then(|| first.to_owned())
    };
    let spec = json!({
        "source": "api",
        "skill": common(|t| t.skill.name.as_str()),
        "model": common(|t| t.model.as_str()),
        "idempotency_key": key,
    });
    let record = state
        .store
        .create_batch(&NewBatch {
            name: request.name.clone().unwrap_or_else(|| "api".to_owned()),
            spec,
            on_error: OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: RateLimit::default(),
        })
        .await?;
    Ok(Some(record.id))
}

/// The factory's task for a resolved request, built on a thread of the offload pool under the
/// work deadline (environment set-up and state checks may compute at length).
async fn prepare(state: &AppState, request: ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
    let factory = state.factory.clone();
    let pin = request.skill_version.clone();
    let (task, initial) = state
        .offload
        .run("preparing the task", async move {
            factory.prepare(&request).await
        })
        .await??;
    if let Some(pin) = pin {
        let built = skillstate_runtime::upgrade::version_name(&task.skill, &task.tools);
        if !crate::factory::pin_names(&pin, &built) {
            return Err(ApiError::invalid(
                format!("the server's skill is not version `{pin}`"),
                vec![FieldError::new(
                    "skill_version",
                    "/skill_version",
                    format!(
                        "the server's skill `{}` is {built}, not `{pin}`: pin {built} (or drop skill_version), or ask the operator for the version you wrote for",
                        task.skill.name
                    ),
                )],
            ));
        }
    }
    Ok((task, initial))
}

/// Stores a prepared task for the caller's tenant; a replayed key must name the same skill and
/// model as the task it made.
async fn create_owned(
    state: &AppState,
    caller: &Caller,
    request: &CreateTaskRequest,
    (task, initial_state): (NewTask, Value),
    key: Option<String>,
    batch: &Option<String>,
) -> Result<(TaskRecord, bool), ApiError> {
    let (skill, model) = (task.skill.name.clone(), task.model.clone());
    let owner = TaskOwner {
        tenant: caller.tenant.clone(),
        idempotency_key: key.clone(),
        labels: json!(request.labels),
        batch: batch.clone(),
        // The request's span, a child of the caller's `traceparent` when it sent one: the
        // worker that runs the task continues this trace.
        trace_context: crate::trace::request_traceparent(),
    };
    let (record, created) = state
        .store
        .create_owned_task(task, &initial_state, &owner)
        .await?;
    if !created && (record.skill.name != skill || record.model != model) {
        return Err(ApiError::invalid(
            format!(
                "Idempotency-Key `{}` was used before for another request (task {}: skill `{}`, model `{}`); use a new key for a new task",
                key.unwrap_or_default(),
                record.id,
                record.skill.name,
                record.model
            ),
            Vec::new(),
        ));
    }
    // Workers run what the service creates. A replayed create queues a still-running task too,
    // so a create whose queueing failed is completed by its retry.
    if record.status == TaskStatus::Running {
        state.store.queue_task(&record.id).await?;
    }
    Ok((record, created))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key)
            if (1..=MAX_IDEMPOTENCY_KEY).contains(&key.len())
                && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::bad_request(format!(
            "the Idempotency-Key header must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters (a UUID, say)"
        ))),
    }
}

fn set_location(response: &mut Response, id: &str) {
    if let Ok(value) = HeaderValue::from_str(&format!("/v1/tasks/{id}")) {
        response.headers_mut().insert(header::LOCATION, value);
    }
}

/// The filters and page of a task listing.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListTasksQuery {
    /// Only tasks with this status.
    pub status: Option<StatusName>,
    /// Only tasks of this skill.
    pub skill: Option<String>,
    /// Only tasks with this label: `name:value`.
    pub label: Option<String>,
    /// Only tasks of this batch (its id).
    pub batch: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Tasks per page (1-500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Lists the tenant's tasks, newest first.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    operation_id = "listTasks",
    summary = "List tasks",
    tag = "tasks",
    params(ListTasksQuery),
    responses(
        (status = 200, description = "A page of tasks, newest first", body = TaskPage),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListTasksQuery>,
) -> Result<axum::Json<TaskPage>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range; give 1 to {MAX_PAGE}"
        )));
    }
    let label = match &query.label {
        None => None,
        Some(text) => match text.split_once(':') {
            Some((name, value)) if is_label_name(name) => Some((name.to_owned(), value.to_owned())),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "label `{text}` is not `name:value` (a label name is letters, digits, `-`, `_`, `.`)"
                )));
            }
        },
    };
    if let Some(cursor) = &query.cursor
        && !is_task_id(cursor)
    {
        return Err(ApiError::bad_request(format!(
            "cursor `{cursor}` is not one this server gave; pass back `next_cursor` unchanged"
        )));
    }
    if let Some(batch) = &query.batch
        && !is_task_id(batch)
    {
        return Err(ApiError::bad_request(format!(
            "batch `{batch}` is not a batch id; take one from GET /v1/batches"
        )));
    }
    let mut tasks = state
        .store
        .list_tasks_page(&TaskQuery {
            tenant: caller.tenant_filter(),
            status: query.status.map(StatusName::status),
            skill: query.skill.clone(),
            label,
            batch: query.batch.clone(),
            after: query.cursor.clone(),
            limit: limit + 1,
        })
        .await?;
    let more = tasks.len() > limit as usize;
    tasks.truncate(limit as usize);
    let next_cursor = if more {
        tasks.last().map(|t| t.id.clone())
    } else {
        None
    };
    let ids: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
    let totals = state.store.task_totals(&ids).await?;
    Ok(axum::Json(TaskPage {
        tasks: tasks
            .iter()
            .map(|task| {
                let totals = Totals::of(totals.get(&task.id), state.prices.get(&task.model));
                TaskListItem::of(task, totals)
            })
            .collect(),
        next_cursor,
    }))
}

/// Gets a task.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    operation_id = "getTask",
    summary = "Get a task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_task(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<TaskView>, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    Ok(axum::Json(task_view(&state, &task).await?))
}

/// The task with its totals (one grouped read of its journal).
pub(crate) async fn task_view(state: &AppState, task: &TaskRecord) -> Result<TaskView, ApiError> {
    let totals = state
        .store
        .task_totals(std::slice::from_ref(&task.id))
        .await?;
    let totals = Totals::of(totals.get(&task.id), state.prices.get(&task.model));
    let versions = state.store.task_versions(&task.id).await?;
    Ok(TaskView::of(task)
        .with_totals(totals)
        .with_versions(versions))
}

/// A task a create returns: one made now has no answer yet; a replayed one is read whole.
async fn created_view(
    state: &AppState,
    task: &TaskRecord,
    created: bool,
) -> Result<TaskView, ApiError> {
    if created {
        let totals = Totals::of(None, state.prices.get(&task.model));
        return Ok(TaskView::of(task).with_totals(totals));
    }
    task_view(state, task).await
}

/// Deletes a task and everything it owns (journal, snapshots, events).
///
/// Refused with 409 while a runner (a worker) holds the task: cancel it first, or retry after
/// `Retry-After`.
#[utoipa::path(
    delete,
    path = "/v1/tasks/{id}",
    operation_id = "deleteTask",
    summary = "Delete a task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A runner is running the task now", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until the runner's lease expires unless renewed"))),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn delete_task(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    Hold::run(&state, &caller, &task.id, |state, id| async move {
        Ok(state.store.delete_task(&id).await?)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Cancels a task: it fails with outcome `{"reason": "canceled"}`.
///
/// Cancel is a change made outside any runner, so it takes the task's execution lease for the
/// moment of the write: while a runner (a worker) drives the task, it is refused with 409 and
/// `Retry-After` (the runner's lease expiry), rather than racing the runner's next commit.
/// Cancelling a task that was cancelled already returns it unchanged (200); a task that
/// completed or failed otherwise is 409.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/cancel",
    operation_id = "cancelTask",
    summary = "Cancel a task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task, now failed with reason `canceled`", body = TaskView),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task already ended, or a runner is running it now", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "When a runner holds the task: seconds until its lease expires unless renewed"))),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn cancel_task(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<axum::Json<TaskView>, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    if already_ended(&task)? {
        return Ok(axum::Json(task_view(&state, &task).await?));
    }
    let by = caller.clone();
    Hold::run(&state, &caller, &task.id, |state, id| async move {
        cancel_held(&state, &by, &id).await
    })
    .await
    .map(axum::Json)
}

/// With the lease held: the task as it is now, cancelled unless it ended meanwhile.
async fn cancel_held(state: &AppState, caller: &Caller, id: &str) -> Result<TaskView, ApiError> {
    let task = state.store.task(id).await?;
    if already_ended(&task)? {
        return task_view(state, &task).await;
    }
    let outcome = json!({"reason": "canceled", "by": caller.key_id});
    state
        .store
        .set_status(id, TaskStatus::Failed, Some(&outcome))
        .await?;
    task_view(state, &state.store.task(id).await?).await
}

/// `true` for a task cancelled before (cancel is idempotent), an error for one that ended
/// otherwise, `false` for one that can be cancelled.
fn already_ended(task: &TaskRecord) -> Result<bool, ApiError> {
    if !task.status.is_terminal() {
        return Ok(false);
    }
    if skillstate_runtime::is_canceled(task) {
        return Ok(true);
    }
    Err(ApiError::conflict(format!(
        "the task already {}; there is nothing to cancel (fork it to continue from a step)",
        match task.status {
            TaskStatus::Completed => "completed",
            _ => "failed",
        }
    )))
}
