//! What the network providers share: the key, the transport, the constrain mode with its one
//! fallback, and how HTTP failures become `ProviderError`s.

use std::sync::Arc;

use serde_json::Value;
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;

use crate::constrain::ModeChoice;
use crate::http::{HttpFailure, ServerErrors, Transport};
use crate::settings::{Constrain, ProviderSettings};
use crate::{ModelRequest, ProviderError};

/// Longest part of an answer quoted in a protocol error, in characters.
pub(crate) const MAX_QUOTED_CHARS: usize = 300;

pub(crate) struct Client {
    pub provider: &'static str,
    pub model: String,
    pub base_url: String,
    pub api_key: Option<String>,
    key_env: String,
    pub settings: ProviderSettings,
    transport: Transport,
    mode: ModeChoice,
}

/// The vendor defaults of one provider.
pub(crate) struct Vendor {
    pub name: &'static str,
    pub base_url: &'static str,
    pub key_env: &'static str,
    /// What `--constrain auto` tries first.
    pub strongest: Constrain,
}

impl Client {
    pub fn new(
        vendor: &Vendor,
        model: &str,
        settings: &ProviderSettings,
        api_key: Option<String>,
    ) -> Result<Self, ProviderError> {
        let base_url = settings
            .base_url
            .clone()
            .unwrap_or_else(|| vendor.base_url.to_owned());
        // A local server needs no key; a missing key only fails if the server asks for one.
        let transport = Transport::new(settings, api_key.clone()).map_err(ProviderError::Config)?;
        Ok(Self {
            provider: vendor.name,
            model: model.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            key_env: settings
                .api_key_env
                .clone()
                .unwrap_or_else(|| vendor.key_env.to_owned()),
            settings: settings.clone(),
            transport,
            mode: ModeChoice::new(settings.constrain, vendor.strongest),
        })
    }

    /// The key from the environment variable the settings name (or the vendor's default).
    pub fn key_from_env(vendor: &Vendor, settings: &ProviderSettings) -> Option<String> {
        let name = settings.api_key_env.as_deref().unwrap_or(vendor.key_env);
        std::env::var(name).ok().filter(|k| !k.trim().is_empty())
    }

    /// POSTs the body built for the current constrain mode. While `auto` is still probing, a
    /// server that rejects the mode (HTTP 400/422/500/501) makes it fall back once to
    /// `json-object` and try again. Returns the answer and the mode it was given in.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        request: &ModelRequest,
        body: impl Fn(Constrain) -> Value,
    ) -> Result<(Value, Constrain), ProviderError> {
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
                .post_json(url, headers, &body(mode), estimate, server_errors)
                .await
            {
                Ok(answer) => {
                    if probing {
                        self.mode.confirm();
                    }
                    return Ok((answer, mode));
                }
                Err(HttpFailure::Status { status, message })
                    if probing
                        && matches!(status, 400 | 422 | 500 | 501)
                        && self.mode.fall_back(
                            Constrain::JsonObject,
                            self.provider,
                            &format!("HTTP {status}: {message}"),
                        ) => {}
                Err(failure) => return Err(self.error(failure)),
            }
        }
    }

    /// The secrets every body is redacted of.
    pub fn secrets(&self) -> Arc<Redactor> {
        self.transport.secrets()
    }

    /// Adds the runtime's secrets to the key.
    pub fn withhold(&self, more: &Redactor) {
        self.transport.withhold(more);
    }

    /// A part of an answer, quoted in an error: redacted, then cut to [`MAX_QUOTED_CHARS`].
    pub fn quote(secrets: &Redactor, value: &Value) -> String {
        Outside::from(value)
            .clipped_chars(secrets, MAX_QUOTED_CHARS)
            .text
    }

    pub fn protocol_error(&self, message: &str) -> ProviderError {
        ProviderError::Protocol {
            provider: self.provider.to_owned(),
            message: self.transport.redact(message),
        }
    }

    fn error(&self, failure: HttpFailure) -> ProviderError {
        let provider = self.provider.to_owned();
        match failure {
            HttpFailure::Status {
                status: 401 | 403,
                message,
            } => ProviderError::Auth {
                provider,
                status: 401,
                message,
                hint: format!("set {} to a valid key for {}", self.key_env, self.base_url),
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
