//! Model providers: what turns a rendered prompt into a model's raw answer.
//!
//! The runtime only sees the `ModelProvider` trait. `scripted` replays a file of outputs and is
//! what tests and demos use; real network providers live beside it.

mod scripted;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use skillstate_core::Prompt;

pub use scripted::ScriptedModel;

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub prompt: Prompt,
    /// Counted locally with o200k_base, for budgets and for comparing providers.
    pub prompt_tokens: usize,
}

/// Token usage as the provider reported it (absent for providers that report nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    pub text: String,
    pub usage: Option<Usage>,
    pub latency: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("model spec `{0}` is not understood; use scripted:<file.jsonl> or oracle")]
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
}

#[async_trait]
pub trait ModelProvider: Send + Sync {
    /// The spec the provider was built from (`scripted:demo.jsonl`), recorded with each task.
    fn spec(&self) -> String;
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError>;
    /// Skips `calls` answers, so that a resumed task continues where the last process stopped.
    fn skip_calls(&self, calls: usize) {
        let _ = calls;
    }
}

/// Builds a provider from a `--model` spec.
pub fn from_spec(spec: &str) -> Result<Box<dyn ModelProvider>, ProviderError> {
    match spec.split_once(':') {
        Some(("scripted", path)) => Ok(Box::new(ScriptedModel::from_file(path.as_ref())?)),
        _ => Err(ProviderError::UnknownSpec(spec.to_owned())),
    }
}
