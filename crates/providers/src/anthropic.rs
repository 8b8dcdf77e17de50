//! Anthropic Messages API: the stable prefix goes in a cached system block, structured output
//! through a forced tool call (or an assistant turn prefilled with `{`).

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::secrets::Redactor;

use crate::client::{Client, Vendor};
use crate::settings::{Constrain, ProviderSettings};
use crate::{ModelProvider, ModelRequest, ModelResponse, ProviderError, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const API_VERSION: &str = "2023-06-01";
const TOOL_NAME: &str = "skillstate_step";
const VENDOR: Vendor = Vendor {
    name: "anthropic",
    base_url: DEFAULT_BASE_URL,
    key_env: DEFAULT_KEY_ENV,
    strongest: Constrain::Tools,
};

pub struct AnthropicProvider {
    client: Client,
}

impl AnthropicProvider {
    /// Reads the API key from the environment variable the settings name.
    pub fn new(model: &str, settings: &ProviderSettings) -> Result<Self, ProviderError> {
        Self::with_key(model, settings, Client::key_from_env(&VENDOR, settings))
    }

    /// For callers that manage the secret themselves.
    pub fn with_key(
        model: &str,
        settings: &ProviderSettings,
        api_key: Option<String>,
    ) -> Result<Self, ProviderError> {
        Ok(Self {
            client: Client::new(&VENDOR, model, settings, api_key)?,
        })
    }

    fn body(&self, request: &ModelRequest, mode: Constrain) -> Value {
        let settings = &self.client.settings;
        let mut messages = vec![json!({"role": "user", "content": request.prompt.body})];
        let mut body = json!({
            "model": self.client.model,
            "max_tokens": settings.max_tokens,
            // The stable prefix is identical at every step: cache it.
            "system": [{"type": "text", "text": request.prompt.prefix, "cache_control": {"type": "ephemeral"}}],
        });
        if let Some(t) = settings.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = settings.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(schema) = request.output_schema.as_deref() {
            match mode {
                Constrain::Tools | Constrain::Auto | Constrain::JsonSchema => {
                    body["tools"] = json!([{"name": TOOL_NAME, "description": "Answer this step: reasoning, state patch and action.", "input_schema": schema}]);
                    body["tool_choice"] = json!({"type": "tool", "name": TOOL_NAME});
                }
                Constrain::JsonObject => {
                    messages.push(json!({"role": "assistant", "content": "{"}))
                }
                Constrain::Off => {}
            }
        }
        body["messages"] = Value::Array(messages);
        body
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    fn spec(&self) -> String {
        format!("anthropic:{}", self.client.model)
    }

    fn secret_values(&self) -> Vec<String> {
        self.client.api_key.iter().cloned().collect()
    }

    fn withhold(&self, secrets: &Redactor) {
        self.client.withhold(secrets);
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let url = format!("{}/v1/messages", self.client.base_url);
        let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
        if let Some(key) = &self.client.api_key {
            headers.push(("x-api-key", key.clone()));
        }
        let (answer, mode) = self
            .client
            .post(&url, &headers, request, |mode| self.body(request, mode))
            .await?;
        let mut response = parse_answer(
            &answer,
            mode == Constrain::JsonObject,
            &self.client.secrets(),
        )
        .map_err(|message| self.client.protocol_error(&message))?;
        response.latency = started.elapsed();
        Ok(response)
    }
}

fn parse_answer(
    answer: &Value,
    prefilled: bool,
    secrets: &Redactor,
) -> Result<ModelResponse, String> {
    let blocks = answer["content"].as_array().ok_or_else(|| {
        format!(
            "the answer has no content blocks: {}",
            Client::quote(secrets, answer)
        )
    })?;
    let text = match blocks.iter().find(|b| b["type"] == "tool_use") {
        Some(tool_use) => tool_use["input"].to_string(),
        None => {
            let joined: String = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
            if prefilled {
                format!("{{{joined}")
            } else {
                joined
            }
        }
    };
    let usage = answer
        .get("usage")
        .filter(|u| u.is_object())
        .map(|u| Usage {
            input_tokens: u["input_tokens"].as_u64().unwrap_or(0)
                + u["cache_read_input_tokens"].as_u64().unwrap_or(0)
                + u["cache_creation_input_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
            cached_input_tokens: u["cache_read_input_tokens"].as_u64(),
            cache_write_tokens: u["cache_creation_input_tokens"].as_u64(),
        });
    Ok(ModelResponse {
        text,
        usage,
        latency: std::time::Duration::ZERO,
        truncated: answer["stop_reason"].as_str() == Some("max_tokens"),
    })
}
