//! Choosing the model: `--model`/`--base-url`/`--constrain` over `[model]` in skillstate.toml.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use skillstate_providers::{Constrain, ModelProvider, ProviderSettings};

use crate::config::{CONFIG_FILE, Config};

#[derive(clap::Args, Clone, Default)]
pub struct ModelArgs {
    /// The model: openai:<model>, anthropic:<model>, scripted:<file.jsonl> or oracle.
    /// Default: `spec` under [model] in skillstate.toml.
    #[arg(long, env = "SKILLSTATE_MODEL")]
    pub model: Option<String>,
    /// API root of an OpenAI-compatible or Anthropic server (Ollama, vLLM, llama.cpp, ...).
    #[arg(long, env = "SKILLSTATE_BASE_URL")]
    pub base_url: Option<String>,
    /// How to constrain the answer to the step schema: auto, json-schema, json-object, tools, off.
    #[arg(long, value_parser = parse_constrain)]
    pub constrain: Option<Constrain>,
}

fn parse_constrain(text: &str) -> Result<Constrain, String> {
    Constrain::parse(text).ok_or_else(|| {
        format!(
            "unknown mode `{text}`; use one of: {}",
            Constrain::NAMES.join(", ")
        )
    })
}

impl ModelArgs {
    /// The model spec and settings to use; `default` applies when neither flag nor config names one.
    pub fn resolve(
        &self,
        config: &Config,
        default: Option<&str>,
    ) -> Result<(String, ProviderSettings)> {
        let mut settings = config.model.clone();
        if let Some(url) = &self.base_url {
            settings.base_url = Some(url.clone());
        }
        if let Some(mode) = self.constrain {
            settings.constrain = mode;
        }
        let spec = match (&self.model, default, &settings.spec) {
            (Some(spec), _, _) => spec.clone(),
            (None, Some(default), _) => default.to_owned(),
            (None, None, Some(spec)) => spec.clone(),
            (None, None, None) => bail!(
                "no model given: pass --model (openai:<model>, anthropic:<model>, scripted:<file.jsonl>, oracle) or set spec under [model] in {CONFIG_FILE}"
            ),
        };
        Ok((spec, settings))
    }
}

/// Builds the provider; `oracle` needs the environment kind it will read prompts of.
pub fn build_model(
    spec: &str,
    settings: &ProviderSettings,
    environment: Option<&str>,
) -> Result<Arc<dyn ModelProvider>> {
    if spec == "oracle" {
        let kind =
            environment.context("--model oracle needs a skill with a built-in [environment]")?;
        return Ok(Arc::new(
            skillstate_envs::oracle::OracleModel::for_environment(kind)?,
        ));
    }
    Ok(Arc::from(
        skillstate_providers::from_spec(spec, settings).context("--model")?,
    ))
}
