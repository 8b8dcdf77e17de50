//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` annotations and the
//! types' `ToSchema` derives, so it cannot drift from the code. Every operation has an
//! operationId, a summary, its request and response schemas and its problem responses, so the
//! document imports into tools that consume OpenAPI (client generators, agent frameworks'
//! OpenAPI toolkits).

use std::sync::LazyLock;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::batch_report::{BatchInfo, Counts, Metrics, Percentiles, Standing, TaskRow};
use crate::factory::{ContextName, CreateTaskRequest};
use crate::problem::{FieldError, Problem};
use crate::routes::batches::{BatchListItem, BatchPage, BatchView, StopBatchRequest};
use crate::routes::board_events::BoardEventView;
use crate::routes::board_upgrade::{BoardUpgradeRequest, BoardUpgradeView};
use crate::routes::events::{EventKindName, EventView};
use crate::routes::inbox::{
    ApproveRequest, MessageKindName, MessageList, MessageRequest, MessageView, RejectRequest,
};
use crate::routes::journal::ForkRequest;
use crate::routes::recall::SearchOrder;
use crate::routes::tasks::BatchCreateRequest;
use crate::routes::upgrade::{
    UpgradeOutcome, UpgradePage, UpgradeRequest, UpgradeTasksRequest, UpgradeView,
};
use crate::routes::{
    batches, board_events, board_upgrade, boards, events, inbox, journal, ops, provenance, recall,
    state, tasks, upgrade,
};
use crate::views::*;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "skillstate",
        description = "Tasks of LLM agents with explicit, validated state: create and list tasks, read their state (ETag = version), inspect their journal, rebuild any step's state and prompt, fork, follow their events live (Server-Sent Events, resumable with Last-Event-ID). Every /v1 route needs `Authorization: Bearer <API key>`; every error is RFC 9457 application/problem+json."
    ),
    paths(
        tasks::create_task,
        tasks::create_tasks,
        tasks::list_tasks,
        tasks::get_task,
        tasks::delete_task,
        tasks::cancel_task,
        upgrade::upgrade_one,
        upgrade::upgrade_tasks,
        state::get_state,
        state::patch_state,
        provenance::state_provenance,
        journal::list_steps,
        journal::get_step,
        journal::state_at_step,
        journal::prompt_at_step,
        journal::fork,
        recall::search_journal,
        inbox::send_message,
        inbox::list_messages,
        inbox::approve,
        inbox::reject,
        inbox::reply,
        inbox::resume,
        events::task_events,
        events::tenant_events,
        batches::list_batches,
        batches::get_batch,
        batches::stop_batch,
        batches::reopen_batch,
        boards::create_board,
        boards::list_boards,
        boards::get_board,
        boards::get_board_state,
        boards::patch_board_state,
        boards::list_board_writes,
        boards::board_state_at_version,
        board_upgrade::upgrade,
        board_events::board_events,
        ops::healthz,
        ops::readyz,
        serve_document,
        crate::metrics::metrics,
    ),
    components(schemas(
        Problem,
        FieldError,
        CreateTaskRequest,
        BatchCreateRequest,
        ContextName,
        ForkRequest,
        UpgradeRequest,
        UpgradeView,
        BoardUpgradeRequest,
        BoardUpgradeView,
        UpgradeTasksRequest,
        UpgradeOutcome,
        UpgradePage,
        SkillVersionView,
        TaskVersionView,
        TaskView,
        TaskListItem,
        TaskPage,
        Totals,
        ReportedTokens,
        CreatedTask,
        BatchCreated,
        StatusName,
        ForkOrigin,
        StepSummary,
        StepPage,
        StepDetail,
        AnswerView,
        IntentView,
        PromptView,
        HitKindName,
        JournalHit,
        JournalSearchPage,
        SearchOrder,
        ProvenanceView,
        ProvenanceWriteView,
        WriteAuthor,
        Health,
        EventView,
        EventKindName,
        MessageRequest,
        RejectRequest,
        ApproveRequest,
        MessageView,
        MessageKindName,
        MessageList,
        BatchListItem,
        BatchPage,
        BatchView,
        StopBatchRequest,
        BatchInfo,
        Counts,
        Metrics,
        Percentiles,
        Standing,
        TaskRow,
        CreateBoardRequest,
        BoardView,
        BoardListItem,
        BoardList,
        AuthorKind,
        AuthorView,
        BoardWriteView,
        BoardWritePage,
        BoardEventView,
    )),
    modifiers(&BearerKey),
    tags(
        (name = "tasks", description = "Tasks as wholes"),
        (name = "state", description = "A task's current state, and where its values came from"),
        (name = "journal", description = "A task's history: steps, time travel, forks, search"),
        (name = "inbox", description = "Talking to a task: messages, and decisions on its pauses (approve, reject, reply)"),
        (name = "batches", description = "Batches of tasks, their figures (counts, tokens, cost, ETA), and stopping and reopening them"),
        (name = "boards", description = "Shared states that several tasks and API clients read and write, each write under the concurrent-write rule"),
        (name = "events", description = "Live events (Server-Sent Events) with durable, resumable ids"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// The `api_key` security scheme: `Authorization: Bearer <secret>`.
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("skillstate API key (sk_…)")
                    .description(Some(
                        "An API key made with `skillstate keys create`; its tenant owns the tasks it creates",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc
}

/// The document as JSON text.
pub fn document_json() -> String {
    document().to_json().unwrap_or_else(|error| {
        format!("{{\"error\": \"the OpenAPI document failed to serialise: {error}\"}}")
    })
}

/// The document as JSON text, serialised once per process.
static DOCUMENT_JSON: LazyLock<String> = LazyLock::new(document_json);

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    summary = "The OpenAPI document",
    tag = "operations",
    responses((status = 200, description = "This API's OpenAPI 3.1 document", body = Object))
)]
pub async fn serve_document() -> Response {
    let mut response = DOCUMENT_JSON.as_str().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
