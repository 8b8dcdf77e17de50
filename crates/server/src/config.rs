//! The service's settings ([`ServerConfig`]) and their defaults: plain data, read by the
//! state every handler shares ([`crate::context`]), by the problem layer (the limits it names)
//! and by serving ([`crate::app`]). It depends on no other module of the crate.

use std::time::Duration;

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
