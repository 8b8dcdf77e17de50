//! The Anthropic Messages client against a fake server on 127.0.0.1.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_core::Prompt;
use skillstate_providers::{
    AnthropicProvider, Constrain, ModelProvider, ModelRequest, ProviderError, ProviderSettings,
};
use support::{FakeServer, Reply, anthropic_tool_answer};

const KEY: &str = "sk-ant-test-SECRET-77";

fn request() -> ModelRequest {
    ModelRequest {
        prompt: Prompt {
            prefix: "STABLE PREFIX\n".into(),
            body: "# Latest observation\nx\n".into(),
        },
        prompt_tokens: 10,
        output_schema: Some(Arc::new(
            json!({"type": "object", "properties": {"reasoning": {"type": "string"}}}),
        )),
    }
}

fn provider(server: &FakeServer, constrain: Constrain) -> AnthropicProvider {
    let settings = ProviderSettings {
        base_url: Some(server.base_url.clone()),
        constrain,
        max_retries: 2,
        ..ProviderSettings::default()
    };
    AnthropicProvider::with_key("claude-test", &settings, Some(KEY.into())).unwrap()
}

#[tokio::test]
async fn forced_tool_call_with_a_cached_prefix() {
    let server = FakeServer::with_replies(vec![Reply::json(
        200,
        anthropic_tool_answer(json!({"reasoning": "r"}), "tool_use"),
    )])
    .await;
    let response = provider(&server, Constrain::Auto)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&response.text).unwrap(),
        json!({"reasoning": "r"})
    );
    let usage = response.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_input_tokens,
            usage.cache_write_tokens
        ),
        (1100, 50, Some(1000), Some(0))
    );

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        sent.body["system"][0],
        json!({"type": "text", "text": "STABLE PREFIX\n", "cache_control": {"type": "ephemeral"}})
    );
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": "# Latest observation\nx\n"}])
    );
    assert_eq!(
        sent.body["tool_choice"],
        json!({"type": "tool", "name": "skillstate_step"})
    );
    assert_eq!(
        sent.body["tools"][0]["input_schema"],
        *request().output_schema.unwrap()
    );
}

#[tokio::test]
async fn falls_back_to_a_prefilled_json_answer() {
    let text_answer = json!({"content": [{"type": "text", "text": "\"reasoning\": \"p\"}"}], "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}});
    let server = FakeServer::with_replies(vec![
        Reply::json(400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "tools are not supported"}})),
        Reply::json(200, text_answer),
    ])
    .await;
    let response = provider(&server, Constrain::Auto)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(response.text, "{\"reasoning\": \"p\"}");
    let second = &server.requests()[1].body;
    assert!(second.get("tools").is_none());
    assert_eq!(
        second["messages"][1],
        json!({"role": "assistant", "content": "{"})
    );
}

#[tokio::test]
async fn overloaded_is_retried_and_max_tokens_is_truncation() {
    let server = FakeServer::with_replies(vec![
        Reply::json(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        Reply::json(200, anthropic_tool_answer(json!({}), "max_tokens")),
    ])
    .await;
    let response = provider(&server, Constrain::Tools)
        .complete(&request())
        .await
        .unwrap();
    assert!(response.truncated);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn a_bad_key_is_an_auth_error_without_the_key() {
    let server = FakeServer::with_replies(vec![Reply::json(401, json!({"type": "error", "error": {"type": "authentication_error", "message": format!("invalid x-api-key {KEY}")}}))]).await;
    let error = provider(&server, Constrain::Tools)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(matches!(error, ProviderError::Auth { .. }), "{error}");
    assert!(
        !error.to_string().contains(KEY) && error.to_string().contains("ANTHROPIC_API_KEY"),
        "{error}"
    );
}
