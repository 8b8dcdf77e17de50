//! The service's settings ([`ServerConfig`]) and their defaults: plain data, read by the
//! state every handler shares ([`crate::context`]), by the problem layer (the limits it names)
//! and by serving ([`crate::app`]). It depends on no other module of the crate.

use std::fmt;
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
    /// The address clients reach the service at (`skillstate serve --public-url`), as the
    /// OpenAPI document's `servers` names it. `None`: the document names the address of each
    /// request that fetches it (`http://` and its `Host` header).
    pub public_url: Option<PublicUrl>,
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
            public_url: None,
        }
    }
}

/// The service's public address: an absolute `http` or `https` URL with a host, maybe a path
/// (a proxy's prefix), no user, query or fragment; kept without a trailing `/`, so a route's
/// path appends to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl(String);

/// Why a public URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicUrlError {
    #[error("`{0}` is not an absolute http:// or https:// URL (e.g. https://agents.example.com)")]
    NotHttp(String),
    #[error("`{0}` names no host")]
    NoHost(String),
    #[error("`{0}` carries a user name or password; the document would show it to everyone")]
    UserInfo(String),
    #[error(
        "`{0}` has a query or a fragment; give the address only (a path prefix may follow the host)"
    )]
    QueryOrFragment(String),
    #[error("`{0}` is not a URL: {1}")]
    Malformed(String, String),
}

impl PublicUrl {
    /// Checks `text` (see [`PublicUrl`]).
    pub fn parse(text: &str) -> Result<Self, PublicUrlError> {
        let text = text.trim();
        let lower = text.to_ascii_lowercase();
        let Some(rest) = ["http://", "https://"]
            .iter()
            .find_map(|scheme| lower.starts_with(scheme).then(|| &text[scheme.len()..]))
        else {
            return Err(PublicUrlError::NotHttp(text.to_owned()));
        };
        if text.contains(['?', '#']) {
            return Err(PublicUrlError::QueryOrFragment(text.to_owned()));
        }
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() {
            return Err(PublicUrlError::NoHost(text.to_owned()));
        }
        if authority.contains('@') {
            return Err(PublicUrlError::UserInfo(text.to_owned()));
        }
        text.parse::<axum::http::Uri>()
            .map_err(|error| PublicUrlError::Malformed(text.to_owned(), error.to_string()))?;
        Ok(Self(text.trim_end_matches('/').to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PublicUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for PublicUrl {
    type Err = PublicUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls_are_absolute_http_addresses() {
        let url = PublicUrl::parse("https://agents.example.com/skillstate/").unwrap();
        assert_eq!(url.as_str(), "https://agents.example.com/skillstate");
        assert_eq!(
            PublicUrl::parse("http://127.0.0.1:8080").unwrap().as_str(),
            "http://127.0.0.1:8080"
        );
        for (text, refused) in [
            ("agents.example.com", "NotHttp"),
            ("ftp://agents.example.com", "NotHttp"),
            ("https://", "NoHost"),
            ("https:///path", "NoHost"),
            ("https://user:pw@agents.example.com", "UserInfo"),
            ("https://agents.example.com/?a=1", "QueryOrFragment"),
            ("https://agents.example.com/#top", "QueryOrFragment"),
            ("https://exa mple.com", "Malformed"),
        ] {
            let error = PublicUrl::parse(text).unwrap_err();
            assert!(
                format!("{error:?}").starts_with(refused),
                "{text}: {error:?}"
            );
        }
    }
}
