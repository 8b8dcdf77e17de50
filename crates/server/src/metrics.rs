//! Prometheus metrics: the process's recorder, the HTTP middleware that counts requests, and
//! `GET /metrics` (text exposition format 0.0.4).
//!
//! Figures are kept by the `metrics` facade in one recorder per process, installed by the first
//! [`crate::router`] or [`metrics_router`]: the service's HTTP requests (here) and what its
//! embedded workers' runners count (`skillstate_runtime::metrics`). Queue depth is not kept: each
//! scrape asks the store (`Queue::queue_depth`, one counting query), so it is never stale and
//! every process scraped against one database reports the same figures.
//!
//! Requests are labelled by the route's template (`/v1/tasks/{id}`), never the path sent, so
//! task ids never become series; a path no route matches is `unmatched`. No label names a
//! tenant or a task, which is why `/metrics`, like `/healthz`, needs no API key: it tells
//! nothing about anyone's tasks. Operators who expose the port beyond their network restrict
//! the path at their proxy.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{FromRef, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use skillstate_runtime::metrics::{MODEL_LATENCY, MODEL_LATENCY_BUCKETS, MetricInfo, MetricKind};
use skillstate_store::{QueueDepth, Store};
use tokio::net::TcpListener;

use crate::config::ServerConfig;
use crate::context::AppState;
use crate::problem::{ApiError, Problem, finish_problems};

pub const HTTP_REQUESTS: &str = "skillstate_http_requests_total";
pub const HTTP_DURATION: &str = "skillstate_http_request_duration_seconds";
pub const QUEUE_TASKS: &str = "skillstate_queue_tasks";
pub const STORE_UP: &str = "skillstate_store_up";

/// What the service reports besides the runtime's figures (`skillstate_runtime::metrics::METRICS`).
pub const METRICS: &[MetricInfo] = &[
    MetricInfo {
        name: HTTP_REQUESTS,
        kind: MetricKind::Counter,
        help: "HTTP requests answered, by route template, method and status.",
    },
    MetricInfo {
        name: HTTP_DURATION,
        kind: MetricKind::Histogram,
        help: "Time to answer an HTTP request (to the response head; an event stream counts until it opens), in seconds, by route template and method.",
    },
    MetricInfo {
        name: QUEUE_TASKS,
        kind: MetricKind::Gauge,
        help: "Queued tasks by state, read from the store at scrape time: ready (claimable now), running (under a live lease), backoff (waiting to retry), stopped (batch stopped).",
    },
    MetricInfo {
        name: STORE_UP,
        kind: MetricKind::Gauge,
        help: "Whether the store answered this scrape's queue query within 2 s (1) or not (0, and no queue figures).",
    },
];

/// The media type of the text exposition format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The route label of a request no route matched.
pub const UNMATCHED: &str = "unmatched";
/// Request-duration buckets, in seconds: sub-millisecond reads to the 30 s request timeout.
pub const HTTP_DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// How long a scrape waits for the store's queue figures.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// Histogram samples are folded into their buckets at each scrape and at least this often.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's recorder, installed on first use; `None` when another recorder was installed
/// first (then nothing is recorded here and `/metrics` answers 503).
pub fn install() -> Option<&'static PrometheusHandle> {
    RECORDER.get_or_init(install_recorder).as_ref()
}

fn install_recorder() -> Option<PrometheusHandle> {
    let built = [
        (HTTP_DURATION, HTTP_DURATION_BUCKETS),
        (MODEL_LATENCY, MODEL_LATENCY_BUCKETS),
    ]
    .into_iter()
    .chain(
        skillstate_store::metrics::METRICS
            .iter()
            .map(|metric| (metric.name, metric.buckets)),
    )
    .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
        builder.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
    })
    .and_then(|builder| builder.install_recorder());
    let handle = match built {
        Ok(handle) => handle,
        Err(error) => {
            tracing::warn!(%error, "metrics are not recorded: no Prometheus recorder");
            return None;
        }
    };
    skillstate_runtime::metrics::describe();
    for metric in METRICS {
        match metric.kind {
            MetricKind::Counter => metrics::describe_counter!(metric.name, metric.help),
            MetricKind::Gauge => metrics::describe_gauge!(metric.name, metric.help),
            MetricKind::Histogram => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
    for metric in skillstate_store::metrics::METRICS {
        metrics::describe_histogram!(metric.name, metric.help);
    }
    let upkeep = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("skillstate-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        });
    if let Err(error) = spawned {
        // Scrapes still fold samples in; only an unscraped process keeps them longer.
        tracing::warn!(%error, "cannot start the metrics upkeep thread");
    }
    Some(handle)
}

/// Counts each request under its route template, method and status, and times it. The
/// outermost layer, so it sees the status the client gets (problems, timeouts, panics).
pub(crate) async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_else(|| UNMATCHED.to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(HTTP_DURATION, "route" => route.clone(), "method" => method)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(HTTP_REQUESTS, "route" => route, "method" => method, "status" => status)
        .increment(1);
    response
}

/// The method as a label; an extension method (any token a client sends) is `other`.
pub(crate) fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::CONNECT, "CONNECT"),
        (Method::TRACE, "TRACE"),
    ];
    KNOWN
        .iter()
        .find(|(known, _)| known == method)
        .map_or("other", |(_, label)| label)
}

/// What a scrape reads besides the recorder: the store, for queue depth.
#[derive(Clone)]
pub struct Scrape {
    pub store: Arc<dyn Store>,
}

impl FromRef<AppState> for Scrape {
    fn from_ref(state: &AppState) -> Self {
        Self {
            store: state.store.clone(),
        }
    }
}

/// The metrics of this process, and the queue as the store has it now.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "getMetrics",
    summary = "Prometheus metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4: steps, rejected answers by kind, tool errors, tokens, model latency, tasks settled, leases lost, queue depth, HTTP requests by route and status with latency histograms", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 503, description = "This process records no metrics (another recorder was installed)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn metrics(State(scrape): State<Scrape>) -> Result<Response, ApiError> {
    let Some(handle) = install() else {
        return Err(ApiError::Unavailable {
            detail: "this process records no metrics; see the server's log".into(),
        });
    };
    let depth = match tokio::time::timeout(SCRAPE_TIMEOUT, scrape.store.queue_depth()).await {
        Ok(Ok(depth)) => Some(depth),
        Ok(Err(error)) => {
            tracing::warn!(%error, "metrics: the store failed to count the queue");
            None
        }
        Err(_) => {
            tracing::warn!(
                "metrics: the store did not count the queue within {} s",
                SCRAPE_TIMEOUT.as_secs()
            );
            None
        }
    };
    let mut text = handle.render();
    write_queue(&mut text, depth.as_ref());
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    Ok(response)
}

/// The queue gauges, written at each scrape from the store's answer (absent when it gave
/// none, with `skillstate_store_up 0`).
fn write_queue(text: &mut String, depth: Option<&QueueDepth>) {
    use std::fmt::Write;
    let help = |name: &str| {
        METRICS
            .iter()
            .find(|m| m.name == name)
            .map_or("", |m| m.help)
    };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = writeln!(text, "# HELP {STORE_UP} {}", help(STORE_UP));
    let _ = writeln!(text, "# TYPE {STORE_UP} gauge");
    let _ = writeln!(text, "{STORE_UP} {}\n", u8::from(depth.is_some()));
    if let Some(depth) = depth {
        let _ = writeln!(text, "# HELP {QUEUE_TASKS} {}", help(QUEUE_TASKS));
        let _ = writeln!(text, "# TYPE {QUEUE_TASKS} gauge");
        for (state, count) in depth.by_state() {
            let _ = writeln!(text, "{QUEUE_TASKS}{{state=\"{state}\"}} {count}");
        }
    }
}

/// A router serving only `/metrics` (and counting its own requests), for a process that runs
/// workers without the API: `skillstate worker --metrics-addr`.
pub fn metrics_router(store: Arc<dyn Store>) -> Router {
    install();
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(Scrape { store })
        .layer(from_fn_with_state(
            Arc::new(ServerConfig::default()),
            finish_problems,
        ))
        .layer(from_fn(track))
}

/// Serves [`metrics_router`] on `listener` until `shutdown` completes.
pub async fn serve_metrics<F>(
    listener: TcpListener,
    store: Arc<dyn Store>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    axum::serve(listener, metrics_router(store))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_methods_are_one_label() {
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        let odd = Method::from_bytes(b"BREW").unwrap_or(Method::GET);
        assert_eq!(method_label(&odd), "other");
    }

    #[test]
    fn every_metric_is_named_once_with_the_prefix() {
        let mut names: Vec<&str> = skillstate_runtime::metrics::METRICS
            .iter()
            .chain(METRICS)
            .map(|m| m.name)
            .chain(skillstate_store::metrics::METRICS.iter().map(|m| m.name))
            .collect();
        assert!(names.iter().all(|n| n.starts_with("skillstate_")));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }

    #[test]
    fn queue_figures_are_absent_when_the_store_gave_none() {
        let mut text = String::new();
        write_queue(&mut text, None);
        assert!(text.contains("skillstate_store_up 0\n"));
        assert!(!text.contains(QUEUE_TASKS));
    }
}
