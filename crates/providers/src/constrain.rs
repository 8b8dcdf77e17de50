//! Which constrain mode a provider uses now: `auto` probes the strongest mode the provider
//! offers and, if the server rejects it, falls back once (with a logged reason) for good.

use std::sync::Mutex;

use crate::settings::Constrain;

pub struct ModeChoice {
    requested: Constrain,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    current: Constrain,
    /// Auto mode, not yet accepted by the server: a rejection may still fall back.
    tentative: bool,
}

impl ModeChoice {
    /// `strongest` and `fallback` are the provider's modes for `auto`.
    pub fn new(requested: Constrain, strongest: Constrain) -> Self {
        let (current, tentative) = match requested {
            Constrain::Auto => (strongest, true),
            other => (other, false),
        };
        Self {
            requested,
            state: Mutex::new(State { current, tentative }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current(&self) -> Constrain {
        self.lock().current
    }

    /// Whether a rejection of the current mode may fall back instead of failing.
    pub fn is_tentative(&self) -> bool {
        self.lock().tentative
    }

    pub fn confirm(&self) {
        self.lock().tentative = false;
    }

    /// Falls back from a rejected auto mode to `fallback`; `false` if no fallback is left.
    pub fn fall_back(&self, fallback: Constrain, provider: &str, reason: &str) -> bool {
        let mut state = self.lock();
        if !state.tentative {
            return false;
        }
        tracing::warn!(
            provider,
            from = state.current.as_str(),
            to = fallback.as_str(),
            "the server rejected constrained output ({reason}); falling back"
        );
        eprintln!(
            "note: {provider} rejected --constrain {} ({reason}); falling back to {} (requested: {})",
            state.current.as_str(),
            fallback.as_str(),
            self.requested.as_str()
        );
        state.current = fallback;
        state.tentative = false;
        true
    }
}
