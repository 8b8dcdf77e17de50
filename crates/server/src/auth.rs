//! API keys: `Authorization: Bearer <secret>` on every /v1 route.
//!
//! Only the lower-case hex SHA-256 of a secret is stored; a request's secret is hashed and looked
//! up (`Keys::key_by_hash`) on every request, so a revoked key fails at once. A missing,
//! malformed, unknown or revoked key is 401 with `WWW-Authenticate: Bearer` (one answer for
//! all four, so a caller learns nothing about keys it does not hold). The key's tenant goes into
//! the request's extensions as a [`Caller`]; routes show a tenant only its own tasks.
//!
//! The local key of `skillstate view` ([`AppState::with_local_key`]) is the one key not in
//! the store: the server holds only its hash, in memory, for as long as the process runs. It
//! sees every task, board and batch of the database, of any tenant or none (tasks made by the
//! CLI belong to none), and steers them as a tenant key does (approve, reply, messages, state
//! and board writes); it creates nothing (`POST /v1/tasks`, `/v1/tasks:batch` and
//! `/v1/boards` are 403), since what it would create would belong to no tenant's key.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use skillstate_core::board::BoardScope;
use skillstate_store::TaskState;

use crate::context::{AppState, is_task_id};
use crate::key_secret::hash_secret;
use crate::problem::ApiError;

/// Who is calling: the tenant and key of the request's API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    /// The key's id (never its secret); recorded as the author of what the key writes.
    pub key_id: String,
    /// For a key limited to board pointers: what it reads and writes. Such a key works only
    /// on /v1/boards (403 elsewhere), sees the projection of its reads and writes only its
    /// writes. `None`: the tenant's full access.
    pub scope: Option<BoardScope>,
    /// The local key of `skillstate view`: everything of the database is visible, whatever
    /// its tenant (`tenant` is empty and names nobody).
    pub whole_database: bool,
}

/// The key id recorded as the author of what the local key of `skillstate view` writes.
pub const LOCAL_KEY_ID: &str = "local-view";

impl Caller {
    /// Whether the caller may see a task, board or batch owned by `owner` (`None`: created
    /// outside the service).
    pub fn sees(&self, owner: Option<&str>) -> bool {
        self.whole_database || owner == Some(self.tenant.as_str())
    }

    /// The tenant a listing is limited to: `None` for the local key (every tenant, and what
    /// belongs to none).
    pub fn tenant_filter(&self) -> Option<String> {
        (!self.whole_database).then(|| self.tenant.clone())
    }
}

/// A task's state read with the caller's key (the state routes read both on every request,
/// and the store reads them in one go): only ever inserted for a request whose key is valid,
/// and still subject to the route's tenant check.
#[derive(Debug, Clone)]
pub struct KeyedState(pub TaskState);

/// The middleware of every /v1 route.
pub async fn require_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let header = request.headers().get(header::AUTHORIZATION).cloned();
    let task = state_route_task(&request);
    match authenticate(&state, header.as_ref(), task.as_deref()).await {
        Ok((caller, keyed)) => {
            if caller.whole_database && creates(&request) {
                return ApiError::Forbidden {
                    detail: "the key of `skillstate view` shows and steers what this database holds; it creates nothing. Create tasks with `skillstate run` or `skillstate batch submit`, boards with `skillstate board create`, or use a tenant's key (`skillstate keys create`) with `skillstate serve`".into(),
                }
                .into_response();
            }
            if caller.scope.is_some() && !is_board_route(&request) {
                return ApiError::Forbidden {
                    detail: "this API key is limited to board pointers; it works only on /v1/boards routes. Use a key of the tenant without limits".into(),
                }
                .into_response();
            }
            request.extensions_mut().insert(caller);
            if let Some(keyed) = keyed {
                request.extensions_mut().insert(keyed);
            }
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

/// Whether the request is to one of the /v1/boards routes (by its route template).
fn is_board_route(request: &Request) -> bool {
    request
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|route| {
            route.as_str() == "/v1/boards" || route.as_str().starts_with("/v1/boards/")
        })
}

/// Whether the request creates a task, a batch or a board (what the local key may not do).
fn creates(request: &Request) -> bool {
    request.method() == Method::POST
        && request
            .extensions()
            .get::<MatchedPath>()
            .is_some_and(|route| {
                matches!(
                    route.as_str(),
                    "/v1/tasks" | "/v1/tasks:batch" | "/v1/boards"
                )
            })
}

/// The task of a request to `/v1/tasks/{id}/state` with a well-formed full id.
fn state_route_task(request: &Request) -> Option<String> {
    let route = request.extensions().get::<MatchedPath>()?;
    if route.as_str() != STATE_ROUTE {
        return None;
    }
    let id = request
        .uri()
        .path()
        .strip_prefix("/v1/tasks/")?
        .strip_suffix("/state")?;
    is_task_id(id).then(|| id.to_owned())
}

/// The state routes' template, as the router matches it.
pub(crate) const STATE_ROUTE: &str = "/v1/tasks/{id}/state";

/// The caller of a request with `header`, and the state of `task` when one was named (read
/// with the key, handed on only when the key is valid).
async fn authenticate(
    state: &AppState,
    header: Option<&HeaderValue>,
    task: Option<&str>,
) -> Result<(Caller, Option<KeyedState>), ApiError> {
    let unauthorized = |detail: &str| ApiError::Unauthorized {
        detail: detail.to_owned(),
    };
    let Some(value) = header else {
        return Err(unauthorized(
            "this route needs an API key: send `Authorization: Bearer <key>` (keys are made with `skillstate keys create`)",
        ));
    };
    let secret = value
        .to_str()
        .ok()
        .and_then(bearer_token)
        .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <key>`"))?;
    let hash = hash_secret(secret);
    if state
        .local_key
        .as_deref()
        .is_some_and(|local| same_hash(local, &hash))
    {
        return Ok((
            Caller {
                tenant: String::new(),
                key_id: LOCAL_KEY_ID.to_owned(),
                scope: None,
                whole_database: true,
            },
            None,
        ));
    }
    let (key, keyed) = match task {
        Some(task) => {
            let (key, read) = state.store.key_and_task_state(&hash, task).await;
            // A failed read of the task is the route's to make and report.
            (key?, read.ok().map(KeyedState))
        }
        None => (state.store.key_by_hash(&hash).await?, None),
    };
    match key {
        Some(key) if key.revoked_at.is_none() => {
            let scope = skillstate_core::board::BoardScope::of_key(key.scopes.as_ref()).map_err(
                |problem| ApiError::Forbidden {
                    detail: format!(
                        "this API key cannot be used: {problem}; revoke it and create a new one"
                    ),
                },
            )?;
            Ok((
                Caller {
                    tenant: key.tenant,
                    key_id: key.id,
                    scope,
                    whole_database: false,
                },
                keyed,
            ))
        }
        _ => Err(unauthorized(
            "the API key is unknown or revoked; ask for a valid key (`skillstate keys list` shows which are valid)",
        )),
    }
}

/// `a == b` in time independent of where they differ (both are hex SHA-256 digests).
fn same_hash(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |differ, (x, y)| differ | (x ^ y))
            == 0
}

/// The token of `Bearer <token>` (scheme case-insensitive, RFC 7235), if well-formed.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic())).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token("Bearer sk_1"), Some("sk_1"));
        assert_eq!(bearer_token("bearer   sk_1 "), Some("sk_1"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer a b"), None);
    }

    #[test]
    fn hashes_compare_whole() {
        let a = hash_secret("a");
        assert!(same_hash(&a, &hash_secret("a")));
        assert!(!same_hash(&a, &hash_secret("b")));
        assert!(!same_hash(&a, &a[..63]));
    }
}
