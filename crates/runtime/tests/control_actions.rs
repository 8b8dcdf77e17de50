//! The runtime's own actions and limits on a skill without an environment: `finish`,
//! `ask_user`, the step limit, a model that errors, and restarting after a crash that left an
//! effectful action's outcome unknown.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill, SkillDefinition};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::prelude::*;
use skillstate_store::{TaskStatus, Verdict};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
    UserRequest,
};

fn notes_skill(max_steps: u32) -> Skill {
    let mut settings = skillstate_core::skill::SkillSettings::default();
    settings.run.max_steps = max_steps;
    Skill::from_definition(SkillDefinition {
        name: "notes".into(),
        description: "Keep notes".into(),
        metadata: None,
        procedure: "Write down what the user says, then finish.".into(),
        schema: json!({"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}}, "required": ["notes"]}),
        initial_state: json!({"notes": []}),
        settings,
        migrations: Vec::new(),
    })
    .unwrap()
}

fn answer(patch: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": "r", "state_patch": patch, "action": {"tool": tool, "args": args}})
        .to_string()
}

#[tokio::test]
async fn finish_completes_with_its_result() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = notes_skill(10);
    let mut env = UserRequest::new("Remember milk.");
    let model = scripted(vec![answer(
        json!({"notes": ["milk"]}),
        "finish",
        json!({"result": "noted"}),
    )]);
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    assert_eq!(
        store.observation(&task.id, 1).await.unwrap().as_deref(),
        Some("Remember milk.")
    );
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);
    assert_eq!(
        outcome.outcome.unwrap(),
        json!({"reason": "finish", "result": "noted"})
    );
    let stored = store.task(&task.id).await.unwrap();
    assert_eq!(stored.state, json!({"notes": ["milk"]}));
    assert!(
        store.intents(&task.id).await.unwrap().is_empty(),
        "control actions are not tool intents"
    );
}

#[tokio::test]
async fn ask_user_pauses_the_task() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = notes_skill(10);
    let mut env = UserRequest::new("Remember something.");
    let model = scripted(vec![
        answer(json!({}), "ask_user", json!({"question": "Remember what?"})),
        answer(
            json!({"notes": ["eggs"]}),
            "finish",
            json!({"result": "noted"}),
        ),
    ]);
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::AwaitingInput);
    assert_eq!(outcome.outcome.unwrap()["question"], "Remember what?");
    // The pause survives a restart: a new runner (a new process) answers it.
    let mut env = UserRequest::new("Remember something.");
    let model = scripted(vec![
        answer(json!({}), "ask_user", json!({"question": "Remember what?"})),
        answer(
            json!({"notes": ["eggs"]}),
            "finish",
            json!({"result": "noted"}),
        ),
    ]);
    let resumed = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .reply(&task.id, "eggs")
        .await
        .unwrap();
    assert_eq!(resumed.status, TaskStatus::Completed);
    assert_eq!(
        store.observation(&task.id, 2).await.unwrap().as_deref(),
        Some("The user answered: eggs")
    );
    assert_eq!(
        store.task(&task.id).await.unwrap().state,
        json!({"notes": ["eggs"]})
    );
}

#[tokio::test]
async fn the_step_limit_stops_a_task_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = warehouse_skill(7, 10);
    let mut limited = skill.definition.clone();
    limited.settings.run.max_steps = 4;
    let skill = Skill::from_definition(limited).unwrap();
    let (task, outcome) = run_warehouse(store.clone(), &skill, 7, 10, correct_answers(7, 10)).await;
    assert_eq!(outcome.status, TaskStatus::Failed);
    assert_eq!(task.version, 4);
    let reason = task.outcome.unwrap();
    assert_eq!(reason["reason"], "max_steps");
    assert!(
        reason["message"]
            .as_str()
            .unwrap()
            .contains("max_steps = 4")
    );
}

#[tokio::test]
async fn a_model_error_fails_the_task_and_keeps_committed_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = warehouse_skill(7, 10);
    let answers: Vec<String> = correct_answers(7, 10).into_iter().take(3).collect();
    let (task, outcome) = run_warehouse(store.clone(), &skill, 7, 10, answers).await;
    assert_eq!(outcome.status, TaskStatus::Failed);
    assert_eq!(task.version, 3);
    assert_eq!(task.outcome.as_ref().unwrap()["reason"], "provider");
    assert_eq!(store.journal(&task.id).await.unwrap().len(), 3);
}

/// A tool that counts its calls, to prove what a restart runs again.
struct Counter {
    spec: ToolSpec,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Tool for Counter {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(ToolOutput::success(format!(
            "charged once with key {}",
            ctx.idempotency_key
        )))
    }
}

struct Till {
    tools: Vec<Arc<dyn Tool>>,
}

impl Till {
    fn new(side_effect: SideEffect, calls: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        let spec = ToolSpec {
            name: "charge".into(),
            description: "Charge the customer".into(),
            input_schema: json!({"type": "object"}),
            side_effect,
            source: "till".into(),
            needs_approval: false,
        };
        Self {
            tools: vec![Arc::new(Counter { spec, calls })],
        }
    }
}

impl Environment for Till {
    fn kind(&self) -> &str {
        "till"
    }
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }
    fn opening_observation(&mut self) -> String {
        "Charge the customer.".into()
    }
    fn after_action(&mut self) -> Option<String> {
        None
    }
    fn episode_over(&self) -> bool {
        false
    }
    fn outcome(&self) -> Value {
        Value::Null
    }
    fn checkpoint(&self) -> Value {
        Value::Null
    }
    fn restore(&mut self, _: &Value) -> Result<(), EnvironmentError> {
        Ok(())
    }
}

/// Commits step 1 with a `charge` intent and then "crashes" (the tool never runs), as a kill
/// between commit and tool would. Returns the task id.
async fn crash_after_commit(
    store: Arc<skillstate_store::SqliteStore>,
    side_effect: SideEffect,
    on_unknown_outcome: skillstate_core::skill::UnknownOutcome,
) -> String {
    let mut skill_def = notes_skill(5).definition;
    skill_def.settings.tools.allow = vec!["till".into()];
    skill_def.settings.run.on_unknown_outcome = on_unknown_outcome;
    let skill = Skill::from_definition(skill_def).unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut env = Till::new(side_effect, calls.clone());
    let model = scripted(vec![answer(json!({}), "charge", json!({}))]);
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    let commit = skillstate_store::StepCommit {
        entry: skillstate_store::JournalEntry {
            step: 1,
            attempt: 1,
            verdict: Verdict::Accepted,
            output: answer(json!({}), "charge", json!({})),
            patch: Some(json!({})),
            action: Some(json!({"tool": "charge", "args": {}})),
            errors: None,
            state_hash: Some(skillstate_core::json::state_hash(&json!({"notes": []}))),
            prompt_tokens: 1,
            output_tokens: Some(7),
            prompt_hash: "x".into(),
            usage: None,
            latency_ms: 0,
            created_at: 0,
            author: None,
            board_version: None,
        },
        new_state: json!({"notes": []}),
        intent: Some(skillstate_store::NewIntent {
            tool: "charge".into(),
            args: json!({}),
            idempotency_key: format!("{}:1", task.id),
            side_effect: side_effect.as_str().into(),
        }),
        status: None,
        previous_result: None,
        next_observation: None,
        world: None,
        upgrade: None,
    };
    store.commit_step(&task.id, 0, &commit).await.unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    task.id
}

/// Restarts the crashed task with a fresh environment; returns how often the tool ran and the
/// observation step 2 starts from.
async fn restart(side_effect: SideEffect) -> (String, usize, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let task = crash_after_commit(
        store.clone(),
        side_effect,
        skillstate_core::skill::UnknownOutcome::Observe,
    )
    .await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut env = Till::new(side_effect, calls.clone());
    let model = scripted(vec![String::new(), answer(json!({}), "finish", json!({}))]);
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);
    let observation = store.observation(&task, 2).await.unwrap().unwrap();
    (
        task,
        calls.load(std::sync::atomic::Ordering::SeqCst),
        observation,
    )
}

#[tokio::test]
async fn after_a_crash_an_effectful_action_is_not_repeated_blindly() {
    let (_, calls, observation) = restart(SideEffect::Effectful).await;
    assert_eq!(calls, 0, "the effectful tool must not run again");
    assert!(observation.starts_with("Outcome unknown"), "{observation}");
    assert!(observation.contains("charge"));
    // Only what is known: the action was committed; the crash may have come before it started.
    assert!(
        observation.contains("was committed")
            && observation.contains("whether it started")
            && !observation.contains("was running"),
        "{observation}"
    );
}

#[tokio::test]
async fn a_skill_can_ask_a_human_about_an_unknown_outcome() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let task = crash_after_commit(
        store.clone(),
        SideEffect::Effectful,
        skillstate_core::skill::UnknownOutcome::Ask,
    )
    .await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let model = scripted(vec![String::new(), answer(json!({}), "finish", json!({}))]);
    let mut env = Till::new(SideEffect::Effectful, calls.clone());
    let paused = Runner::new(store.clone(), model.clone(), &mut env, &mut NoProgress)
        .run(&task)
        .await
        .unwrap();
    assert_eq!(paused.status, TaskStatus::AwaitingInput);
    let question = paused.outcome.unwrap()["question"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        question.contains("`charge`") && question.contains("whether it started"),
        "{question}"
    );
    let done = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .reply(&task, "the card was charged once")
        .await
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "never re-run blindly"
    );
    let observation = store.observation(&task, 2).await.unwrap().unwrap();
    assert_eq!(
        observation,
        "A human reported on `charge` (step 1): the card was charged once"
    );
}

#[tokio::test]
async fn after_a_crash_an_idempotent_action_runs_again_with_the_same_key() {
    let (task, calls, observation) = restart(SideEffect::Idempotent).await;
    assert_eq!(calls, 1);
    assert_eq!(observation, format!("charged once with key {task}:1"));
}

/// A tool that never answers, as one stuck on a pipe or a hung server would.
struct Hang {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Hang {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_tool_that_never_answers_becomes_an_observation_and_the_task_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let mut skill_def = notes_skill(5).definition;
    skill_def.settings.tools.allow = vec!["till".into()];
    let skill = Skill::from_definition(skill_def).unwrap();
    let spec = ToolSpec {
        name: "charge".into(),
        description: "Charge the customer".into(),
        input_schema: json!({"type": "object"}),
        side_effect: SideEffect::Effectful,
        source: "till".into(),
        needs_approval: false,
    };
    let mut env = Till {
        tools: vec![Arc::new(Hang { spec })],
    };
    let model = scripted(vec![
        answer(json!({}), "charge", json!({})),
        answer(json!({}), "finish", json!({"result": "gave up"})),
    ]);
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .with_tool_limit(std::time::Duration::from_millis(200))
        .run(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);
    let observation = store.observation(&task.id, 2).await.unwrap().unwrap();
    assert!(
        observation.contains("`charge` gave no result within 1 s")
            && observation.contains("may or may not have happened"),
        "{observation}"
    );
    let intents = store.intents(&task.id).await.unwrap();
    assert_eq!(intents[0].ok, Some(false));
}
