//! Assembling the service and serving it: the router over every route module, its layers, and
//! serving it with a graceful shutdown. Nothing imports this module but `lib.rs`: the routes
//! take what they share from [`crate::context`] (the state, the task id shape) and its
//! neighbours (`auth`, `json`, `problem`, `config`), never from here.
//!
//! Layers, outermost first: problem details for every error ([`finish_problems`]), a tracing
//! span per request, panics caught as 500s, the request timeout (503), and the body size
//! limit (413). The JSON depth limit is applied where bodies are parsed ([`crate::json`]).
//! Outside them all, every request is counted and timed by its route template
//! ([`crate::metrics`]). /healthz, /readyz, /metrics, /openapi.json and the web viewer's assets
//! ([`crate::viewer`]) are open; everything under /v1 needs an API key
//! ([`crate::auth`]). The request timeout bounds a response's head only, so event streams
//! ([`crate::routes::events`]) stay open; [`serve`] tells them when the shutdown starts.

use std::future::{Future, IntoFuture};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::auth::require_key;
use crate::context::{AppState, ShutdownNotice};
use crate::problem::finish_problems;
use crate::routes::{
    batches, board_events, board_upgrade, boards, events, inbox, journal, ops, provenance, recall,
    state, tasks, upgrade,
};

/// The whole service. Installs the process's metrics recorder on first use
/// ([`crate::metrics::install`]).
pub fn router(state: AppState) -> Router {
    crate::metrics::install();
    let v1 = Router::new()
        .route("/v1/tasks", post(tasks::create_task).get(tasks::list_tasks))
        .route("/v1/tasks:batch", post(tasks::create_tasks))
        .route("/v1/tasks:upgrade", post(upgrade::upgrade_tasks))
        // POST is `/v1/tasks/{id}:upgrade`: the router cannot end a parameter with a suffix.
        .route(
            "/v1/tasks/{id}",
            get(tasks::get_task)
                .delete(tasks::delete_task)
                .post(upgrade::task_method),
        )
        .route("/v1/tasks/{id}/cancel", post(tasks::cancel_task))
        .route(
            crate::auth::STATE_ROUTE,
            get(state::get_state).patch(state::patch_state),
        )
        .route(
            "/v1/tasks/{id}/state/provenance",
            get(provenance::state_provenance),
        )
        .route("/v1/tasks/{id}/journal", get(recall::search_journal))
        .route("/v1/tasks/{id}/steps", get(journal::list_steps))
        .route("/v1/tasks/{id}/steps/{step}", get(journal::get_step))
        .route(
            "/v1/tasks/{id}/steps/{step}/state",
            get(journal::state_at_step),
        )
        .route(
            "/v1/tasks/{id}/steps/{step}/prompt",
            get(journal::prompt_at_step),
        )
        .route("/v1/tasks/{id}/fork", post(journal::fork))
        .route(
            "/v1/tasks/{id}/messages",
            post(inbox::send_message).get(inbox::list_messages),
        )
        .route("/v1/tasks/{id}/approve", post(inbox::approve))
        .route("/v1/tasks/{id}/reject", post(inbox::reject))
        .route("/v1/tasks/{id}/reply", post(inbox::reply))
        .route("/v1/tasks/{id}/resume", post(inbox::resume))
        .route("/v1/tasks/{id}/events", get(events::task_events))
        .route("/v1/events", get(events::tenant_events))
        .route("/v1/batches", get(batches::list_batches))
        .route("/v1/batches/{id}", get(batches::get_batch))
        .route("/v1/batches/{id}/stop", post(batches::stop_batch))
        .route("/v1/batches/{id}/reopen", post(batches::reopen_batch))
        .route(
            "/v1/boards",
            post(boards::create_board).get(boards::list_boards),
        )
        // POST is `/v1/boards/{id}:upgrade`, split off as for tasks.
        .route(
            "/v1/boards/{id}",
            get(boards::get_board).post(board_upgrade::board_method),
        )
        .route(
            "/v1/boards/{id}/state",
            get(boards::get_board_state).patch(boards::patch_board_state),
        )
        .route("/v1/boards/{id}/writes", get(boards::list_board_writes))
        .route("/v1/boards/{id}/events", get(board_events::board_events))
        .route(
            "/v1/boards/{id}/writes/{version}/state",
            get(boards::board_state_at_version),
        )
        .route_layer(from_fn_with_state(state.clone(), require_key));
    let config = state.config.clone();
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(crate::metrics::metrics))
        .route("/openapi.json", get(crate::openapi::serve_document))
        .merge(crate::viewer::routes())
        .merge(v1)
        .with_state(state)
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(config.body_limit))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            config.request_timeout,
        ))
        .layer(CatchPanicLayer::new())
        .layer(TraceLayer::new_for_http())
        .layer(from_fn_with_state(config, finish_problems))
        .layer(from_fn(crate::metrics::track))
        .layer(from_fn(crate::trace::trace_request))
}

/// Serves the service on `listener` until `shutdown` completes; then stops accepting, ends
/// the open event streams (each with a final `shutdown` event), lets other open requests
/// finish for at most `shutdown_grace`, and returns.
///
/// Each call has a shutdown notice of its own, so a state served again after a shutdown (a
/// restart in the same process) streams events again.
pub async fn serve<F>(listener: TcpListener, state: AppState, shutdown: F) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let grace = state.config.shutdown_grace;
    let state = AppState {
        shutdown: ShutdownNotice::new(),
        ..state
    };
    let notice = state.shutdown.clone();
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        notice.begin();
        let _ = stopping_tx.send(());
    };
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(signal);
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        result = &mut server => result,
        _ = async {
            // The signal fired (a dropped sender means the server ended first: wait forever,
            // the other branch returns).
            if stopping_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(
                grace_secs = grace.as_secs_f64(),
                "requests still open after the shutdown grace period; stopping without them"
            );
            Ok(())
        }
    }
}
