//! What every handler shares: the service's state ([`AppState`]: the store, the factory, the
//! policy, the offload pool, the configuration, the shutdown notice) and the shape of a task
//! id as a path names it ([`is_task_id`]).
//!
//! The crate's rooms: this module, with [`crate::config`], [`crate::problem`],
//! [`crate::auth`] and [`crate::json`] (the extractors: the caller of a key, JSON bodies and
//! query strings), is what route modules (`crate::routes`, `crate::viewer`, `crate::metrics`)
//! depend on; it depends on no route, on the OpenAPI document (`openapi.rs`) nor on `app.rs`,
//! which alone assembles the router from the routes and serves it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use skillstate_core::secrets::Redactor;
use skillstate_providers::Price;
use skillstate_store::Store;
use tokio::sync::watch;

use crate::board_turns::BoardTurns;
use crate::config::ServerConfig;
use crate::factory::TaskFactory;
use crate::offload::Offload;
use crate::policy::ServicePolicy;

/// Whether `id` is a task id as the store makes them: a lower-case hyphenated UUID. Anything
/// else is never passed to the store, whose lookups also accept id prefixes.
pub(crate) fn is_task_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|uuid| uuid.hyphenated().to_string() == id)
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
    /// Board writes of this process take turns per board ([`crate::board_turns`]).
    pub(crate) board_turns: Arc<BoardTurns>,
}

/// Tells long-lived responses (event streams) that the server is shutting down, so the
/// graceful shutdown does not wait on them.
#[derive(Clone)]
pub(crate) struct ShutdownNotice(Arc<watch::Sender<bool>>);

impl ShutdownNotice {
    pub(crate) fn new() -> Self {
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
            shutdown: ShutdownNotice::new(),
            bench: None,
            prices: Arc::default(),
            local_key: None,
            secrets: Arc::default(),
            board_turns: Arc::new(BoardTurns::new()),
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
        self.local_key = Some(Arc::from(crate::key_secret::hash_secret(secret)));
        self
    }

    /// Ends the event streams of this state's routers (each sends a final `shutdown` event),
    /// and every stream opened later at once. [`crate::serve`] does this when its shutdown starts;
    /// call it when serving [`crate::router`] by other means.
    pub fn begin_shutdown(&self) {
        self.shutdown.begin();
    }
}
