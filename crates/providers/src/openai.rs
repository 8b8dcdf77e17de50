//! OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio,
//! OpenRouter), written directly over HTTP.

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::secrets::Redactor;

use crate::client::{Client, Vendor};
use crate::settings::{Constrain, ProviderSettings};
use crate::{ModelProvider, ModelRequest, ModelResponse, ProviderError, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
const TOOL_NAME: &str = "skillstate_step";
const VENDOR: Vendor = Vendor {
    name: "openai",
    base_url: DEFAULT_BASE_URL,
    key_env: DEFAULT_KEY_ENV,
    strongest: Constrain::JsonSchema,
};

pub struct OpenAiProvider {
    client: Client,
}

impl OpenAiProvider {
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
        let mut body = json!({
            "model": self.client.model,
            "messages": [
                {"role": "system", "content": request.prompt.prefix},
                {"role": "user", "content": request.prompt.body},
            ],
            "max_tokens": settings.max_tokens,
        });
        if let Some(t) = settings.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = settings.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(seed) = settings.seed {
            body["seed"] = json!(seed);
        }
        let Some(schema) = request.output_schema.as_deref() else {
            return body;
        };
        match mode {
            // Strict mode would force every property to be present, which contradicts merge
            // patches (absent = unchanged, null = delete); servers that decode with a grammar
            // (vLLM, llama.cpp, Ollama) constrain fully either way.
            Constrain::JsonSchema | Constrain::Auto => {
                body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": TOOL_NAME, "schema": schema, "strict": false}});
            }
            Constrain::JsonObject => {
                body["response_format"] = json!({"type": "json_object", "schema": schema});
            }
            Constrain::Tools => {
                body["tools"] = json!([{"type": "function", "function": {"name": TOOL_NAME, "description": "Answer this step: reasoning, state patch and action.", "parameters": schema}}]);
                body["tool_choice"] = json!({"type": "function", "function": {"name": TOOL_NAME}});
            }
            Constrain::Off => {}
        }
        body
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    fn spec(&self) -> String {
        format!("openai:{}", self.client.model)
    }

    fn secret_values(&self) -> Vec<String> {
        self.client.api_key.iter().cloned().collect()
    }

    fn withhold(&self, secrets: &Redactor) {
        self.client.withhold(secrets);
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let url = format!("{}/chat/completions", self.client.base_url);
        let mut headers = Vec::new();
        if let Some(key) = &self.client.api_key {
            headers.push(("authorization", format!("Bearer {key}")));
        }
        let (answer, _) = self
            .client
            .post(&url, &headers, request, |mode| self.body(request, mode))
            .await?;
        let mut response = parse_answer(&answer, &self.client.secrets())
            .map_err(|message| self.client.protocol_error(&message))?;
        response.latency = started.elapsed();
        Ok(response)
    }
}

/// Text, finish reason and usage of a Chat Completions answer.
fn parse_answer(answer: &Value, secrets: &Redactor) -> Result<ModelResponse, String> {
    let clip = |value: &Value| Client::quote(secrets, value);
    let choice = answer
        .pointer("/choices/0")
        .ok_or_else(|| format!("the answer has no choices: {}", clip(answer)))?;
    let message = &choice["message"];
    let text = match message.pointer("/tool_calls/0/function/arguments") {
        Some(Value::String(arguments)) => arguments.clone(),
        Some(other) => other.to_string(),
        None => match &message["content"] {
            Value::String(content) => content.clone(),
            Value::Null => String::new(),
            other => return Err(format!("unexpected message content: {}", clip(other))),
        },
    };
    let usage = answer
        .get("usage")
        .filter(|u| u.is_object())
        .map(|u| Usage {
            input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cached_input_tokens: u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64),
            cache_write_tokens: None,
        });
    Ok(ModelResponse {
        text,
        usage,
        latency: std::time::Duration::ZERO,
        truncated: choice["finish_reason"].as_str() == Some("length"),
    })
}
