//! Live events as Server-Sent Events: one task's (`GET /v1/tasks/{id}/events`) or every task's
//! of the caller's tenant (`GET /v1/events`); a board's are in [`super::board_events`], which
//! shares this module's start positions and final events.
//!
//! Each SSE event carries the store's durable position as its `id`, the event's kind as its
//! `event` name and an [`EventView`] as its `data`. A client that reconnects with
//! `Last-Event-ID` (or `?after=`; the header wins) gets every later event exactly once: the
//! store's positions never skip an event that can still appear (`skillstate_store::Events`),
//! and they are the store's, so this holds across server restarts too. `?after=latest` starts
//! from now: after the last event readable when the request arrives, reading none before it.
//!
//! Delivery: the stored events are read in pages of [`EVENT_PAGE`]; once a read comes back
//! short, the stream looks for new ones every `ServerConfig::events_poll`. A silent stream
//! sends a keep-alive comment every `ServerConfig::events_keep_alive`. When the server's
//! shutdown starts, every stream sends a final `shutdown` event and ends, so the graceful
//! shutdown does not wait on open streams; a task's stream ends when the task is deleted. A
//! store failure mid-stream ends it with an `error` event (the client resumes with its last
//! id).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashMap;

use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use skillstate_store::{EventKind, EventQuery, EventRecord, Store, StoreError};
use tokio::sync::watch;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoParams, ToSchema};

use super::owned_task;
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiQuery;
use crate::problem::{ApiError, Problem};
use crate::views::{Redaction, rfc3339};

/// Events read from the store at a time.
pub const EVENT_PAGE: u32 = 200;

/// The longest part of a refused position quoted back in a problem's detail.
const QUOTED_POSITION: usize = 64;

/// What an event says happened (also its SSE `event` name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKindName {
    /// The task was created: `{"skill", "model"}`.
    Created,
    /// A step was committed: `{"step", "patch", "action", "author"}` (`author` is null for the
    /// model, an API key's id for a state written through the API).
    Step,
    /// An answer was rejected: `{"step", "attempt", "errors"}`.
    Rejected,
    /// An action's result was recorded: `{"step", "ok"}`.
    Action,
    /// The task's status changed: `{"status", "outcome"}`.
    Status,
    /// A user message was added: `{"author"}`.
    Message,
}

impl EventKindName {
    pub fn of(kind: EventKind) -> Self {
        match kind {
            EventKind::Created => EventKindName::Created,
            EventKind::Step => EventKindName::Step,
            EventKind::Rejected => EventKindName::Rejected,
            EventKind::Action => EventKindName::Action,
            EventKind::Status => EventKindName::Status,
            EventKind::Message => EventKindName::Message,
        }
    }
}

/// Tasks whose [`Redaction`] one stream keeps; it forgets them all when more are seen.
const KEPT_REDACTIONS: usize = 1024;

/// The `data` of one SSE event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventView {
    /// The task's id.
    pub task: String,
    pub kind: EventKindName,
    /// The task's version when the event was written.
    pub step: u64,
    /// What happened, by kind (see the kinds). Values a step's patch writes at write-only
    /// locations read `[redacted]`, and so does every write-only value of the task's state
    /// anywhere else (action arguments, outcomes, error messages).
    pub data: Value,
    pub created_at: String,
}

impl EventView {
    pub(crate) fn of(record: &EventRecord, redaction: &Redaction) -> Self {
        let data = match record.data.clone() {
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| {
                        let shown = match key.as_str() {
                            "patch" => redaction.patch(value),
                            // Counters, not values.
                            "step" | "attempt" => value,
                            _ => redaction.json(value),
                        };
                        (key, shown)
                    })
                    .collect(),
            ),
            other => redaction.json(other),
        };
        Self {
            task: record.task.clone(),
            kind: EventKindName::of(record.kind),
            step: record.step,
            data,
            created_at: rfc3339(record.created_at),
        }
    }
}

/// One event of a stream, as the SSE wire format carries it (OpenAPI 3.1: the schema of a
/// `text/event-stream` response describes each event): `id` is the event's durable position,
/// `event` its kind, `data` JSON — an [`EventView`], or for the stream's last event a shutdown
/// notice (`{"detail"}`) or a [`Problem`] (`error`).
pub struct SseEvent;

impl utoipa::PartialSchema for SseEvent {
    fn schema() -> RefOr<Schema> {
        let text = |description: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(description))
        };
        let notice = ObjectBuilder::new()
            .title(Some("ShutdownNotice"))
            .property("detail", text("Why the stream ends, and how to resume it"))
            .required("detail");
        let data = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("The event's JSON"))
            .content_media_type("application/json")
            .content_schema(Some(
                AnyOfBuilder::new()
                    .item(Ref::from_schema_name("EventView"))
                    .item(notice)
                    .item(Ref::from_schema_name("Problem")),
            ));
        let kinds = [
            "created", "step", "rejected", "action", "status", "message", "shutdown", "error",
        ];
        ObjectBuilder::new()
            .property(
                "id",
                text("The event's durable position; send it back as Last-Event-ID to resume after it (absent on `shutdown` and `error`)"),
            )
            .property(
                "event",
                text("The event's kind").enum_values(Some(kinds)),
            )
            .property("data", data)
            .required("data")
            .into()
    }
}

impl ToSchema for SseEvent {}

/// Where a stream starts.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Resume after this event's position (an SSE `id` this server sent), or `latest`: start
    /// after the last event readable now, so only later events come (none of the past is
    /// read). The `Last-Event-ID` header wins over it. Without either, the stream starts at
    /// the first stored event.
    pub after: Option<String>,
}

/// The `after` value that starts a stream from now.
pub const AFTER_LATEST: &str = "latest";

/// Streams one task's events, stored ones first, then live.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/events",
    operation_id = "streamTaskEvents",
    summary = "Stream a task's events (Server-Sent Events)",
    description = "A `text/event-stream` of the task's events in commit order. Each event's `id` is its durable position, its `event` name its kind (`created`, `step`, `rejected`, `action`, `status`, `message`) and its `data` an EventView. Reconnecting with `Last-Event-ID` (or `?after=`) resumes with no gap and no duplicate, across server restarts too; `?after=latest` starts after the last event readable now, reading none of the past. Keep-alive comments while idle (every 15 s by default); a final `shutdown` event when the server stops; the stream ends when the task is deleted.",
    tag = "events",
    params(
        ("id" = String, Path, description = "The task's id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event's position (the `id` of the last event received); wins over `after`"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "The event stream; each event's `data` is an EventView (a `shutdown` event's a notice, an `error` event's a Problem)", body = inline(SseEvent), content_type = "text/event-stream"),
        (status = 400, description = "The position in Last-Event-ID or `after` is not one of this server's", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn task_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let start = start_position(&headers, query)?;
    let task = owned_task(&state, &caller, &id).await?;
    stream(&state, &caller, Some(task.id), start).await
}

/// Streams the events of every task of the caller's tenant, stored ones first, then live.
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "streamEvents",
    summary = "Stream the events of every task of this tenant (Server-Sent Events)",
    description = "A `text/event-stream` of the events of all the tenant's tasks, in commit order; the same events as each task's stream, interleaved. Each event's `id` is its durable position, its `event` name its kind and its `data` an EventView (with the task's id). Reconnecting with `Last-Event-ID` (or `?after=`) resumes with no gap and no duplicate, across server restarts too; `?after=latest` starts after the last event readable now, reading none of the past. Keep-alive comments while idle (every 15 s by default); a final `shutdown` event when the server stops.",
    tag = "events",
    params(
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event's position (the `id` of the last event received); wins over `after`"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "The event stream; each event's `data` is an EventView (a `shutdown` event's a notice, an `error` event's a Problem)", body = inline(SseEvent), content_type = "text/event-stream"),
        (status = 400, description = "The position in Last-Event-ID or `after` is not one of this server's", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn tenant_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let start = start_position(&headers, query)?;
    stream(&state, &caller, None, start).await
}

/// Where the caller resumes, and which field said so (for the problem when it is not a
/// position).
pub(super) struct Start {
    pub(super) after: Option<String>,
    /// `?after=latest`: after the last event readable now.
    pub(super) latest: bool,
    pub(super) named_by: &'static str,
}

/// The position to resume after: `Last-Event-ID` when present, else `after`. An empty value
/// means "from the first event" (an SSE client that received no id sends none, or an empty
/// one).
pub(super) fn start_position(headers: &HeaderMap, query: EventsQuery) -> Result<Start, ApiError> {
    if let Some(value) = headers.get("last-event-id") {
        let text = value.to_str().map_err(|_| {
            ApiError::bad_request(
                "the Last-Event-ID header is not visible ASCII; send back the `id` of the last event received unchanged",
            )
        })?;
        return Ok(Start {
            after: (!text.is_empty()).then(|| text.to_owned()),
            latest: false,
            named_by: "the Last-Event-ID header",
        });
    }
    let after = query.after.filter(|after| !after.is_empty());
    let latest = after.as_deref() == Some(AFTER_LATEST);
    Ok(Start {
        after: after.filter(|_| !latest),
        latest,
        named_by: "the `after` parameter",
    })
}

/// The stream's response: the first page is read here, so a malformed position or an
/// unreachable store is an error response, not a broken stream.
async fn stream(
    state: &AppState,
    caller: &Caller,
    task: Option<String>,
    start: Start,
) -> Result<Response, ApiError> {
    let mut query = EventQuery {
        tenant: caller.tenant_filter(),
        task: task.clone(),
        after: start.after,
        limit: EVENT_PAGE,
    };
    if start.latest {
        query.after = state.store.latest_event_position(&query).await?;
    }
    let first = state
        .store
        .events_after(&query)
        .await
        .map_err(|error| match error {
            StoreError::BadEventPosition(position) => ApiError::bad_request(format!(
                "{} `{}` is not an event position of this server; send back the `id` of an event this server sent, `latest` to start from now, or leave it out to start from the first event",
                start.named_by,
                quoted(&position, &state.secrets)
            )),
            other => other.into(),
        })?;
    let mut feed = Feed {
        store: state.store.clone(),
        query,
        task,
        pending: VecDeque::new(),
        read_again: false,
        poll: state.config.events_poll.max(Duration::from_millis(1)),
        shutdown: state.shutdown.watch(),
        ended: false,
        redactions: HashMap::new(),
    };
    feed.take(first);
    let events = futures_util::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok::<_, Infallible>(event), feed))
    });
    Ok(sse_response(state, events))
}

/// The response of an event stream: keep-alive comments while idle, and no buffering by
/// proxies (nginx would hold events back).
pub(super) fn sse_response(
    state: &AppState,
    events: impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    let sse = Sse::new(events).keep_alive(
        KeepAlive::new()
            .interval(state.config.events_keep_alive)
            .text("keep-alive"),
    );
    let mut response = sse.into_response();
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// A refused position as quoted back (a header or parameter of the request: outside text):
/// redacted, then at most [`QUOTED_POSITION`] characters.
pub(super) fn quoted(position: &str, secrets: &Redactor) -> String {
    let clipped = Outside::new(position).clipped_chars(secrets, QUOTED_POSITION);
    if clipped.cut {
        format!("{}…", clipped.text)
    } else {
        clipped.text
    }
}

/// One open stream: what it reads, what it has read and not sent yet.
struct Feed {
    store: Arc<dyn Store>,
    /// `after` is the position of the last event read.
    query: EventQuery,
    /// A task's stream (ends when the task is deleted); `None` for the tenant's.
    task: Option<String>,
    pending: VecDeque<EventRecord>,
    /// The last read filled its page: read again without waiting.
    read_again: bool,
    poll: Duration,
    shutdown: watch::Receiver<bool>,
    ended: bool,
    /// What each task's events hide, loaded when the stream first meets the task and
    /// completed by every step event's patch after that.
    redactions: HashMap<String, Redaction>,
}

/// Why a feed stopped reading.
enum Stop {
    Shutdown,
    TaskGone,
    Failed(StoreError),
}

impl Feed {
    fn take(&mut self, page: Vec<EventRecord>) {
        self.read_again = page.len() >= EVENT_PAGE as usize;
        if let Some(last) = page.last() {
            self.query.after = Some(last.position.clone());
        }
        self.pending.extend(page);
    }

    /// The next SSE event; `None` once the stream is over.
    async fn next(&mut self) -> Option<Event> {
        if self.ended {
            return None;
        }
        loop {
            if *self.shutdown.borrow() {
                return Some(self.end(shutdown_event()));
            }
            if let Some(record) = self.pending.pop_front() {
                return Some(self.event_of(&record).await);
            }
            let read = async {
                if !self.read_again {
                    tokio::time::sleep(self.poll).await;
                }
                self.read().await
            };
            let mut shutdown = self.shutdown.clone();
            let outcome = tokio::select! {
                outcome = read => outcome,
                () = shutting_down(&mut shutdown) => Err(Stop::Shutdown),
            };
            match outcome {
                Ok(page) => self.take(page),
                Err(Stop::Shutdown) => return Some(self.end(shutdown_event())),
                Err(Stop::TaskGone) => {
                    self.ended = true;
                    return None;
                }
                Err(Stop::Failed(error)) => {
                    tracing::warn!(%error, "reading events failed; the event stream ends");
                    return Some(self.end(error_event()));
                }
            }
        }
    }

    /// The next page; for a task's stream, an empty page checks that the task still exists.
    async fn read(&self) -> Result<Vec<EventRecord>, Stop> {
        let page = self
            .store
            .events_after(&self.query)
            .await
            .map_err(Stop::Failed)?;
        if page.is_empty()
            && let Some(task) = &self.task
        {
            match self.store.task_tenant(task).await {
                Ok(_) => {}
                Err(StoreError::NotFound(_)) => return Err(Stop::TaskGone),
                Err(error) => return Err(Stop::Failed(error)),
            }
        }
        Ok(page)
    }

    fn end(&mut self, event: Event) -> Event {
        self.ended = true;
        event
    }

    /// The SSE event of `record`, with its task's write-only values hidden.
    async fn event_of(&mut self, record: &EventRecord) -> Event {
        if !self.redactions.contains_key(&record.task) {
            let loaded = match self.store.task(&record.task).await {
                Ok(task) if task.id == record.task => {
                    Redaction::of_history(self.store.as_ref(), &task, None)
                        .await
                        .unwrap_or_else(|_| Redaction::unknown())
                }
                _ => Redaction::unknown(),
            };
            if self.redactions.len() >= KEPT_REDACTIONS {
                self.redactions.clear();
            }
            self.redactions.insert(record.task.clone(), loaded);
        }
        let redaction = self
            .redactions
            .entry(record.task.clone())
            .or_insert_with(Redaction::unknown);
        if let Some(patch) = record.data.get("patch") {
            redaction.add_patch(patch);
        }
        event_of(record, redaction)
    }
}

/// Completes once the shutdown has started; never when nobody can start it any more.
pub(super) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stopping| *stopping).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn event_of(record: &EventRecord, redaction: &Redaction) -> Event {
    let view = EventView::of(record, redaction);
    let data = serde_json::to_string(&view).unwrap_or_else(|error| {
        tracing::error!(%error, position = %record.position, "an event did not serialise");
        "{}".to_owned()
    });
    Event::default()
        .id(record.position.as_str())
        .event(record.kind.as_str())
        .data(data)
}

/// The last event of a stream the server ends because it is shutting down.
pub(super) fn shutdown_event() -> Event {
    Event::default().event("shutdown").data(
        json!({
            "detail": "the server is shutting down; reconnect with Last-Event-ID set to the last event's id to resume where this stream ended"
        })
        .to_string(),
    )
}

/// The last event of a stream whose store read failed: a problem, without the store's text.
pub(super) fn error_event() -> Event {
    let problem = ApiError::Unavailable {
        detail: "reading events failed (it was logged); reconnect with Last-Event-ID set to the last event's id to resume where this stream ended".into(),
    }
    .problem();
    Event::default()
        .event("error")
        .data(serde_json::to_string(&problem).unwrap_or_default())
}
