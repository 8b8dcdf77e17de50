//! OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio,
//! OpenRouter), written directly over HTTP.

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::constrain::ModeChoice;
use crate::http::{HttpFailure, ServerErrors, Transport};
use crate::settings::{Constrain, ProviderSettings};
use crate::{ModelProvider, ModelRequest, ModelResponse, ProviderError, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
const TOOL_NAME: &str = "skillstate_step";

pub struct OpenAiProvider {
    model: String,
    base_url: String,
    api_key: Option<String>,
    settings: ProviderSettings,
    transport: Transport,
    mode: ModeChoice,
}

impl OpenAiProvider {
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
        // A local server needs no key; a missing key only fails if the server asks for one.
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
            mode: ModeChoice::new(settings.constrain, Constrain::JsonSchema),
        })
    }

    fn body(&self, request: &ModelRequest, mode: Constrain) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.prompt.prefix},
                {"role": "user", "content": request.prompt.body},
            ],
            "max_tokens": self.settings.max_tokens,
        });
        if let Some(t) = self.settings.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(p) = self.settings.top_p {
            body["top_p"] = json!(p);
        }
        if let Some(seed) = self.settings.seed {
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

    fn error(&self, failure: HttpFailure) -> ProviderError {
        let provider = "openai".to_owned();
        match failure {
            HttpFailure::Status {
                status: 401 | 403,
                message,
            } => ProviderError::Auth {
                provider,
                status: 401,
                message,
                hint: format!(
                    "set {} to a valid key for {}",
                    self.settings
                        .api_key_env
                        .as_deref()
                        .unwrap_or(DEFAULT_KEY_ENV),
                    self.base_url
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
impl ModelProvider for OpenAiProvider {
    fn spec(&self) -> String {
        format!("openai:{}", self.model)
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let url = format!("{}/chat/completions", self.base_url);
        let mut headers = Vec::new();
        if let Some(key) = &self.api_key {
            headers.push(("authorization", format!("Bearer {key}")));
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
                    let mut response =
                        parse_answer(&answer).map_err(|message| ProviderError::Protocol {
                            provider: "openai".into(),
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
                            "openai",
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

/// Text, finish reason and usage of a Chat Completions answer.
fn parse_answer(answer: &Value) -> Result<ModelResponse, String> {
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

fn clip(value: &Value) -> String {
    value.to_string().chars().take(300).collect()
}
