//! A task's history: its steps, any step's state and prompt (rebuilt from the journal and
//! checked against the recorded hashes), and forks from a step. Everything shown goes through
//! the task's [`Redaction`]: write-only values read `[redacted]`.

use std::collections::BTreeMap;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use skillstate_core::json::text_hash;
use skillstate_runtime::{fork_task, rebuild_prompt};
use skillstate_store::{JournalEntry, StoreError, TaskRecord, Verdict, state_at};
use skillstate_tools::Environment;
use utoipa::{IntoParams, ToSchema};

use super::{owned_task, parse_step};
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::{ApiJson, ApiQuery};
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::{
    AnswerView, IntentView, PromptView, Redaction, StepDetail, StepPage, StepSummary, TaskView,
};

/// Steps per page when the caller gives no `limit`, and the most it may ask for.
pub const DEFAULT_STEP_PAGE: u32 = 100;
pub const MAX_STEP_PAGE: u32 = 1000;

/// The page of a step listing.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListStepsQuery {
    /// The `next_cursor` of the previous page (steps after it are listed).
    pub cursor: Option<String>,
    /// Steps per page (1-1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Lists a task's steps, in step order.
///
/// One entry per step that has an answer: committed steps, and the step in progress when it
/// has rejected answers.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/steps",
    operation_id = "listSteps",
    summary = "List a task's steps",
    tag = "journal",
    params(("id" = String, Path, description = "The task's id"), ListStepsQuery),
    responses(
        (status = 200, description = "A page of steps", body = StepPage),
        (status = 400, description = "A parameter is not valid", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn list_steps(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ListStepsQuery>,
) -> Result<axum::Json<StepPage>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_STEP_PAGE);
    if !(1..=MAX_STEP_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range; give 1 to {MAX_STEP_PAGE}"
        )));
    }
    let after = match &query.cursor {
        None => None,
        Some(cursor) => Some(cursor.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "cursor `{cursor}` is not one this server gave; pass back `next_cursor` unchanged"
            ))
        })?),
    };
    let task = owned_task(&state, &caller, &id).await?;
    let journal = state.store.journal(&task.id).await?;
    let redaction = Redaction::of_history(state.store.as_ref(), &task, Some(&journal)).await?;
    let mut by_step: BTreeMap<u64, Vec<&JournalEntry>> = BTreeMap::new();
    for entry in &journal {
        if after.is_none_or(|after| entry.step > after) {
            by_step.entry(entry.step).or_default().push(entry);
        }
    }
    let more = by_step.len() > limit as usize;
    let steps: Vec<StepSummary> = by_step
        .values()
        .take(limit as usize)
        .filter_map(|answers| StepSummary::of(answers, &redaction))
        .collect();
    let next_cursor = if more {
        steps.last().map(|s| s.step.to_string())
    } else {
        None
    };
    Ok(axum::Json(StepPage { steps, next_cursor }))
}

/// Gets one step: the observation it started from, its accepted answer (reasoning, patch,
/// action, tokens, latency, hashes), its rejected answers with their errors, and the committed
/// action with its result.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/steps/{step}",
    operation_id = "getStep",
    summary = "Get one step of a task",
    tag = "journal",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("step" = u64, Path, description = "The step, from 1")
    ),
    responses(
        (status = 200, description = "The step", body = StepDetail),
        (status = 400, description = "Not a step number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant, or no such step", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The step was compacted away", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn get_step(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, step)): Path<(String, String)>,
) -> Result<axum::Json<StepDetail>, ApiError> {
    let step = parse_step(&step)?;
    let task = owned_task(&state, &caller, &id).await?;
    let journal = state.store.journal(&task.id).await?;
    let answers: Vec<&JournalEntry> = journal.iter().filter(|e| e.step == step).collect();
    if answers.is_empty() {
        return Err(missing_step(&state, &task, step).await);
    }
    let intent = state.store.intent(&task.id, step).await?;
    let observation = state.store.observation(&task.id, step).await?;
    let redaction = Redaction::of_history(state.store.as_ref(), &task, Some(&journal)).await?;
    Ok(axum::Json(StepDetail {
        step,
        observation: observation.map(|o| redaction.text(o)),
        accepted: answers
            .iter()
            .find(|e| e.verdict == Verdict::Accepted)
            .map(|e| AnswerView::of(e, &redaction)),
        rejected: answers
            .iter()
            .filter(|e| e.verdict == Verdict::Rejected)
            .map(|e| AnswerView::of(e, &redaction))
            .collect(),
        intent: intent.as_ref().map(|i| IntentView::of(i, &redaction)),
    }))
}

/// The error for a step with no journal rows: compacted (410), or not there (404).
async fn missing_step(state: &AppState, task: &TaskRecord, step: u64) -> ApiError {
    if step == 0 {
        return ApiError::not_found(
            "step 0 is the initial state and has no answer; GET …/steps/0/state for the state",
        );
    }
    match state.store.journal_extent(&task.id).await {
        Ok(extent) if extent.base.is_some_and(|base| step <= base) => ApiError::Gone {
            detail: format!(
                "the journal up to step {} was compacted; step {step} is no longer kept",
                extent.base.unwrap_or(0)
            ),
        },
        Ok(_) => ApiError::not_found(format!(
            "the task has no answer at step {step} (it has {} accepted steps)",
            task.version
        )),
        Err(error) => error.into(),
    }
}

/// Gets a task's state as it was after a step (0: the initial state).
///
/// Rebuilt from the nearest snapshot and the journal's patches; every step's recorded state
/// hash is checked on the way.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/steps/{step}/state",
    operation_id = "getStateAtStep",
    summary = "Get the state after a step",
    tag = "journal",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("step" = u64, Path, description = "The step; 0 for the initial state")
    ),
    responses(
        (status = 200, description = "The state after the step", body = Object),
        (status = 400, description = "Not a step number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant, or no such step", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The step was compacted away", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn state_at_step(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, step)): Path<(String, String)>,
) -> Result<axum::Json<Value>, ApiError> {
    let step = parse_step(&step)?;
    let task = owned_task(&state, &caller, &id).await?;
    let value = state_at(state.store.as_ref(), &task.id, step, task.version).await?;
    Ok(axum::Json(Redaction::of_task(&task).state(value)))
}

/// Which answer of a step a prompt is rebuilt for.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PromptQuery {
    /// The answer (attempt) of the step; default: the accepted one, else the last.
    pub attempt: Option<u32>,
}

/// Gets the exact prompt the model received at a step.
///
/// Rebuilt from the journal (the state before the step, its observation, the rejections of
/// the attempt before, the transcript when the context strategy keeps one) through the same
/// rendering path as the runner; `identical` says whether its SHA-256 is the one recorded when
/// the model received it.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/steps/{step}/prompt",
    operation_id = "getPromptAtStep",
    summary = "Get the prompt of a step",
    tag = "journal",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("step" = u64, Path, description = "The step, from 1"),
        PromptQuery
    ),
    responses(
        (status = 200, description = "The prompt", body = PromptView),
        (status = 400, description = "Not a step number, or a bad parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant, no such step or attempt, or a step written through the API (no prompt)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The step was compacted away", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn prompt_at_step(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, step)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<PromptQuery>,
) -> Result<axum::Json<PromptView>, ApiError> {
    let step = parse_step(&step)?;
    let task = owned_task(&state, &caller, &id).await?;
    let journal = state.store.journal(&task.id).await?;
    let answers: Vec<&JournalEntry> = journal.iter().filter(|e| e.step == step).collect();
    if answers.is_empty() {
        return Err(missing_step(&state, &task, step).await);
    }
    let entry = match query.attempt {
        Some(attempt) => answers
            .iter()
            .find(|e| e.attempt == attempt)
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "step {step} has no attempt {attempt} (it has {} answers)",
                    answers.len()
                ))
            })?,
        None => answers
            .iter()
            .find(|e| e.verdict == Verdict::Accepted)
            .or(answers.last())
            .ok_or_else(|| ApiError::Internal("a non-empty list has no last".into()))?,
    };
    if entry.author.is_some() {
        return Err(ApiError::not_found(format!(
            "step {step} was written through the API, not answered by the model: it has no prompt"
        )));
    }
    let (prompt, recorded) =
        rebuild_prompt(state.store.as_ref(), &task, step, entry.attempt).await?;
    let text = prompt.text();
    let sha256 = text_hash(&text);
    let identical = sha256 == recorded;
    // The model saw the write-only values; whoever reads the prompt here does not.
    let redaction = Redaction::of_history(state.store.as_ref(), &task, Some(&journal)).await?;
    let shown = redaction.text(text.clone());
    let hashes = shown == text;
    Ok(axum::Json(PromptView {
        step,
        attempt: entry.attempt,
        identical,
        text: shown,
        sha256: Some(sha256).filter(|_| hashes),
        recorded_sha256: Some(recorded).filter(|_| hashes),
        tokens: entry.prompt_tokens,
    }))
}

/// Where a fork starts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The step whose state the new task starts from (0: the initial state).
    pub step: u64,
}

/// Forks a task at a step.
///
/// The new task has the state after `step`, the history up to it, the same skill, tools,
/// context and model, and belongs to the same tenant; the original is untouched. For simulated
/// worlds the world is rebuilt as it was at that step by replaying the recorded actions. A fork
/// of a board member is a member of the same board from its creation (the same skill, so the
/// same scope): its prompts show the board as it is then, and its steps write it.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/fork",
    operation_id = "forkTask",
    summary = "Fork a task at a step",
    tag = "journal",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = ForkRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The new task", body = TaskView,
            headers(("Location" = String, description = "The new task's URL"))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The step was compacted away", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No such step", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<ForkRequest>,
) -> Result<Response, ApiError> {
    let task = owned_task(&state, &caller, &id).await?;
    if request.step > task.version {
        return Err(ApiError::invalid(
            format!(
                "the task has {} accepted steps; fork at one of 0..={}",
                task.version, task.version
            ),
            vec![FieldError::new(
                "field",
                "/step",
                format!("step {} does not exist yet", request.step),
            )],
        ));
    }
    // Rebuilding a simulated world may compute at length: off the async workers, under the
    // work deadline (nothing is stored until it is back).
    let (factory, of) = (state.factory.clone(), task.clone());
    let mut world = state
        .offload
        .run("rebuilding the task's world", async move {
            factory.fork_world(&of).await
        })
        .await??;
    let env: Option<&mut dyn Environment> = match world.as_mut() {
        Some(world) => Some(world.as_mut()),
        None => None,
    };
    let forked = fork_task(state.store.as_ref(), &task.id, request.step, env)
        .await
        .map_err(|error| match error {
            skillstate_runtime::RuntimeError::Store(StoreError::NoSuchStep {
                step,
                version,
                ..
            }) => ApiError::invalid(
                format!("the task has {version} accepted steps"),
                vec![FieldError::new(
                    "field",
                    "/step",
                    format!("step {step} does not exist"),
                )],
            ),
            other => other.into(),
        })?;
    let view = super::tasks::task_view(&state, &forked).await?;
    let mut response = (StatusCode::CREATED, axum::Json(view)).into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("/v1/tasks/{}", forked.id)) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}
