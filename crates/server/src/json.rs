//! Reading request bodies and query strings, each failure a problem naming what to fix.
//!
//! A JSON body is read in four checks, cheapest first: its size (the body limit layer and the
//! buffered read), its nesting (a pre-scan refuses more than `max_json_depth` levels before any
//! parser recurses), strict JSON (`skillstate_core::strict_json`: syntax errors with line and
//! column, duplicate keys and numbers beyond ±2^53 with their pointer), then the route's type
//! (an unknown or missing field, a wrong type, with its pointer). Unreadable text is 400; JSON
//! that is well-formed but does not fit is 422.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use skillstate_core::strict_json::parse_strict;

use crate::context::AppState;
use crate::problem::{ApiError, FieldError};

/// A JSON request body of type `T`, read under the server's limits.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let content_type = content_type_of(&request);
        if !is_json(&content_type) {
            return Err(not_json(&content_type, "a JSON body", ""));
        }
        let body = read_body(request, state).await?;
        parse_body_quoting(&body, state.config.max_json_depth, &state.secrets).map(ApiJson)
    }
}

/// An optional JSON body: none at all (an empty body, any Content-Type) is `T::default()`;
/// otherwise it is read as [`ApiJson`] reads one.
pub(crate) async fn optional_json<T: DeserializeOwned + Default>(
    request: Request,
    state: &AppState,
) -> Result<T, ApiError> {
    let content_type = content_type_of(&request);
    let body = read_body(request, state).await?;
    if body.is_empty() {
        return Ok(T::default());
    }
    if !is_json(&content_type) {
        return Err(not_json(
            &content_type,
            "an optional JSON body",
            ", or send no body",
        ));
    }
    parse_body_quoting(&body, state.config.max_json_depth, &state.secrets)
}

/// The request's Content-Type, empty when it has none (or one that is not text).
fn content_type_of(request: &Request) -> String {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// 415 for a body sent as `content_type`, saying what the route reads.
fn not_json(content_type: &str, reads: &str, otherwise: &str) -> ApiError {
    let got = if content_type.is_empty() {
        "none"
    } else {
        content_type
    };
    ApiError::UnsupportedMediaType {
        detail: format!(
            "this route reads {reads}; send it with Content-Type: application/json (got `{got}`){otherwise}"
        ),
    }
}

/// `application/json` or any `application/*+json`, parameters ignored.
pub(crate) fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The whole body, within the body limit.
pub(crate) async fn read_body(request: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            // The limit layer makes reading past the limit fail; any other read failure is the
            // client's connection.
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge {
                    limit: state.config.body_limit,
                }
            } else {
                ApiError::bad_request(format!("the request body could not be read: {rejection}"))
            }
        })
}

/// Parses a JSON body into `T` under the depth limit; see the module doc for the order.
pub fn parse_body<T: DeserializeOwned>(body: &[u8], max_depth: usize) -> Result<T, ApiError> {
    parse_body_quoting(body, max_depth, &Redactor::default())
}

/// [`parse_body`], every part of the body an error quotes (a value in a type error, a key)
/// redacted of `secrets` first: the body is outside text.
pub fn parse_body_quoting<T: DeserializeOwned>(
    body: &[u8],
    max_depth: usize,
    secrets: &Redactor,
) -> Result<T, ApiError> {
    let quoted = |message: String| Outside::new(message).redacted(secrets);
    if nesting_exceeds(body, max_depth) {
        return Err(ApiError::TooDeep { limit: max_depth });
    }
    let text = std::str::from_utf8(body).map_err(|error| ApiError::BadRequest {
        detail: format!(
            "the body is not UTF-8 text (invalid byte at offset {}); JSON must be UTF-8",
            error.valid_up_to()
        ),
        errors: Vec::new(),
    })?;
    let value = parse_strict(text).map_err(|mut error| {
        error.message = quoted(error.message);
        error.pointer = quoted(error.pointer);
        if error.syntax {
            ApiError::BadRequest {
                detail: format!(
                    "the body is not valid JSON: {} (line {}, column {})",
                    error.message, error.line, error.column
                ),
                errors: vec![FieldError::new("json", "", error.message.clone())],
            }
        } else {
            ApiError::invalid(
                format!(
                    "the body is refused at {}: {}",
                    error.pointer, error.message
                ),
                vec![FieldError::new("json", error.pointer, error.message)],
            )
        }
    })?;
    serde_path_to_error::deserialize(value).map_err(|error| {
        let pointer = quoted(pointer_of(error.path()));
        let message = quoted(error.into_inner().to_string());
        ApiError::invalid(
            format!(
                "the body does not fit this route at `{}`: {message}",
                if pointer.is_empty() {
                    "(root)"
                } else {
                    &pointer
                }
            ),
            vec![FieldError::new("field", pointer, message)],
        )
    })
}

/// Whether arrays and objects nest deeper than `limit` anywhere in `body` (brackets inside
/// strings do not count). Linear, no recursion, so any body can be scanned.
pub fn nesting_exceeds(body: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A serde path (`tasks[3].state`) as an RFC 6901 JSON pointer (`/tasks/3/state`).
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        let token = match segment {
            Segment::Seq { index } => index.to_string(),
            Segment::Map { key } => key.replace('~', "~0").replace('/', "~1"),
            Segment::Enum { variant } => variant.replace('~', "~0").replace('/', "~1"),
            Segment::Unknown => continue,
        };
        pointer.push('/');
        pointer.push_str(&token);
    }
    pointer
}

/// A query string of type `T`; a parameter that does not fit is a 400 naming it.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(ApiError::bad_request(format!(
                "the query string does not fit this route: {}",
                rejection.body_text()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_body_error_quotes_is_redacted() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Count {
            count: u32,
        }
        let secrets = Redactor::new(["sk-SECRET-0123456789"]);
        let body = br#"{"count": "a sk-SECRET-0123456789 b"}"#;
        let Err(error) = parse_body_quoting::<Count>(body, 8, &secrets) else {
            panic!("a string is not a count");
        };
        let shown = format!("{error:?}");
        assert!(!shown.contains("sk-SECRET"), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(!nesting_exceeds(br#"{"a":[1,{"b":2}]}"#, 3));
        assert!(nesting_exceeds(br#"{"a":[1,{"b":[2]}]}"#, 3));
        assert!(!nesting_exceeds(br#"{"a":"[[[[[[\"{{{{"}"#, 1));
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert!(nesting_exceeds(deep.as_bytes(), 64));
        assert!(!nesting_exceeds(
            deep.as_bytes()[1..deep.len() - 1].as_ref(),
            64
        ));
    }

    #[test]
    fn serde_paths_become_json_pointers() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Item {
            n: u32,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Outer {
            items: Vec<Item>,
        }
        let error = parse_body::<Outer>(br#"{"items":[{"n":1},{"n":"x"}]}"#, 64).unwrap_err();
        match error {
            ApiError::Invalid { errors, .. } => assert_eq!(errors[0].pointer, "/items/1/n"),
            other => panic!("{other:?}"),
        }
        let error = parse_body::<Outer>(br#"{"items":[], "items":[]}"#, 64).unwrap_err();
        match error {
            ApiError::Invalid { errors, .. } => assert_eq!(errors[0].kind, "json"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_body::<Outer>(b"{\"items\":", 64),
            Err(ApiError::BadRequest { .. })
        ));
    }
}
