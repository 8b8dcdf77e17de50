//! Model settings: `[model]` and `[prices]` in `skillstate.toml`, environment variables and
//! flags. Secrets never live here: only the NAME of the environment variable holding a key.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a provider constrains the model's output to the step schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Constrain {
    /// The strongest mode the provider accepts; falls back once if the server rejects it.
    #[default]
    Auto,
    /// `response_format: json_schema` (OpenAI-compatible servers).
    JsonSchema,
    /// JSON mode: `response_format: json_object` with the schema attached (OpenAI-compatible),
    /// or an assistant turn prefilled with `{` (Anthropic).
    JsonObject,
    /// A forced tool call whose input schema is the step schema.
    Tools,
    /// Prompt instructions only.
    Off,
}

impl Constrain {
    pub const NAMES: &'static [&'static str] =
        &["auto", "json-schema", "json-object", "tools", "off"];

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "auto" => Constrain::Auto,
            "json-schema" => Constrain::JsonSchema,
            "json-object" => Constrain::JsonObject,
            "tools" => Constrain::Tools,
            "off" => Constrain::Off,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Constrain::Auto => "auto",
            Constrain::JsonSchema => "json-schema",
            Constrain::JsonObject => "json-object",
            Constrain::Tools => "tools",
            Constrain::Off => "off",
        }
    }
}

/// Everything about calling a model except the secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderSettings {
    /// Default model spec when `--model` is not given (`openai:gpt-4.1-mini`).
    pub spec: Option<String>,
    /// API root, e.g. `http://127.0.0.1:11434/v1` for Ollama. Defaults to the vendor's.
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (default OPENAI_API_KEY /
    /// ANTHROPIC_API_KEY). The key itself is never read from a file.
    pub api_key_env: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: u32,
    pub seed: Option<u64>,
    pub timeout_secs: u64,
    /// Retries after a 429, a 5xx, a timeout or a connection error.
    pub max_retries: u32,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    pub constrain: Constrain,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        Self {
            spec: None,
            base_url: None,
            api_key_env: None,
            temperature: None,
            top_p: None,
            max_tokens: 1024,
            seed: None,
            timeout_secs: 120,
            max_retries: 4,
            requests_per_minute: None,
            tokens_per_minute: None,
            constrain: Constrain::Auto,
        }
    }
}

impl ProviderSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.max(1))
    }
}

/// US dollars per million tokens for one model spec.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Price of prompt tokens served from the provider's cache (default: the input price).
    pub cached_input: Option<f64>,
}

impl Price {
    /// Estimated cost in USD of `usage` at this price.
    pub fn cost(&self, usage: &crate::Usage) -> f64 {
        let cached = usage
            .cached_input_tokens
            .unwrap_or(0)
            .min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        (fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_counts_cached_tokens_at_their_price() {
        let price = Price {
            input: 2.0,
            output: 8.0,
            cached_input: Some(0.5),
        };
        let usage = crate::Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cached_input_tokens: Some(400_000),
            cache_write_tokens: None,
        };
        assert!((price.cost(&usage) - (0.6 * 2.0 + 0.4 * 0.5 + 0.5 * 8.0)).abs() < 1e-9);
        let plain = Price {
            input: 1.0,
            output: 1.0,
            cached_input: None,
        };
        assert!((plain.cost(&usage) - 1.5).abs() < 1e-9);
    }
}
