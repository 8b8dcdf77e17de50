//! The OpenAI-compatible client against a fake server on 127.0.0.1 that checks what it receives
//! and replays recorded answers, including every failure the client must survive or report.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skillstate_core::Prompt;
use skillstate_providers::{
    Constrain, ModelProvider, ModelRequest, OpenAiProvider, ProviderError, ProviderSettings,
};
use support::{FakeServer, Reply, openai_answer};

const KEY: &str = "sk-test-SECRET-4242";

fn schema() -> Arc<Value> {
    Arc::new(
        json!({"type": "object", "properties": {"reasoning": {"type": "string"}}, "required": ["reasoning"]}),
    )
}

fn request() -> ModelRequest {
    ModelRequest {
        prompt: Prompt {
            prefix: "PROCEDURE AND TOOLS\n".into(),
            body: "# Current state\n{}\n".into(),
        },
        prompt_tokens: 10,
        output_schema: Some(schema()),
    }
}

fn provider(server: &FakeServer, constrain: Constrain, retries: u32) -> OpenAiProvider {
    let settings = ProviderSettings {
        base_url: Some(format!("{}/v1", server.base_url)),
        constrain,
        max_retries: retries,
        timeout_secs: 1,
        temperature: Some(0.0),
        seed: Some(7),
        ..ProviderSettings::default()
    };
    OpenAiProvider::with_key("test-model", &settings, Some(KEY.into())).unwrap()
}

#[tokio::test]
async fn sends_the_prompt_schema_and_key_and_reads_usage() {
    let server = FakeServer::with_replies(vec![Reply::json(
        200,
        openai_answer("{\"reasoning\":\"ok\"}", "stop"),
    )])
    .await;
    let response = provider(&server, Constrain::JsonSchema, 0)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(response.text, "{\"reasoning\":\"ok\"}");
    assert!(!response.truncated);
    let usage = response.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_input_tokens
        ),
        (1200, 60, Some(1024))
    );

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], format!("Bearer {KEY}"));
    let body = &sent.body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "PROCEDURE AND TOOLS\n"})
    );
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": "# Current state\n{}\n"})
    );
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["schema"], *schema());
    assert_eq!(
        (
            body["temperature"].clone(),
            body["seed"].clone(),
            body["max_tokens"].clone()
        ),
        (json!(0.0), json!(7), json!(1024))
    );
}

#[tokio::test]
async fn auto_falls_back_once_when_the_server_rejects_json_schema() {
    let server = FakeServer::with_replies(vec![
        Reply::json(
            500,
            json!({"error": {"message": "response_format json_schema is not supported"}}),
        ),
        Reply::json(200, openai_answer("{}", "stop")),
        Reply::json(200, openai_answer("{}", "stop")),
    ])
    .await;
    let model = provider(&server, Constrain::Auto, 3);
    model.complete(&request()).await.unwrap();
    model.complete(&request()).await.unwrap();
    let modes: Vec<Value> = server
        .requests()
        .iter()
        .map(|r| r.body["response_format"]["type"].clone())
        .collect();
    assert_eq!(
        modes,
        vec![
            json!("json_schema"),
            json!("json_object"),
            json!("json_object")
        ]
    );
    assert_eq!(
        server.requests()[1].body["response_format"]["schema"],
        *schema()
    );
}

#[tokio::test]
async fn an_explicit_mode_is_not_abandoned() {
    let server = FakeServer::with_replies(vec![Reply::json(
        400,
        json!({"error": {"message": "unknown field response_format.schema"}}),
    )])
    .await;
    let error = provider(&server, Constrain::JsonObject, 3)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::Rejected { status: 400, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("unknown field"), "{error}");
    assert_eq!(server.requests().len(), 1, "a 400 is not retried");
}

#[tokio::test]
async fn tools_mode_forces_the_step_tool_and_reads_its_arguments() {
    let answer = json!({
        "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "skillstate_step", "arguments": "{\"reasoning\":\"t\"}"}}]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3}
    });
    let server = FakeServer::with_replies(vec![Reply::json(200, answer)]).await;
    let response = provider(&server, Constrain::Tools, 0)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(response.text, "{\"reasoning\":\"t\"}");
    let body = &server.requests()[0].body;
    assert_eq!(body["tools"][0]["function"]["parameters"], *schema());
    assert_eq!(body["tool_choice"]["function"]["name"], "skillstate_step");
    assert!(body.get("response_format").is_none());
}

#[tokio::test]
async fn honours_retry_after_on_429_then_succeeds() {
    let server = FakeServer::with_replies(vec![
        Reply::json(429, json!({"error": {"message": "rate limited"}})).header("retry-after", "1"),
        Reply::json(200, openai_answer("{}", "stop")),
    ])
    .await;
    let started = Instant::now();
    provider(&server, Constrain::Off, 2)
        .complete(&request())
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the client must wait what Retry-After says"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn server_errors_and_timeouts_are_retried_then_reported() {
    let server = FakeServer::with_replies(vec![
        Reply::json(500, json!({"error": {"message": "boom"}})),
        Reply::json(503, json!({"error": {"message": "busy"}})),
        Reply::json(200, openai_answer("{}", "stop")),
    ])
    .await;
    provider(&server, Constrain::Off, 2)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(server.requests().len(), 3);

    let slow = FakeServer::with_replies(vec![
        Reply::json(200, openai_answer("{}", "stop")).delayed(Duration::from_secs(3)),
        Reply::json(200, openai_answer("{}", "stop")).delayed(Duration::from_secs(3)),
    ])
    .await;
    let error = provider(&slow, Constrain::Off, 1)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::Unavailable { attempts: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("timed out"), "{error}");
}

#[tokio::test]
async fn truncated_and_malformed_answers_are_named() {
    let server = FakeServer::with_replies(vec![Reply::json(
        200,
        openai_answer("{\"reasoning\": \"cut", "length"),
    )])
    .await;
    let response = provider(&server, Constrain::Off, 0)
        .complete(&request())
        .await
        .unwrap();
    assert!(response.truncated);

    let garbage = FakeServer::with_replies(vec![
        Reply::raw(200, "<html>proxy error</html>"),
        Reply::raw(200, "not json either"),
    ])
    .await;
    let error = provider(&garbage, Constrain::Off, 1)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("malformed JSON"), "{error}");

    let shapeless =
        FakeServer::with_replies(vec![Reply::json(200, json!({"object": "chat.completion"}))])
            .await;
    let error = provider(&shapeless, Constrain::Off, 0)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(error, ProviderError::Protocol { .. }), "{error}");
    assert!(error.to_string().contains("no choices"), "{error}");
}

#[tokio::test]
async fn auth_and_missing_models_fail_at_once_without_leaking_the_key() {
    let server = FakeServer::with_replies(vec![Reply::json(
        401,
        json!({"error": {"message": format!("Incorrect API key provided: {KEY}")}}),
    )])
    .await;
    let error = provider(&server, Constrain::Off, 3)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(error, ProviderError::Auth { .. }), "{error}");
    let text = error.to_string();
    assert!(!text.contains(KEY), "{text}");
    assert!(
        text.contains("[redacted]") && text.contains("OPENAI_API_KEY"),
        "{text}"
    );
    assert_eq!(server.requests().len(), 1);

    let server = FakeServer::with_replies(vec![Reply::json(
        404,
        json!({"error": {"message": "model 'test-model' not found"}}),
    )])
    .await;
    let error = provider(&server, Constrain::Off, 3)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(error, ProviderError::ModelNotFound { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("check the model name"),
        "{error}"
    );
}
