//! W3C trace context (`traceparent`) for OpenTelemetry traces: read from a request, stored
//! with a queued task, set as the parent of a span, and sent with outgoing HTTP requests.
//!
//! Spans are plain `tracing` spans; the binary installs the `tracing-opentelemetry` bridge
//! only when telemetry is on, and says so with [`set_enabled`]. Until then every function here
//! is a no-op that costs one relaxed atomic load: no header is sent, no context is read.
//!
//! Only a `traceparent` that parses as W3C Trace Context level 1 (version `00`) is ever kept
//! or forwarded, and always re-formatted from its parsed fields, never copied as received.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C header name.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Says whether spans are exported (the binary installed the OpenTelemetry layer).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether spans are exported in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Says whether spans may carry prompts, answers and tool arguments and results
/// (`[telemetry] capture_content`, off by default).
pub fn set_capture_content(capture: bool) {
    CAPTURE_CONTENT.store(capture, Ordering::Relaxed);
}

/// Whether spans carry contents: telemetry is on and the operator asked for them.
pub fn capture_content() -> bool {
    enabled() && CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// Sets a string-array attribute (`gen_ai.response.finish_reasons`) on `span`, which
/// `tracing` fields cannot hold.
pub fn set_strings(span: &tracing::Span, key: &'static str, values: &[&str]) {
    if !enabled() {
        return;
    }
    let values = values
        .iter()
        .map(|v| opentelemetry::StringValue::from((*v).to_owned()))
        .collect();
    span.set_attribute(
        key,
        opentelemetry::Value::Array(opentelemetry::Array::String(values)),
    );
}

/// A parsed `traceparent`: trace id, parent span id and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` header value (`00-<32 hex>-<16 hex>-<2 hex>`, lower case). A
    /// later version is read by its level-1 prefix, as the specification asks; version `ff`,
    /// all-zero ids and anything malformed give `None`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let bytes = text.as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = hex_bytes::<1>(&bytes[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if version != 0 && bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&bytes[3..35])?;
        let span_id = hex_bytes::<8>(&bytes[36..52])?;
        let flags = hex_bytes::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The header value, version `00`.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The OpenTelemetry context whose remote parent this is.
    pub fn context(&self) -> opentelemetry::Context {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let span = SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            flags,
            true,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(span)
    }

    fn of(span: &SpanContext) -> Option<Self> {
        span.is_valid().then(|| Self {
            trace_id: span.trace_id().to_bytes(),
            span_id: span.span_id().to_bytes(),
            sampled: span.is_sampled(),
        })
    }
}

/// Makes `traceparent` the parent of `span` (which must not have been entered yet). Nothing
/// happens when telemetry is off or the value does not parse.
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    if !enabled() {
        return;
    }
    if let Some(parent) = TraceParent::parse(traceparent) {
        // Refused only when the span was disabled by the filter or already started: it then
        // keeps the parent it has.
        let _ = span.set_parent(parent.context());
    }
}

/// The `traceparent` of `span`, when telemetry is on and the span is recorded.
pub fn of_span(span: &tracing::Span) -> Option<TraceParent> {
    if !enabled() {
        return None;
    }
    TraceParent::of(span.context().span().span_context())
}

/// The `traceparent` of the current span (see [`of_span`]).
pub fn current() -> Option<TraceParent> {
    if !enabled() {
        return None;
    }
    of_span(&tracing::Span::current())
}

/// Adds the current span's `traceparent` to an outgoing request's headers.
pub fn inject(headers: &mut reqwest::header::HeaderMap) {
    if let Some(parent) = current()
        && let Ok(value) = reqwest::header::HeaderValue::from_str(&parent.header())
    {
        headers.insert(TRACEPARENT, value);
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn hex_bytes<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let high = lower_hex(pair[0])?;
        let low = lower_hex(pair[1])?;
        out[i] = high << 4 | low;
    }
    Some(out)
}

fn lower_hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_level_one() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(text).expect("valid");
        assert!(parsed.sampled);
        assert_eq!(parsed.header(), text);
        assert_eq!(parsed.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn refuses_malformed_values() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version is read by its level-1 prefix.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what")
                .is_some()
        );
    }

    #[test]
    fn off_means_nothing_is_sent() {
        let mut headers = reqwest::header::HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty());
    }
}
