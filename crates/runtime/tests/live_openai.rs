//! Opt-in: the warehouse skill against a real OpenAI-compatible server, with and without
//! constrained output. Set SKILLSTATE_LIVE_BASE_URL (e.g. http://127.0.0.1:8080/v1 for a local
//! llama.cpp `llama-server`, or http://127.0.0.1:11434/v1 for Ollama) and optionally
//! SKILLSTATE_LIVE_MODEL (default `smollm2`), SKILLSTATE_LIVE_CALLS (default 20). Without it the
//! test records a visible skip (test-support/skip.rs) that scripts/test lists after the run.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use skillstate_core::{ContextStrategy, RejectionKind, Skill};
use skillstate_providers::{Constrain, ModelProvider, OpenAiProvider, ProviderSettings};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::Verdict;
use skillstate_store::prelude::*;

struct Rates {
    calls: usize,
    parsed: usize,
    shape_ok: usize,
    accepted: usize,
}

async fn measure(base_url: &str, model: &str, constrain: Constrain, calls_wanted: usize) -> Rates {
    let settings = ProviderSettings {
        base_url: Some(base_url.to_owned()),
        constrain,
        max_tokens: 400,
        temperature: Some(0.0),
        max_retries: 2,
        timeout_secs: 300,
        ..ProviderSettings::default()
    };
    let provider: Arc<dyn ModelProvider> =
        Arc::new(OpenAiProvider::with_key(model, &settings, None).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let mut rates = Rates {
        calls: 0,
        parsed: 0,
        shape_ok: 0,
        accepted: 0,
    };
    let mut seed = 0;
    while rates.calls < calls_wanted {
        let mut definition = warehouse_skill(seed, calls_wanted as u32).definition;
        // Keep asking after rejections so that every call is one more sample.
        definition.settings.run.max_retries = calls_wanted as u32;
        let skill = Skill::from_definition(definition).unwrap();
        let mut env = warehouse(seed, calls_wanted as u32);
        let options = TaskOptions::new(provider.spec(), ContextStrategy::State);
        let task = start_task(store.as_ref(), &skill, &mut env, &options)
            .await
            .unwrap();
        Runner::new(store.clone(), provider.clone(), &mut env, &mut NoProgress)
            .run(&task.id)
            .await
            .unwrap();
        for entry in store.journal(&task.id).await.unwrap() {
            let kinds: Vec<RejectionKind> = entry
                .errors
                .as_ref()
                .and_then(|e| {
                    serde_json::from_value::<Vec<skillstate_core::Rejection>>(e.clone()).ok()
                })
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.kind)
                .collect();
            rates.calls += 1;
            rates.parsed += usize::from(!kinds.contains(&RejectionKind::Parse));
            rates.shape_ok += usize::from(
                !kinds.contains(&RejectionKind::Parse)
                    && !kinds.contains(&RejectionKind::PatchShape),
            );
            rates.accepted += usize::from(entry.verdict == Verdict::Accepted);
        }
        seed += 1;
    }
    rates
}

#[tokio::test]
async fn live_openai_compatible_server() {
    let Ok(base_url) = std::env::var("SKILLSTATE_LIVE_BASE_URL") else {
        common::skip::skip_test(
            "SKILLSTATE_LIVE_BASE_URL is not set",
            "point it at an OpenAI-compatible server (e.g. http://127.0.0.1:11434/v1 for Ollama)",
        );
        return;
    };
    let model = std::env::var("SKILLSTATE_LIVE_MODEL").unwrap_or_else(|_| "smollm2".into());
    let calls: usize = std::env::var("SKILLSTATE_LIVE_CALLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(20);
    let constrained = measure(&base_url, &model, Constrain::Auto, calls).await;
    let free = measure(&base_url, &model, Constrain::Off, calls).await;
    for (name, r) in [
        ("constrained (auto)", &constrained),
        ("unconstrained (off)", &free),
    ] {
        eprintln!(
            "{name}: {} calls, parsed {}/{} ({:.0}%), patch shape ok {}/{} ({:.0}%), accepted {}/{}",
            r.calls,
            r.parsed,
            r.calls,
            100.0 * r.parsed as f64 / r.calls as f64,
            r.shape_ok,
            r.calls,
            100.0 * r.shape_ok as f64 / r.calls as f64,
            r.accepted,
            r.calls
        );
    }
    assert!(constrained.calls >= calls);
    assert_eq!(
        constrained.parsed, constrained.calls,
        "constrained output must always parse"
    );
    assert_eq!(
        constrained.shape_ok, constrained.calls,
        "constrained patches must always have a valid shape"
    );
}
