//! A board's writes live, as Server-Sent Events: `GET /v1/boards/{id}/events`.
//!
//! The board's journal is its own event log: version `n` is the `n`-th write, and a write
//! commits only on top of the version before it (`Boards::commit_board_write` names the version
//! it replaces), so versions become readable in order and never with a gap. Each SSE event is
//! one write: its `id` is the version, its `event` name `write`, its `data` a
//! [`BoardEventView`]. A client that reconnects with `Last-Event-ID` (or `?after=`) set to the
//! last version it received gets every later write exactly once, across server restarts too;
//! `?after=latest` starts after the board's version when the request arrives. Nothing is stored
//! for these events beyond the journal itself.
//!
//! What a key sees is what it may read elsewhere: a tenant's key gets each write as
//! `GET /v1/boards/{id}/writes` lists it (write-only values redacted); a key limited to board
//! pointers, which may not read the journal, gets only the version (its state at that version
//! is `GET /v1/boards/{id}/writes/{version}/state`, the projection of its reads).
//!
//! Delivery, keep-alives, the `shutdown` event and the `error` event are those of the task
//! streams ([`super::events`]); a board's stream ends when the board is deleted.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::response::sse::Event;
use serde::Serialize;
use skillstate_store::{BoardWriteRecord, Store, StoreError};
use tokio::sync::watch;
use utoipa::ToSchema;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

use super::boards::owned_board;
use super::events::{
    EVENT_PAGE, EventsQuery, Start, error_event, quoted, shutdown_event, shutting_down,
    sse_response, start_position,
};
use crate::auth::Caller;
use crate::context::AppState;
use crate::json::ApiQuery;
use crate::problem::{ApiError, Problem};
use crate::views::{BoardHistory, BoardWriteView};

/// The SSE `event` name of a board write.
pub const WRITE_EVENT: &str = "write";

/// The `data` of one board event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardEventView {
    /// The board's id.
    pub board: String,
    /// The version this write made (also the event's `id`).
    pub version: u64,
    /// The write as `GET /v1/boards/{id}/writes` lists it (patch, author, whether it was
    /// rebased, when). Absent for a key limited to board pointers, which does not read the
    /// journal: it reads its part of the state at this version instead
    /// (`GET /v1/boards/{id}/writes/{version}/state`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write: Option<BoardWriteView>,
}

/// One event of a board's stream, as the SSE wire format carries it: `id` is the version,
/// `event` is `write`, `data` a [`BoardEventView`] — or, for the stream's last event, a
/// shutdown notice (`{"detail"}`) or a [`Problem`] (`error`).
pub struct BoardSseEvent;

impl utoipa::PartialSchema for BoardSseEvent {
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
                    .item(Ref::from_schema_name("BoardEventView"))
                    .item(notice)
                    .item(Ref::from_schema_name("Problem")),
            ));
        ObjectBuilder::new()
            .property(
                "id",
                text("The version the write made; send it back as Last-Event-ID to resume after it (absent on `shutdown` and `error`)"),
            )
            .property(
                "event",
                text("The event's kind").enum_values(Some([WRITE_EVENT, "shutdown", "error"])),
            )
            .property("data", data)
            .required("data")
            .into()
    }
}

impl ToSchema for BoardSseEvent {}

/// Streams a board's writes, stored ones first, then live.
#[utoipa::path(
    get,
    path = "/v1/boards/{id}/events",
    operation_id = "streamBoardEvents",
    summary = "Stream a board's writes (Server-Sent Events)",
    description = "A `text/event-stream` of the board's writes in version order: each event's `id` is the version the write made, its `event` name `write`, its `data` a BoardEventView (with the write as GET /v1/boards/{id}/writes lists it; a key limited to board pointers gets the version only). Reconnecting with `Last-Event-ID` (or `?after=`) set to the last version received resumes with no gap and no duplicate, across server restarts too; `?after=latest` starts after the board's version when the request arrives; without either, the stream starts at version 1. Keep-alive comments while idle (every 15 s by default); a final `shutdown` event when the server stops; the stream ends when the board is deleted.",
    tag = "events",
    params(
        ("id" = String, Path, description = "The board's id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this version (the `id` of the last event received); wins over `after`"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "The event stream; each event's `data` is a BoardEventView (a `shutdown` event's a notice, an `error` event's a Problem)", body = inline(BoardSseEvent), content_type = "text/event-stream"),
        (status = 400, description = "Last-Event-ID or `after` is not a version of this board", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such board for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn board_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let start = start_position(&headers, query)?;
    let board = owned_board(&state, &caller, &id).await?;
    let after = first_version(&start, board.version, &state.secrets)?;
    let mut feed = Feed {
        store: state.store.clone(),
        board: board.id.clone(),
        shown: Shown::of(
            &caller,
            BoardHistory::of(state.store.as_ref(), &board.id).await?,
        ),
        after,
        pending: VecDeque::new(),
        read_again: false,
        poll: state.config.events_poll.max(Duration::from_millis(1)),
        shutdown: state.shutdown.watch(),
        ended: false,
    };
    // The first page is read here: an unreachable store is an error response, not a broken
    // stream.
    let first = match feed.read().await {
        Ok(page) => page,
        Err(Stop::Gone) => return Err(ApiError::no_board(&id)),
        Err(Stop::Failed(error)) => return Err(error.into()),
    };
    feed.take(first);
    let events = futures_util::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok::<_, Infallible>(event), feed))
    });
    Ok(sse_response(&state, events))
}

/// The version the stream resumes after: the one named (at most the board's), the board's
/// own for `latest`, 0 (from the first write) when none is named.
fn first_version(
    start: &Start,
    current: u64,
    secrets: &skillstate_core::secrets::Redactor,
) -> Result<u64, ApiError> {
    if start.latest {
        return Ok(current);
    }
    let Some(text) = &start.after else {
        return Ok(0);
    };
    match text.parse::<u64>() {
        Ok(version) if version <= current => Ok(version),
        _ => Err(ApiError::bad_request(format!(
            "{} `{}` is not a version of this board (it is at version {current}); send back the `id` of an event this stream sent, `latest` to start from now, or leave it out to start from the first write",
            start.named_by,
            quoted(text, secrets)
        ))),
    }
}

/// What a caller is shown of each write.
enum Shown {
    /// The journal's row, its write-only values redacted by every schema the board had.
    Write {
        history: BoardHistory,
        show_hash: bool,
    },
    /// The version only (a key limited to board pointers).
    Version,
}

impl Shown {
    fn of(caller: &Caller, history: BoardHistory) -> Self {
        match caller.scope {
            Some(_) => Shown::Version,
            None => Shown::Write {
                show_hash: !history.hides_values(),
                history,
            },
        }
    }
}

/// Why a feed stopped reading.
enum Stop {
    Gone,
    Failed(StoreError),
}

/// One open board stream.
struct Feed {
    store: Arc<dyn Store>,
    board: String,
    shown: Shown,
    /// The last version read.
    after: u64,
    pending: VecDeque<BoardWriteRecord>,
    /// The last read filled its page: read again without waiting.
    read_again: bool,
    poll: Duration,
    shutdown: watch::Receiver<bool>,
    ended: bool,
}

impl Feed {
    async fn read(&self) -> Result<Vec<BoardWriteRecord>, Stop> {
        let from = self.after.saturating_add(1);
        let to = self.after.saturating_add(u64::from(EVENT_PAGE));
        match self.store.board_writes(&self.board, from, to).await {
            Ok(page) => Ok(page),
            Err(StoreError::NoSuchBoard(_)) => Err(Stop::Gone),
            Err(error) => Err(Stop::Failed(error)),
        }
    }

    fn take(&mut self, page: Vec<BoardWriteRecord>) {
        self.read_again = page.len() >= EVENT_PAGE as usize;
        if let Some(last) = page.last() {
            self.after = last.version;
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
            if let Some(write) = self.pending.pop_front() {
                return Some(self.event_of(write));
            }
            let read = async {
                if !self.read_again {
                    tokio::time::sleep(self.poll).await;
                }
                self.read().await
            };
            let mut shutdown = self.shutdown.clone();
            let outcome = tokio::select! {
                outcome = read => outcome.map(Some),
                () = shutting_down(&mut shutdown) => Ok(None),
            };
            match outcome {
                Ok(Some(page)) => self.take(page),
                Ok(None) => return Some(self.end(shutdown_event())),
                Err(Stop::Gone) => {
                    self.ended = true;
                    return None;
                }
                Err(Stop::Failed(error)) => {
                    tracing::warn!(%error, board = %self.board, "reading a board's writes failed; its event stream ends");
                    return Some(self.end(error_event()));
                }
            }
        }
    }

    fn end(&mut self, event: Event) -> Event {
        self.ended = true;
        event
    }

    fn event_of(&self, write: BoardWriteRecord) -> Event {
        let shown = match &self.shown {
            Shown::Write { history, show_hash } => Some(BoardWriteView::of(
                &write,
                history.patch(write.patch.clone()),
                *show_hash,
            )),
            Shown::Version => None,
        };
        let view = BoardEventView {
            board: self.board.clone(),
            version: write.version,
            write: shown,
        };
        let data = serde_json::to_string(&view).unwrap_or_else(|error| {
            tracing::error!(%error, board = %self.board, version = write.version, "a board event did not serialise");
            "{}".to_owned()
        });
        Event::default()
            .id(write.version.to_string())
            .event(WRITE_EVENT)
            .data(data)
    }
}
