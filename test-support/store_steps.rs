//! Tasks and steps for the store's tests (the conformance suite, `tests/pgbouncer.rs`,
//! `tests/pg_partitions.rs`, `tests/group_commit.rs`, `tests/task_specs.rs`): a free-form
//! skill, a task of it, an accepted step with an action. Each test binary uses what it needs of
//! them.
#![allow(dead_code)]

use serde_json::{Value, json};
use skillstate_core::json::state_hash;
use skillstate_core::{ContextStrategy, SkillDefinition, StatePatch};
use skillstate_store::{JournalEntry, NewIntent, NewTask, StepCommit, Verdict};

/// A skill whose state is any object.
pub fn free_skill() -> SkillDefinition {
    SkillDefinition {
        name: "free".into(),
        description: "free-form state".into(),
        metadata: None,
        procedure: "anything".into(),
        schema: json!({"type": "object"}),
        initial_state: json!({}),
        settings: Default::default(),
        migrations: Vec::new(),
    }
}

/// A task of [`free_skill`] that opens with `opening`.
pub fn free_task(opening: String) -> NewTask {
    NewTask {
        skill: free_skill(),
        tools: Vec::new(),
        context: ContextStrategy::State,
        context_budget: None,
        model: "scripted:test".into(),
        environment: None,
        env_checkpoint: None,
        opening_observation: opening,
    }
}

/// Accepted step `step` on `state`: merge `patch`, the model's `output`, a `store` action with
/// `args` and its intent, written at `created_at`.
pub fn accepted_step(
    step: u64,
    state: &Value,
    patch: Value,
    output: String,
    args: Value,
    created_at: i64,
) -> StepCommit {
    let new_state = StatePatch::from_value(&patch)
        .and_then(|p| p.apply(state))
        .expect("a test's patch applies");
    StepCommit {
        entry: JournalEntry {
            step,
            attempt: 1,
            verdict: Verdict::Accepted,
            output,
            patch: Some(patch),
            action: Some(json!({"tool": "store", "args": args})),
            errors: None,
            state_hash: Some(state_hash(&new_state)),
            prompt_tokens: 1,
            output_tokens: Some(7),
            prompt_hash: "x".into(),
            usage: None,
            latency_ms: 0,
            created_at,
            author: None,
            board_version: None,
        },
        new_state,
        intent: Some(NewIntent {
            tool: "store".into(),
            args,
            idempotency_key: format!("key-{step}"),
            side_effect: "effectful".into(),
        }),
        status: None,
        previous_result: None,
        next_observation: None,
        world: None,
        upgrade: None,
    }
}
