//! Model providers: what turns a rendered prompt into a model's raw answer.
//!
//! The runtime only sees the `ModelProvider` trait. `scripted` replays a file of outputs (tests,
//! demos); `openai` speaks the OpenAI-compatible Chat Completions API (OpenAI, Ollama, vLLM,
//! llama.cpp server, LM Studio, OpenRouter); `anthropic` speaks the Messages API.

mod anthropic;
mod client;
mod constrain;
mod http;
mod openai;
mod scripted;
mod settings;
pub mod trace_context;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_core::Prompt;
use skillstate_core::secrets::Redactor;

pub use anthropic::AnthropicProvider;
pub use http::RateLimiter;
pub use openai::OpenAiProvider;
pub use scripted::ScriptedModel;
pub use settings::{Constrain, Price, ProviderSettings};

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub prompt: Prompt,
    /// Counted locally with o200k_base, for budgets and for comparing providers.
    pub prompt_tokens: usize,
    /// JSON Schema of a whole step answer, for providers that constrain decoding.
    pub output_schema: Option<Arc<Value>>,
}

/// Token usage as the provider reported it (absent for providers that report nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every prompt token the provider processed, cached ones included.
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Prompt tokens written to the provider's cache (Anthropic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        if let Some(c) = other.cached_input_tokens {
            *self.cached_input_tokens.get_or_insert(0) += c;
        }
        if let Some(c) = other.cache_write_tokens {
            *self.cache_write_tokens.get_or_insert(0) += c;
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    pub text: String,
    pub usage: Option<Usage>,
    pub latency: Duration,
    /// The output hit the token limit (`finish_reason: length` / `stop_reason: max_tokens`).
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error(
        "model spec `{0}` is not understood; use scripted:<file.jsonl>, openai:<model>, anthropic:<model> or oracle"
    )]
    UnknownSpec(String),
    #[error("{path}: {message}")]
    Script { path: String, message: String },
    #[error(
        "{path}: the script is exhausted after {used} output(s); the run needed output #{needed}. Add lines to the file or lower max_steps"
    )]
    Exhausted {
        path: String,
        used: usize,
        needed: usize,
    },
    #[error("{provider}: authentication failed (HTTP {status}): {message}; {hint}")]
    Auth {
        provider: String,
        status: u16,
        message: String,
        hint: String,
    },
    #[error(
        "{provider}: model `{model}` was not found at {base_url}: {message}; check the model name and --base-url"
    )]
    ModelNotFound {
        provider: String,
        model: String,
        base_url: String,
        message: String,
    },
    #[error("{provider}: the request was rejected (HTTP {status}): {message}")]
    Rejected {
        provider: String,
        status: u16,
        message: String,
    },
    #[error("{provider}: unavailable after {attempts} attempt(s): {last}")]
    Unavailable {
        provider: String,
        attempts: u32,
        last: String,
    },
    #[error("{provider}: malformed response: {message}")]
    Protocol { provider: String, message: String },
    #[error("model configuration: {0}")]
    Config(String),
}

#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// The spec the provider was built from (`openai:gpt-4.1-mini`), recorded with each task.
    /// It never contains a secret.
    fn spec(&self) -> String;
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError>;
    /// Skips `calls` answers, so that a resumed task continues where the last process stopped.
    fn skip_calls(&self, calls: usize) {
        let _ = calls;
    }
    /// The secret values this provider holds (its API key), so that the runtime can keep them
    /// out of everything it stores and prints.
    fn secret_values(&self) -> Vec<String> {
        Vec::new()
    }
    /// More secret values (the operator's) that this provider redacts from every body it
    /// receives before it parses, quotes or cuts it, as it does its own key.
    fn withhold(&self, secrets: &Redactor) {
        let _ = secrets;
    }
}

/// Builds a provider from a `--model` spec and the model settings.
pub fn from_spec(
    spec: &str,
    settings: &ProviderSettings,
) -> Result<Box<dyn ModelProvider>, ProviderError> {
    match spec.split_once(':') {
        Some(("scripted", path)) => Ok(Box::new(ScriptedModel::from_file(path.as_ref())?)),
        Some(("openai", model)) if !model.is_empty() => {
            Ok(Box::new(OpenAiProvider::new(model, settings)?))
        }
        Some(("anthropic", model)) if !model.is_empty() => {
            Ok(Box::new(AnthropicProvider::new(model, settings)?))
        }
        _ => Err(ProviderError::UnknownSpec(spec.to_owned())),
    }
}
