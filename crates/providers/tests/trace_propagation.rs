//! A model request carries the `traceparent` of the span it is made in (the runtime's `chat`
//! span), so a model server that traces joins the caller's trace; with traces off, no header.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use serde_json::json;
use skillstate_core::Prompt;
use skillstate_providers::trace_context::{self, TraceParent};
use skillstate_providers::{ModelProvider, ModelRequest, OpenAiProvider, ProviderSettings};
use support::{FakeServer, Reply, openai_answer};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

fn request() -> ModelRequest {
    ModelRequest {
        prompt: Prompt {
            prefix: "PROCEDURE\n".into(),
            body: "# Current state\n{}\n".into(),
        },
        prompt_tokens: 4,
        output_schema: Some(Arc::new(json!({"type": "object"}))),
    }
}

#[tokio::test]
async fn a_model_request_carries_its_spans_traceparent_only_when_traces_are_on() {
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
        .init();
    let server = FakeServer::with_replies(vec![
        Reply::json(200, openai_answer("{}", "stop")),
        Reply::json(200, openai_answer("{}", "stop")),
    ])
    .await;
    let settings = ProviderSettings {
        base_url: Some(format!("{}/v1", server.base_url)),
        max_retries: 0,
        timeout_secs: 5,
        ..ProviderSettings::default()
    };
    let model = OpenAiProvider::with_key("m", &settings, Some("sk-test-key-0000".into())).unwrap();

    trace_context::set_enabled(true);
    let span = tracing::info_span!("chat");
    trace_context::set_parent(&span, &format!("00-{TRACE}-{CALLER}-01"));
    let own = trace_context::of_span(&span).expect("the span is recorded");
    assert_eq!(own.trace_id_hex(), TRACE);
    model.complete(&request()).instrument(span).await.unwrap();

    trace_context::set_enabled(false);
    let span = tracing::info_span!("chat");
    model.complete(&request()).instrument(span).await.unwrap();

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let sent = requests[0]
        .headers
        .get("traceparent")
        .expect("a traceparent header")
        .to_str()
        .unwrap();
    let sent = TraceParent::parse(sent).unwrap();
    // The caller's trace, the model call's span (not the caller's) as the parent.
    assert_eq!(sent, own);
    assert_ne!(sent.header(), format!("00-{TRACE}-{CALLER}-01"));
    assert!(requests[1].headers.get("traceparent").is_none());
}
