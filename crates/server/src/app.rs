//! The service as one axum router, its limits, and serving it with a graceful shutdown.
//!
//! Layers, outermost first: problem details for every error ([`finish_problems`]), a tracing
//! span per request, panics caught as 500s, the request timeout (503), and the body size
//! limit (413). The JSON depth limit is applied where bodies are parsed ([`crate::json`]).
//! Outside them all, every request is counted and timed by its route template
//! ([`crate::metrics`]). /healthz, /readyz, /metrics, /openapi.json and the web viewer's assets
//! ([`crate::viewer`]) are open; everything under /v1 needs an API key
//! ([`crate::auth`]). The request timeout bounds a response's head only, so event streams
//! ([`crate::routes::events`]) stay open; [`serve`] tells them when the shutdown starts.

use std::collections::BTreeMap;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use skillstate_core::secrets::Redactor;
use skillstate_providers::Price;
use skillstate_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::auth::require_key;
use crate::factory::TaskFactory;
use crate::offload::Offload;
use crate::policy::ServicePolicy;
use crate::problem::finish_problems;
use crate::routes::{
    batches, board_events, board_upgrade, boards, events, inbox, journal, ops, provenance, recall,
    state, tasks, upgrade,
};

/// The service's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest request body read, in bytes (413 beyond).
    pub body_limit: usize,
    /// Deepest nesting of arrays and objects in a JSON body (400 beyond).
    pub max_json_depth: usize,
    /// How long one request may take before it is stopped with a 503.
    pub request_timeout: Duration,
    /// Most tasks in one batch create.
    pub max_batch: usize,
    /// After the shutdown signal, how long open requests may still finish.
    pub shutdown_grace: Duration,
    /// How often an event stream looks for new events once it has sent every stored one.
    pub events_poll: Duration,
    /// How long an event stream may stay silent before it sends a keep-alive comment.
    pub events_keep_alive: Duration,
    /// Threads for the CPU-heavy work requests trigger ([`crate::offload`]): at most this many
    /// run at once, abandoned ones included.
    pub work_threads: usize,
    /// How long a request waits for its CPU-heavy work before it answers 503 (less than
    /// `request_timeout`, so the problem says what took long).
    pub work_timeout: Duration,
}

/// 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;
pub const DEFAULT_MAX_JSON_DEPTH: usize = 64;
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_BATCH: usize = 100;
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_EVENTS_POLL: Duration = Duration::from_millis(200);
pub const DEFAULT_EVENTS_KEEP_ALIVE: Duration = Duration::from_secs(15);
pub const DEFAULT_WORK_THREADS: usize = 4;
pub const DEFAULT_WORK_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            events_poll: DEFAULT_EVENTS_POLL,
            events_keep_alive: DEFAULT_EVENTS_KEEP_ALIVE,
            work_threads: DEFAULT_WORK_THREADS,
            work_timeout: DEFAULT_WORK_TIMEOUT,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub factory: Arc<dyn TaskFactory>,
    pub config: Arc<ServerConfig>,
    /// What requests may name on this server ([`crate::policy`]).
    pub(crate) policy: Arc<ServicePolicy>,
    /// Where CPU-heavy request work runs ([`crate::offload`]).
    pub(crate) offload: Offload,
    /// The OpenAPI document, serialised once.
    pub(crate) openapi: Arc<str>,
    /// Set when the server's shutdown starts; event streams end on it.
    pub(crate) shutdown: ShutdownNotice,
    /// A bench's results.json, served read-only to the web viewer ([`crate::viewer`]).
    pub(crate) bench: Option<Bytes>,
    /// Prices by model spec (`[prices]` of skillstate.toml), for the cost in task and batch
    /// responses; a model without one has no cost.
    pub(crate) prices: Arc<BTreeMap<String, Price>>,
    /// The hex SHA-256 of the local key of `skillstate view` ([`crate::auth`]), held in
    /// memory only.
    pub(crate) local_key: Option<Arc<str>>,
    /// The operator's secret values: a request body is outside text, and what an error quotes
    /// of it is redacted of them (`json.rs`).
    pub(crate) secrets: Arc<Redactor>,
}

/// Tells long-lived responses (event streams) that the server is shutting down, so the
/// graceful shutdown does not wait on them.
#[derive(Clone)]
pub(crate) struct ShutdownNotice(Arc<watch::Sender<bool>>);

impl ShutdownNotice {
    fn new() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }

    /// Starts the shutdown: every watcher sees it, now and later.
    pub(crate) fn begin(&self) {
        self.0.send_replace(true);
    }

    pub(crate) fn watch(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, factory: Arc<dyn TaskFactory>) -> Self {
        Self::with_config(store, factory, ServerConfig::default())
    }

    pub fn with_config(
        store: Arc<dyn Store>,
        factory: Arc<dyn TaskFactory>,
        config: ServerConfig,
    ) -> Self {
        let offload = Offload::new(
            config.work_threads,
            config.work_timeout.min(config.request_timeout),
        );
        Self {
            store,
            factory,
            policy: Arc::new(ServicePolicy::default()),
            offload,
            config: Arc::new(config),
            openapi: Arc::from(crate::openapi::document_json()),
            shutdown: ShutdownNotice::new(),
            bench: None,
            prices: Arc::default(),
            local_key: None,
            secrets: Arc::default(),
        }
    }

    /// What create requests may name: skills, models, environment settings (the default
    /// allows the `oracle` model only).
    pub fn with_policy(mut self, policy: ServicePolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Secret values that no problem quoting a request body repeats.
    pub fn with_secrets(mut self, secrets: Redactor) -> Self {
        self.secrets = Arc::new(secrets);
        self
    }

    /// Prices by model spec, for the estimated cost in task and batch responses.
    pub fn with_prices(mut self, prices: BTreeMap<String, Price>) -> Self {
        self.prices = Arc::new(prices);
        self
    }

    /// Serves `results` (a bench's results.json) read-only at `/viewer/bench.json`, for the
    /// web viewer's bench page.
    pub fn with_bench_results(mut self, results: Vec<u8>) -> Self {
        self.bench = Some(Bytes::from(results));
        self
    }

    /// Accepts `secret` as the local key of `skillstate view`: a key that sees every task,
    /// board and batch of the database (of any tenant, or none) and creates nothing. Only its
    /// hash is kept, in this state (never in the store), so it works while this state is
    /// served and with nothing else.
    pub fn with_local_key(mut self, secret: &str) -> Self {
        self.local_key = Some(Arc::from(crate::auth::hash_secret(secret)));
        self
    }

    /// Ends the event streams of this state's routers (each sends a final `shutdown` event),
    /// and every stream opened later at once. [`serve`] does this when its shutdown starts;
    /// call it when serving [`router`] by other means.
    pub fn begin_shutdown(&self) {
        self.shutdown.begin();
    }
}

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
        .route("/openapi.json", get(ops::openapi))
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
