//! OpenTelemetry traces of the service (docs/operations/telemetry.md): every request gets a
//! `SERVER` span named by its method and route template, the child of the caller's W3C
//! `traceparent` when it sent one. A task created by a traced request stores the request
//! span's context (`TaskOwner::trace_context`), so the worker that runs it continues the trace.
//!
//! Attributes: the method, the route template (never the path or the query, which may hold a
//! search's words) and the status. Off (no OpenTelemetry layer installed by the binary) the
//! layer only passes the request on.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use skillstate_runtime::trace_context;
use tracing::Instrument;
use tracing::field::Empty;

tokio::task_local! {
    /// The `traceparent` of the request being handled (its own span's), when traced.
    static REQUEST_TRACE: Option<String>;
}

/// The `traceparent` of the request this task handles: its span's, when telemetry is on.
pub(crate) fn request_traceparent() -> Option<String> {
    REQUEST_TRACE.try_with(Clone::clone).ok().flatten()
}

/// The outermost layer: the request's span, parented by its `traceparent`.
pub(crate) async fn trace_request(request: Request, next: Next) -> Response {
    if !trace_context::enabled() {
        return next.run(request).await;
    }
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| crate::metrics::UNMATCHED.to_owned());
    let method = crate::metrics::method_label(request.method());
    let span = tracing::info_span!(
        target: "skillstate_trace",
        "http.request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route.as_str(),
        http.response.status_code = Empty,
        error.type = Empty,
    );
    if let Some(parent) = request
        .headers()
        .get(trace_context::TRACEPARENT)
        .and_then(|value| value.to_str().ok())
    {
        trace_context::set_parent(&span, parent);
    }
    // Kept for the handler by value: the span current in a handler may be another layer's
    // (tower-http's, when debug logs are on), which the OpenTelemetry layer does not record.
    let context = trace_context::of_span(&span).map(|parent| parent.header());
    let response = REQUEST_TRACE
        .scope(context, next.run(request).instrument(span.clone()))
        .await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("error.type", status.to_string());
    }
    response
}
