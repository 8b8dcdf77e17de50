//! The HTTP side every network provider shares: one client, retries with exponential backoff
//! and jitter on 429/5xx/timeouts/connection errors (honouring `Retry-After`), a client-side
//! rate limiter, and error texts that never carry a secret.

use std::collections::VecDeque;
use std::sync::{Arc, Once, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use serde_json::Value;
use skillstate_core::outside::Outside;
use skillstate_core::secrets::Redactor;
use tokio::sync::Mutex;

use crate::settings::ProviderSettings;

/// The request failed for good (after any retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpFailure {
    /// The server answered with an error status that retrying will not fix.
    Status { status: u16, message: String },
    /// Retries ran out on 429/5xx/timeouts/connection errors; `last` says what happened last.
    Exhausted { attempts: u32, last: String },
}

/// Whether 5xx answers are retried. An `auto` constrain probe turns retries off so that a
/// server rejecting the schema mode (llama.cpp answers 500) falls back at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerErrors {
    Retry,
    Return,
}

pub struct Transport {
    client: reqwest::Client,
    max_retries: u32,
    limiter: RateLimiter,
    /// Secrets to scrub from every body before anything reads or cuts it: the key, and what
    /// the runtime adds (`ModelProvider::withhold`).
    secrets: RwLock<Arc<Redactor>>,
}

fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Fails only if another provider was installed first, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Transport {
    pub fn new(settings: &ProviderSettings, secret: Option<String>) -> Result<Self, String> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(settings.timeout())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            client,
            max_retries: settings.max_retries,
            limiter: RateLimiter::new(settings.requests_per_minute, settings.tokens_per_minute),
            secrets: RwLock::new(Arc::new(Redactor::new(secret))),
        })
    }

    /// The secrets in force.
    pub fn secrets(&self) -> Arc<Redactor> {
        Arc::clone(&self.secrets.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Adds `more` to the secrets every body is redacted of.
    pub fn withhold(&self, more: &Redactor) {
        let mut secrets = self.secrets.write().unwrap_or_else(|p| p.into_inner());
        let mut all = Redactor::clone(&secrets);
        all.extend(more);
        *secrets = Arc::new(all);
    }

    /// `text` (which came from outside: an error's text, a body's part) without any secret.
    pub fn redact(&self, text: &str) -> String {
        Outside::new(text).redacted(&self.secrets())
    }

    /// POSTs `body` as JSON and returns the parsed JSON answer.
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
        token_estimate: u64,
        server_errors: ServerErrors,
    ) -> Result<Value, HttpFailure> {
        let mut attempt = 0u32;
        loop {
            self.limiter.acquire(token_estimate).await;
            let mut request = self.client.post(url).json(body);
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            // The model call's span is the parent of what the model server records.
            if crate::trace_context::enabled() {
                let mut trace = reqwest::header::HeaderMap::new();
                crate::trace_context::inject(&mut trace);
                request = request.headers(trace);
            }
            let (failure, retry_after) = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = retry_after(response.headers());
                    // Every body, of every status, is outside text: redacted as a whole before
                    // it is parsed, quoted or cut.
                    let body = Outside::from_bytes(&response.bytes().await.unwrap_or_default());
                    let secrets = self.secrets();
                    if (200..300).contains(&status) {
                        match body.json(&secrets) {
                            Ok(json) => return Ok(json),
                            Err(e) => (
                                self.redact(&format!("the server sent malformed JSON ({e})")),
                                None,
                            ),
                        }
                    } else {
                        let message = error_message(&body, &secrets);
                        let retryable = status == 429
                            || (status >= 500 && server_errors == ServerErrors::Retry);
                        if !retryable {
                            return Err(HttpFailure::Status { status, message });
                        }
                        (format!("HTTP {status}: {message}"), retry_after)
                    }
                }
                Err(e) if e.is_timeout() => ("the request timed out".to_owned(), None),
                Err(e) => (
                    self.redact(&format!("connection failed: {}", without_url(&e))),
                    None,
                ),
            };
            if attempt >= self.max_retries {
                return Err(HttpFailure::Exhausted {
                    attempts: attempt + 1,
                    last: failure,
                });
            }
            let wait = retry_after.unwrap_or_else(|| backoff(attempt));
            tracing::warn!(
                attempt = attempt + 1,
                wait_ms = wait.as_millis() as u64,
                "{failure}; retrying"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// Longest message quoted from an error body, in characters.
pub(crate) const MAX_ERROR_CHARS: usize = 500;

/// The message of an API error body (`{"error": {"message": ...}}` and similar), or the text;
/// redacted whole, then at most [`MAX_ERROR_CHARS`] characters.
fn error_message(body: &Outside, secrets: &Redactor) -> String {
    let from_json = body.json(secrets).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.pointer("/message"))
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .or_else(|| v.get("detail"))
            .map(|m| {
                m.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| m.to_string())
            })
    });
    // `from_json` was parsed from the redacted body; the whole text is redacted here.
    let text = from_json.unwrap_or_else(|| body.redacted(secrets).trim().to_owned());
    let clipped = Outside::new(text)
        .clipped_chars(secrets, MAX_ERROR_CHARS)
        .text;
    if clipped.is_empty() {
        "(no message)".to_owned()
    } else {
        clipped
    }
}

/// reqwest errors print the URL, which may carry credentials; keep only the cause.
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = value("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(Duration::from_secs_f64((ms / 1000.0).clamp(0.0, 120.0)));
    }
    value("retry-after")
        .and_then(|v| v.parse::<f64>().ok())
        .map(|secs| Duration::from_secs_f64(secs.clamp(0.0, 120.0)))
}

/// 0.5 s · 2^attempt, at most 30 s, with ±25% jitter so that clients do not retry in step.
fn backoff(attempt: u32) -> Duration {
    let base = (0.5 * 2f64.powi(attempt.min(10) as i32)).min(30.0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = 0.75 + f64::from(nanos % 1000) / 2000.0;
    Duration::from_secs_f64(base * jitter)
}

/// Requests per minute and tokens per minute over a sliding one-minute window.
pub struct RateLimiter {
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u32>,
    window: Mutex<VecDeque<(Instant, u64)>>,
}

impl RateLimiter {
    pub fn new(requests_per_minute: Option<u32>, tokens_per_minute: Option<u32>) -> Self {
        Self {
            requests_per_minute,
            tokens_per_minute,
            window: Mutex::new(VecDeque::new()),
        }
    }

    /// Waits until one more request of `tokens` tokens fits both limits, then records it.
    pub async fn acquire(&self, tokens: u64) {
        if self.requests_per_minute.is_none() && self.tokens_per_minute.is_none() {
            return;
        }
        let minute = Duration::from_secs(60);
        loop {
            let wait = {
                let mut window = self.window.lock().await;
                let now = Instant::now();
                while window
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at) >= minute)
                {
                    window.pop_front();
                }
                let requests_ok = self
                    .requests_per_minute
                    .is_none_or(|rpm| (window.len() as u64) < u64::from(rpm.max(1)));
                let used: u64 = window.iter().map(|(_, t)| t).sum();
                // A request larger than the whole budget still goes through, alone.
                let tokens_ok = self
                    .tokens_per_minute
                    .is_none_or(|tpm| window.is_empty() || used + tokens <= u64::from(tpm));
                if requests_ok && tokens_ok {
                    window.push_back((now, tokens));
                    return;
                }
                window
                    .front()
                    .map(|(at, _)| minute.saturating_sub(now.duration_since(*at)))
                    .unwrap_or(minute)
            };
            tokio::time::sleep(wait.max(Duration::from_millis(5))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_and_backoff() {
        let message = |body: &str| error_message(&Outside::new(body), &Redactor::default());
        assert_eq!(
            message(r#"{"error": {"message": "model not found", "type": "x"}}"#),
            "model not found"
        );
        assert_eq!(
            message(
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            "Overloaded"
        );
        assert_eq!(message("plain failure\n"), "plain failure");
        for attempt in 0..12 {
            let b = backoff(attempt);
            assert!(
                b >= Duration::from_millis(375) && b <= Duration::from_millis(37_500),
                "{b:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limiter_spaces_requests() {
        let limiter = RateLimiter::new(Some(2), None);
        let start = tokio::time::Instant::now();
        limiter.acquire(1).await;
        limiter.acquire(1).await;
        limiter.acquire(1).await;
        assert!(
            start.elapsed() >= Duration::from_secs(59),
            "{:?}",
            start.elapsed()
        );
    }
}
