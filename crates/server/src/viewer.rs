//! The web viewer: a page at `/` (HTML, one script, one style sheet, embedded in the binary)
//! that shows tasks, their steps, states, diffs and prompts through the `/v1` API alone, and a
//! bench's results.
//!
//! The assets carry no data, so they need no key; the page asks for one and sends it with
//! every `/v1` request. Every asset is served with a strict Content-Security-Policy: scripts
//! only from this origin (no inline script, no `eval`), styles only from this origin,
//! connections only to this origin, no frames, no forms posted elsewhere. The script shows
//! every value it gets as text (never as markup), so model output cannot run in the page.
//!
//! `/viewer/bench.json` serves a bench's `results.json` when the server was given one
//! ([`AppState::with_bench_results`], `skillstate view --bench`), read-only; otherwise it is a
//! 404 and the page offers to open a local file instead. None of these routes are part of the
//! API, so none is in the OpenAPI document.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::context::AppState;
use crate::problem::ApiError;

const INDEX_HTML: &str = include_str!("../assets/viewer/index.html");
const APP_JS: &str = include_str!("../assets/viewer/app.js");
const STYLE_CSS: &str = include_str!("../assets/viewer/style.css");

/// The policy of every viewer response.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The viewer's routes, outside `/v1` and its key check.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/viewer/app.js", get(app_js))
        .route("/viewer/style.css", get(style_css))
        .route("/viewer/bench.json", get(bench))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    guarded(body.into_response(), content_type, "no-cache")
}

fn guarded(mut response: Response, content_type: &'static str, cache: &'static str) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    response
}

async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}

async fn bench(State(state): State<AppState>) -> Result<Response, ApiError> {
    let Some(results) = state.bench.clone() else {
        return Err(ApiError::not_found(
            "this server was started without bench results; start it with `skillstate view --bench <results.json>`, or open a results.json file in the page",
        ));
    };
    Ok(guarded(
        Response::new(axum::body::Body::from(results)),
        "application/json",
        "no-store",
    ))
}
