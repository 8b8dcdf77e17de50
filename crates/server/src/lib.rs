//! The skillstate service: an HTTP API over the store and the runtime (docs/service.md, "Running as a
//! service").
//!
//! Other systems create tasks, read their state (ETag = version) and journal, rebuild any
//! step's state and prompt, fork, and follow events live (Server-Sent Events), under
//! per-tenant API keys. Every /v1 route needs
//! `Authorization: Bearer <key>`; a tenant sees only its own tasks (another tenant's task is a
//! 404, exactly like a missing one); every error is RFC 9457 `application/problem+json`; the
//! OpenAPI 3.1 document at /openapi.json is generated from the handlers.
//!
//! The binary wires it: it opens the store, implements [`TaskFactory`] with its environments
//! and tool boxes, and calls [`serve`].
//!
//! Modules, one concept each: `config` (the service's settings), `context` (what every handler
//! shares: the state), `key_secret` (making and hashing key secrets), `problem` (errors →
//! problem details), `json` (reading bodies
//! under the limits), `auth` (keys and tenants), `policy` (what a request may name on the server:
//! skills, models, path settings; the factory only ever sees resolved requests), `offload`
//! (CPU-heavy request work on bounded threads, under a deadline), `factory` (resolved create
//! requests → tasks), `views`
//! (what responses look like), `routes` (the handlers), `openapi` (the document), `metrics`
//! (Prometheus: the recorder, request counting, `/metrics`), `viewer` (the web viewer's
//! embedded page at `/`), `batch_report` (a batch's figures, shared with `skillstate batch
//! status`), `app` (the router, its layers, serving).
//!
//! Dependencies point one way: `config` ← `problem` ← `offload`, `policy`, `factory` ←
//! `context` ← `auth`, `json` ← the route modules (`routes`, `viewer`, `metrics`) ← `openapi`
//! ← `app`. No route imports `app` or `openapi` (tests/rooms.rs checks it).

mod app;
mod auth;
pub mod batch_report;
mod board_turns;
mod config;
mod context;
mod factory;
mod json;
mod key_secret;
pub mod metrics;
mod offload;
mod openapi;
pub mod policy;
mod problem;
pub mod routes;
mod trace;
mod viewer;
mod views;

pub use app::{router, serve};
pub use auth::{Caller, LOCAL_KEY_ID};
pub use config::{
    DEFAULT_BODY_LIMIT, DEFAULT_EVENTS_KEEP_ALIVE, DEFAULT_EVENTS_POLL, DEFAULT_MAX_BATCH,
    DEFAULT_MAX_JSON_DEPTH, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WORK_THREADS,
    DEFAULT_WORK_TIMEOUT, PublicUrl, PublicUrlError, ServerConfig,
};
pub use context::AppState;
pub use factory::{
    ContextName, CreateTaskRequest, TaskFactory, UpgradeTarget, check_initial_state, check_request,
    skill_dir,
};
pub use json::{nesting_exceeds, parse_body};
pub use key_secret::{SECRET_PREFIX, hash_secret, new_key_secret};
pub use metrics::{metrics_router, serve_metrics};
pub use openapi::{ApiDoc, document, document_json, document_value};
pub use policy::{ResolvedRequest, ResolvedSkill, ServicePolicy};
pub use problem::{ApiError, FieldError, PROBLEM_JSON, Problem};
pub use viewer::CONTENT_SECURITY_POLICY;
pub use views::*;
