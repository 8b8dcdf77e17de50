//! A rate limit shared through the database: every worker of a batch, on any machine, asks the
//! store before each model request, so together they stay under one requests-per-minute and
//! tokens-per-minute quota. (A single run's provider keeps its own in-process limiter.)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_store::{RateDecision, RateLimit, Store};

use crate::Drain;

/// Longest single sleep while waiting for room in the window; the store is asked again after.
const MAX_NAP: Duration = Duration::from_secs(2);
/// Longest total wait for one request before the step fails as a provider error (retryable).
const MAX_WAIT: Duration = Duration::from_secs(600);

/// Wraps a provider so that each request first takes its place in a shared window.
pub struct SharedRateLimit {
    inner: Arc<dyn ModelProvider>,
    store: Arc<dyn Store>,
    scope: String,
    limit: RateLimit,
    /// The drain of the worker this runs for: waiting for a slot stops the moment it starts,
    /// and no request is sent once it has.
    drain: Option<Drain>,
}

impl SharedRateLimit {
    pub fn new(
        inner: Arc<dyn ModelProvider>,
        store: Arc<dyn Store>,
        scope: String,
        limit: RateLimit,
    ) -> Self {
        Self {
            inner,
            store,
            scope,
            limit,
            drain: None,
        }
    }

    /// Stops waiting for a slot, and sends nothing, once `drain` has started: the request
    /// fails with "not sent" and the (draining) runner leaves its task for another worker.
    pub fn draining_on(mut self, drain: Drain) -> Self {
        self.drain = Some(drain);
        self
    }

    fn drained(&self) -> bool {
        self.drain.as_ref().is_some_and(Drain::is_set)
    }

    fn not_sent(&self) -> ProviderError {
        self.unavailable(
            "the worker is draining: the request was not sent (the task stays queued for another worker)"
                .to_owned(),
        )
    }

    /// Sleeps `nap`, or less when the drain starts meanwhile (`true`).
    async fn nap_or_drain(&self, nap: Duration) -> bool {
        match &self.drain {
            Some(drain) => tokio::select! {
                () = tokio::time::sleep(nap) => false,
                () = drain.started() => true,
            },
            None => {
                tokio::time::sleep(nap).await;
                false
            }
        }
    }

    fn unavailable(&self, last: String) -> ProviderError {
        ProviderError::Unavailable {
            provider: self.inner.spec(),
            attempts: 0,
            last,
        }
    }
}

#[async_trait]
impl ModelProvider for SharedRateLimit {
    fn spec(&self) -> String {
        self.inner.spec()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let tokens = request.prompt_tokens as u64;
        let started = tokio::time::Instant::now();
        loop {
            if self.drained() {
                return Err(self.not_sent());
            }
            let decision = self
                .store
                .rate_acquire(&self.scope, &self.limit, tokens)
                .await
                .map_err(|e| self.unavailable(format!("shared rate limit: {e}")))?;
            match decision {
                RateDecision::Granted => break,
                RateDecision::Wait { ms } => {
                    if started.elapsed() >= MAX_WAIT {
                        return Err(self.unavailable(format!(
                            "the shared rate limit ({}) left no room for {} s",
                            describe(&self.limit),
                            MAX_WAIT.as_secs()
                        )));
                    }
                    let nap = Duration::from_millis(ms.max(5)).min(MAX_NAP);
                    if self.nap_or_drain(nap).await {
                        return Err(self.not_sent());
                    }
                }
            }
        }
        if self.drained() {
            return Err(self.not_sent());
        }
        let response = self.inner.complete(request).await?;
        let answered = response
            .usage
            .as_ref()
            .map(|u| u.output_tokens)
            .unwrap_or(0);
        if answered > 0
            && let Err(error) = self.store.rate_add_tokens(&self.scope, answered).await
        {
            tracing::warn!(scope = %self.scope, %error, "could not record the answer's tokens in the shared rate window");
        }
        Ok(response)
    }

    fn skip_calls(&self, calls: usize) {
        self.inner.skip_calls(calls);
    }

    fn secret_values(&self) -> Vec<String> {
        self.inner.secret_values()
    }

    fn withhold(&self, secrets: &skillstate_core::secrets::Redactor) {
        self.inner.withhold(secrets);
    }
}

fn describe(limit: &RateLimit) -> String {
    let mut parts = Vec::new();
    if let Some(rpm) = limit.requests_per_minute {
        parts.push(format!("{rpm} requests/min"));
    }
    if let Some(tpm) = limit.tokens_per_minute {
        parts.push(format!("{tpm} tokens/min"));
    }
    parts.join(", ")
}
