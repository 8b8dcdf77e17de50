//! Anthropic Messages API: the stable prefix goes in a cached system block, structured output
//! through a forced tool call (or an assistant turn prefilled with `{`).

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::constrain::ModeChoice;
use crate::http::{HttpFailure, ServerErrors, Transport};
use crate::settings::{Constrain, ProviderSettings};
use crate::{ModelProvider, ModelRequest, ModelResponse, ProviderError, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const API_VERSION: &str = "2023-06-01";
const TOOL_NAME: &str = "skillstate_step";

pub struct AnthropicProvider {
    model: String,
    base_url: String,
    api_key: Option<String>,
    settings: ProviderSettings,
    transport: Transport,
    mode: ModeChoice,
}

impl AnthropicProvider {
    /// Reads the API key from the environment variable the settings name.
    pub fn new(model: &str, settings: &ProviderSettings) -> Result<Self, ProviderError> {
        let key_env = settings.api_key_env.as_deref().unwrap_or(DEFAULT_KEY_ENV);
        let api_key = std::env::var(key_env).ok().filter(|k| !k.trim().is_empty());
        Self::with_key(model, settings, api_key)
    }

    /// For callers that manage the secret themselves.
    pub fn with_key(
        model: &str,
        settings: &ProviderSettings,
        api_key: Option<String>,
    ) -> Result<Self, ProviderError> {
        let base_url = settings
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        let transport = Transport::new(settings, api_key.clone()).map_err(ProviderError::Config)?;
        Ok(Self {
            model: model.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            settings: settings.clone(),
            transport,
            mode: ModeChoice::new(settings.constrain, Constrain::Tools),
        })
    }

    fn body(&self, request: &ModelRequest, mode: Constrain) -> Value {
        let mut messages = vec![json!({"role": "user", "content": request.prompt.body})];
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.settings.max_tokens,
            // The stable prefix is identical at every step: cache it.
            "system": [{"type": "text", "text": request.prompt.prefix, "cache_control": {"type": "ephemeral"}}],
        });
        if let Some(t) = self.settings.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = self.settings.top_p {
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

    fn error(&self, failure: HttpFailure) -> ProviderError {
        let provider = "anthropic".to_owned();
        match failure {
            HttpFailure::Status {
                status: 401 | 403,
                message,
            } => ProviderError::Auth {
                provider,
                status: 401,
                message,
                hint: format!(
                    "set {} to a valid key",
                    self.settings
                        .api_key_env
                        .as_deref()
                        .unwrap_or(DEFAULT_KEY_ENV)
                ),
            },
            HttpFailure::Status {
                status: 404,
                message,
            } => ProviderError::ModelNotFound {
                provider,
                model: self.model.clone(),
                base_url: self.base_url.clone(),
                message,
            },
            HttpFailure::Status { status, message } => ProviderError::Rejected {
                provider,
                status,
                message,
            },
            HttpFailure::Exhausted { attempts, last } => ProviderError::Unavailable {
                provider,
                attempts,
                last,
            },
        }
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    fn spec(&self) -> String {
        format!("anthropic:{}", self.model)
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let url = format!("{}/v1/messages", self.base_url);
        let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
        if let Some(key) = &self.api_key {
            headers.push(("x-api-key", key.clone()));
        }
        let estimate = request.prompt_tokens as u64 + u64::from(self.settings.max_tokens);
        loop {
            let mode = if request.output_schema.is_some() {
                self.mode.current()
            } else {
                Constrain::Off
            };
            let probing = self.mode.is_tentative() && mode != Constrain::Off;
            let server_errors = if probing {
                ServerErrors::Return
            } else {
                ServerErrors::Retry
            };
            match self
                .transport
                .post_json(
                    &url,
                    &headers,
                    &self.body(request, mode),
                    estimate,
                    server_errors,
                )
                .await
            {
                Ok(answer) => {
                    if probing {
                        self.mode.confirm();
                    }
                    let mut response = parse_answer(&answer, mode == Constrain::JsonObject)
                        .map_err(|message| ProviderError::Protocol {
                            provider: "anthropic".into(),
                            message: self.transport.redact(&message),
                        })?;
                    response.latency = started.elapsed();
                    return Ok(response);
                }
                Err(HttpFailure::Status { status, message })
                    if probing
                        && matches!(status, 400 | 422 | 500 | 501)
                        && self.mode.fall_back(
                            Constrain::JsonObject,
                            "anthropic",
                            &format!("HTTP {status}: {message}"),
                        ) =>
                {
                    continue;
                }
                Err(failure) => return Err(self.error(failure)),
            }
        }
    }
}

fn parse_answer(answer: &Value, prefilled: bool) -> Result<ModelResponse, String> {
    let blocks = answer["content"].as_array().ok_or_else(|| {
        format!(
            "the answer has no content blocks: {}",
            answer.to_string().chars().take(300).collect::<String>()
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
