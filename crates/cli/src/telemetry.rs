//! OpenTelemetry traces (docs/operations/telemetry.md): the `[telemetry]` section of
//! skillstate.toml and the standard `OTEL_*` variables decide whether spans are exported over
//! OTLP/HTTP (protobuf). Off, nothing is built: no exporter, no layer, no thread.
//!
//! Only spans of the target `skillstate_trace` are exported (the runtime's `spans` and the
//! server's request spans): their attributes are chosen field by field, so no log line, no
//! secret and no write-only value reaches the exporter through an event or a stray field.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use serde::{Deserialize, Serialize};
use skillstate_runtime::trace_context;

/// `[telemetry]`: where spans go and what they carry. The `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
/// `OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_SERVICE_NAME` variables win over `endpoint` and
/// `service_name`; `OTEL_SDK_DISABLED=true` turns traces off whatever this says.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP receiver's base URL (`http://127.0.0.1:4318`); spans are POSTed to its
    /// `/v1/traces`. Unset (and no variable set): traces are off.
    pub endpoint: Option<String>,
    /// `service.name` of the spans (default `skillstate`).
    pub service_name: Option<String>,
    /// Prompts, answers and tool arguments and results as span attributes (redacted of
    /// secrets; never for a task whose schema has write-only locations, or on a board).
    /// Off by default, as the GenAI conventions ask.
    pub capture_content: bool,
    /// The share of new traces recorded, 0 to 1 (default 1); a trace continued from a
    /// caller's `traceparent` follows the caller's decision.
    pub sample_ratio: Option<f64>,
    /// The longest one export may take, in milliseconds (default 10,000).
    pub timeout_ms: Option<u64>,
}

/// The OTLP path of traces under a base endpoint.
const TRACES_PATH: &str = "/v1/traces";
/// How long the exit waits for the last spans to leave.
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// Where and how spans are exported, resolved from the variables and `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The full URL spans are POSTed to.
    pub traces_url: String,
    pub service_name: String,
    pub capture_content: bool,
    pub sample_ratio: f64,
    pub timeout: Duration,
}

impl TelemetryConfig {
    /// `None` when traces are off. `env` reads a variable (the process's in `main`).
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Option<Resolved> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let traces_url = match (
            set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            set("OTEL_EXPORTER_OTLP_ENDPOINT"),
            self.endpoint.clone().filter(|v| !v.trim().is_empty()),
        ) {
            (Some(url), _, _) => url.trim().to_owned(),
            (None, Some(base), _) | (None, None, Some(base)) => {
                format!("{}{TRACES_PATH}", base.trim().trim_end_matches('/'))
            }
            (None, None, None) => return None,
        };
        Some(Resolved {
            traces_url,
            service_name: set("OTEL_SERVICE_NAME")
                .or_else(|| self.service_name.clone())
                .unwrap_or_else(|| "skillstate".to_owned()),
            capture_content: self.capture_content,
            sample_ratio: self.sample_ratio.unwrap_or(1.0).clamp(0.0, 1.0),
            timeout: Duration::from_millis(self.timeout_ms.unwrap_or(10_000)),
        })
    }
}

/// The exporter of this process while it runs; [`Telemetry::shutdown`] flushes it.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Builds the exporter and its batch processor (a thread of its own), or says why not.
    /// Call outside the async runtime.
    pub fn start(settings: &Resolved) -> Result<(Self, opentelemetry_sdk::trace::Tracer), String> {
        // reqwest's rustls has no provider of its own: the workspace's (ring), for https.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(settings.traces_url.clone())
            .with_timeout(settings.timeout)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(8_192)
            .with_scheduled_delay(Duration::from_millis(1_000))
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("skillstate");
        trace_context::set_enabled(true);
        trace_context::set_capture_content(settings.capture_content);
        Ok((Self { provider }, tracer))
    }

    /// Exports what is left, waiting at most a few seconds (a receiver that is down does not
    /// hold the exit).
    pub fn shutdown(self) {
        trace_context::set_enabled(false);
        if let Err(error) = self.provider.shutdown_with_timeout(FLUSH_LIMIT) {
            tracing::debug!("telemetry: the last spans were not all exported: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_unless_an_endpoint_is_given() {
        assert_eq!(TelemetryConfig::default().resolve(env(&[])), None);
        let on = TelemetryConfig {
            endpoint: Some("http://127.0.0.1:4318/".into()),
            ..Default::default()
        };
        let resolved = on.resolve(env(&[])).expect("on");
        assert_eq!(resolved.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(resolved.service_name, "skillstate");
        assert!(!resolved.capture_content);
        assert_eq!(on.resolve(env(&[("OTEL_SDK_DISABLED", "true")])), None);
    }

    #[test]
    fn variables_win_over_the_file() {
        let file = TelemetryConfig {
            endpoint: Some("http://file:4318".into()),
            service_name: Some("from-file".into()),
            sample_ratio: Some(7.0),
            ..Default::default()
        };
        let resolved = file
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318"),
                ("OTEL_SERVICE_NAME", "agents"),
            ]))
            .expect("on");
        assert_eq!(resolved.traces_url, "http://base:4318/v1/traces");
        assert_eq!(resolved.service_name, "agents");
        assert_eq!(resolved.sample_ratio, 1.0);
        let resolved = TelemetryConfig::default()
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://traces:4318/custom",
                ),
            ]))
            .expect("on");
        assert_eq!(resolved.traces_url, "http://traces:4318/custom");
    }
}
