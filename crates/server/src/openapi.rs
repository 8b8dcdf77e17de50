//! The OpenAPI 3.1 document, generated from the handlers' `#[utoipa::path]` annotations and the
//! types' `ToSchema` derives, so it cannot drift from the code. Every operation has an
//! operationId, a summary, its request and response schemas and its problem responses, so the
//! document imports into tools that consume OpenAPI (client generators, agent frameworks'
//! OpenAPI toolkits).
//!
//! What the router's layers and extractors answer is added to every operation they apply to by
//! [`LayerResponses`], so no route can forget one: 413, 500 and 503 everywhere (the body limit,
//! caught panics, the request timeout), 401 and 403 under /v1 (the key check), 400, 415 and 422
//! wherever a body is read, 400 wherever a query string is.
//!
//! `servers` names where the document was fetched from ([`serve_document`]): the operator's
//! public URL when one is configured, otherwise `http://` and the request's `Host` (never an
//! `X-Forwarded-*` header, which any client can send).
//!
//! Nullable values are spelled as readers written for OpenAPI 3.0 take them (an optional
//! parameter without `"null"`, `anyOf` with `{"type": "null"}` elsewhere; [`plain_nullables`]),
//! so LangChain's OpenAPI tooling imports every operation (scripts/openapi-langchain).

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::batch_report::{BatchInfo, Counts, Metrics, Percentiles, Standing, TaskRow};
use crate::context::AppState;
use crate::factory::{ContextName, CreateTaskRequest};
use crate::problem::{FieldError, Problem};
use crate::routes::batches::{BatchListItem, BatchPage, BatchView, StopBatchRequest};
use crate::routes::board_events::BoardEventView;
use crate::routes::board_upgrade::{BoardUpgradeRequest, BoardUpgradeView};
use crate::routes::events::{EventKindName, EventView};
use crate::routes::inbox::{
    ApproveRequest, DeliveryName, MessageKindName, MessageList, MessageRequest, MessageView,
    RejectRequest,
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
        DeliveryName,
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
    modifiers(&BearerKey, &LayerResponses),
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

/// The document as JSON text: [`document_value`], without `servers`.
pub fn document_json() -> String {
    document_value().to_string()
}

/// The document as JSON, in the form its consumers read: [`document`] with nullable values
/// spelled for readers that predate OpenAPI 3.1's type arrays ([`plain_nullables`]).
pub fn document_value() -> serde_json::Value {
    match serde_json::to_value(document()) {
        Ok(mut value) => {
            plain_nullables(&mut value);
            value
        }
        Err(error) => serde_json::json!({
            "error": format!("the OpenAPI document failed to serialise: {error}")
        }),
    }
}

/// Keywords that describe a schema rather than constrain a type: they stay beside `anyOf`.
const ANNOTATIONS: [&str; 9] = [
    "description",
    "title",
    "example",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// Rewrites `"type": [T, "null"]` (what utoipa makes of an `Option<T>`) into the same set of
/// values in the form OpenAPI tooling written for 3.0 reads — LangChain's `APIOperation`
/// refuses a type array:
///
/// - an optional parameter's schema loses `"null"`: a parameter is absent or a string on the
///   wire, never JSON null;
/// - any other schema becomes `anyOf: [{"type": T, …its constraints}, {"type": "null"}]`, its
///   annotations (description, example, …) kept beside. The constraints (`maxLength`,
///   `minimum`, `properties`, …) apply to T's values only, in either form, so both accept
///   exactly the same instances.
fn plain_nullables(doc: &mut serde_json::Value) {
    use serde_json::Value;
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for operation in item.values_mut() {
                let parameters = operation
                    .get_mut("parameters")
                    .and_then(Value::as_array_mut);
                for parameter in parameters.into_iter().flatten() {
                    if parameter.get("required") == Some(&Value::Bool(true)) {
                        continue;
                    }
                    let Some(types) = parameter
                        .get_mut("schema")
                        .and_then(|schema| schema.get_mut("type"))
                    else {
                        continue;
                    };
                    if let Some(list) = types.as_array() {
                        let kept: Vec<Value> = list
                            .iter()
                            .filter(|t| t.as_str() != Some("null"))
                            .cloned()
                            .collect();
                        *types = match <[Value; 1]>::try_from(kept) {
                            Ok([one]) => one,
                            Err(many) => Value::Array(many),
                        };
                    }
                }
            }
        }
    }
    any_of_null(doc);
}

/// The `anyOf` rewrite of [`plain_nullables`], everywhere below `value` but inside example
/// and constant values (which are data, not schemas).
fn any_of_null(value: &mut serde_json::Value) {
    use serde_json::{Map, Value};
    match value {
        Value::Array(items) => items.iter_mut().for_each(any_of_null),
        Value::Object(object) => {
            for (key, child) in object.iter_mut() {
                if !matches!(
                    key.as_str(),
                    "example" | "examples" | "default" | "enum" | "const"
                ) {
                    any_of_null(child);
                }
            }
            let Some(Value::Array(types)) = object.get("type") else {
                return;
            };
            let others: Vec<Value> = types
                .iter()
                .filter(|t| t.as_str() != Some("null"))
                .cloned()
                .collect();
            if others.len() == types.len() || others.is_empty() {
                return;
            }
            let mut kept = Map::new();
            let mut constraints = Map::new();
            for (key, child) in std::mem::take(object) {
                if key == "type" {
                    continue;
                }
                if ANNOTATIONS.contains(&key.as_str()) {
                    kept.insert(key, child);
                } else {
                    constraints.insert(key, child);
                }
            }
            let mut branches: Vec<Value> = others
                .into_iter()
                .map(|kind| {
                    let mut branch = Map::new();
                    branch.insert("type".to_owned(), kind);
                    branch.extend(constraints.clone());
                    Value::Object(branch)
                })
                .collect();
            branches.push(serde_json::json!({"type": "null"}));
            object.insert("anyOf".to_owned(), Value::Array(branches));
            object.extend(kept);
        }
        _ => {}
    }
}

/// What the layers and extractors of the router answer, added to each operation they apply
/// to (the description of a status the handler documents itself is kept).
pub struct LayerResponses;

impl Modify for LayerResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, operation) in operations_mut(item) {
                for (status, description) in layer_statuses(path, method, operation) {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| problem_response(description));
                }
            }
        }
    }
}

/// A path's operations with their methods.
fn operations_mut(item: &mut PathItem) -> Vec<(&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("put", item.put.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
        ("options", item.options.as_mut()),
        ("head", item.head.as_mut()),
        ("patch", item.patch.as_mut()),
        ("trace", item.trace.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|operation| (method, operation)))
    .collect()
}

/// The statuses the layers of `app.rs`, the key check of `auth.rs` and the extractors of
/// `json.rs` can answer for `method path`, each with what it means.
fn layer_statuses(path: &str, method: &str, operation: &Operation) -> Vec<(u16, &'static str)> {
    let mut statuses = vec![
        // RequestBodyLimitLayer refuses a declared Content-Length beyond the limit on every
        // route, before routing; a body read past it is refused where it is read.
        (
            413,
            "The request body is larger than the server's body limit",
        ),
        (500, "Internal error (nothing of it is shown)"),
        (
            503,
            "The request took longer than the server allows and was stopped",
        ),
    ];
    if path.starts_with("/v1/") {
        statuses.push((401, "Missing, malformed, unknown or revoked API key"));
        let board_route = path == "/v1/boards" || path.starts_with("/v1/boards/");
        let creates =
            method == "post" && matches!(path, "/v1/tasks" | "/v1/tasks:batch" | "/v1/boards");
        if !board_route || creates {
            statuses.push((
                403,
                "This key may not do this: a key limited to board pointers works only on /v1/boards; the local key of `skillstate view` creates nothing",
            ));
        }
    }
    if operation.request_body.is_some() {
        statuses.push((
            400,
            "Malformed JSON, or JSON nested deeper than the server allows",
        ));
        statuses.push((415, "Not a JSON body (see the request body's media types)"));
        statuses.push((
            422,
            "The body does not fit the request's schema; `errors` names each field",
        ));
    }
    let has_query = operation.parameters.iter().flatten().any(|parameter| {
        matches!(parameter, RefOr::T(parameter) if matches!(parameter.parameter_in, ParameterIn::Query))
    });
    if has_query {
        statuses.push((400, "A query parameter does not fit; the detail names it"));
    }
    statuses
}

/// A problem+json response described by `description`.
fn problem_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                crate::problem::PROBLEM_JSON,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build(),
    )
}

/// The document without `servers`, made once per process.
static DOCUMENT: LazyLock<serde_json::Value> = LazyLock::new(document_value);

/// Where the service was reached, as `servers[0].url`: the configured public URL, or
/// `http://` and the request's authority (its `Host`, or HTTP/2's `:authority`) when it is a
/// well-formed host and port; `/` (the document's own origin) when the request names none.
fn server_url(state: &AppState, headers: &HeaderMap, uri: &Uri) -> (String, bool) {
    if let Some(url) = &state.config.public_url {
        return (url.as_str().to_owned(), false);
    }
    let authority = uri.authority().map(|a| a.as_str().to_owned()).or_else(|| {
        headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .map(str::to_owned)
    });
    let checked = authority.filter(|host| {
        !host.contains('@')
            && host
                .parse::<axum::http::uri::Authority>()
                .is_ok_and(|a| a.as_str() == host)
    });
    match checked {
        Some(host) => (format!("http://{host}"), true),
        None => ("/".to_owned(), true),
    }
}

/// The OpenAPI 3.1 document of this API.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "getOpenApi",
    summary = "The OpenAPI document",
    tag = "operations",
    responses((status = 200, description = "This API's OpenAPI 3.1 document; `servers` names the address it was fetched at (the operator's public URL, when configured)", body = Object))
)]
pub async fn serve_document(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let (url, from_request) = server_url(&state, &headers, &uri);
    // `servers` right after `info`, where a reader looks for it.
    let mut doc = serde_json::Map::new();
    for (key, value) in DOCUMENT.as_object().into_iter().flatten() {
        doc.insert(key.clone(), value.clone());
        if key == "info" {
            doc.insert("servers".to_owned(), serde_json::json!([{ "url": url }]));
        }
    }
    if !doc.contains_key("servers") {
        doc.insert("servers".to_owned(), serde_json::json!([{ "url": url }]));
    }
    let mut response = serde_json::Value::Object(doc).to_string().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if from_request {
        // The document differs by the Host it was asked with.
        response
            .headers_mut()
            .insert(header::VARY, HeaderValue::from_static("host"));
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nullables_become_any_of_and_optional_parameters_plain() {
        let mut doc = json!({
            "paths": {"/x": {"get": {"parameters": [
                {"name": "after", "in": "query", "required": false, "schema": {"type": ["string", "null"]}},
                {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}
            ]}}},
            "components": {"schemas": {"A": {"type": "object", "properties": {
                "name": {"type": ["string", "null"], "description": "d", "maxLength": 3, "example": {"type": ["x", "null"]}},
                "plain": {"type": "integer"}
            }}}}
        });
        plain_nullables(&mut doc);
        assert_eq!(
            doc["paths"]["/x"]["get"]["parameters"][0]["schema"],
            json!({"type": "string"})
        );
        assert_eq!(
            doc["components"]["schemas"]["A"]["properties"]["name"],
            json!({
                "anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}],
                "description": "d",
                "example": {"type": ["x", "null"]}
            })
        );
        assert_eq!(
            doc["components"]["schemas"]["A"]["properties"]["plain"],
            json!({"type": "integer"})
        );
    }

    #[test]
    fn the_served_document_has_no_type_array() {
        fn walk(value: &serde_json::Value, at: &str) {
            match value {
                serde_json::Value::Object(object) => {
                    assert!(
                        !object.get("type").is_some_and(serde_json::Value::is_array),
                        "{at}: {value}"
                    );
                    for (key, child) in object {
                        if !matches!(key.as_str(), "example" | "examples") {
                            walk(child, &format!("{at}/{key}"));
                        }
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        walk(child, &format!("{at}/{i}"));
                    }
                }
                _ => {}
            }
        }
        walk(&document_value(), "");
    }
}
