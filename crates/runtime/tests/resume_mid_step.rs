//! A run that dies in the middle of a step — after an answer was rejected, before the next one
//! came — and is resumed by a new runner: the runner reads the journal once when it starts and
//! keeps the step's bookkeeping in memory, so the answers rejected before the crash still count
//! against the step's retries, the last one's errors are still shown to the model, and attempt
//! numbers go on where they stopped. Real SQLite file.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use serde_json::json;
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::{
    LeasePolicy, NoProgress, Runner, TaskOptions, rebuild_prompt, start_task,
};
use skillstate_store::prelude::*;
use skillstate_store::{TaskStatus, Verdict};
use tokio::sync::Notify;

/// Gives its answers in order and records every prompt it receives; once out of answers it
/// announces the call and never answers (the process "dies" waiting for the model).
struct Model {
    answers: Mutex<Vec<String>>,
    prompts: Mutex<Vec<String>>,
    stuck: Arc<Notify>,
}

impl Model {
    fn new(answers: Vec<String>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.into_iter().rev().collect()),
            prompts: Mutex::new(Vec::new()),
            stuck: Arc::new(Notify::new()),
        })
    }
}

#[async_trait]
impl ModelProvider for Model {
    fn spec(&self) -> String {
        "scripted:test".into()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        self.prompts.lock().unwrap().push(request.prompt.text());
        let next = self.answers.lock().unwrap().pop();
        match next {
            Some(text) => Ok(ModelResponse {
                text,
                usage: None,
                latency: Duration::ZERO,
                truncated: false,
            }),
            None => {
                self.stuck.notify_one();
                std::future::pending().await
            }
        }
    }
}

/// Valid JSON whose patch breaks the schema (an item must be a string).
fn bad_answer() -> String {
    json!({"reasoning": "x", "state_patch": {"inventory": {"shelf_9": 9}}, "action": {"tool": "wait", "args": {}}}).to_string()
}

const LEASE: Duration = Duration::from_millis(300);

fn policy() -> LeasePolicy {
    LeasePolicy {
        ttl: LEASE,
        label: "test".into(),
    }
}

#[tokio::test]
async fn a_resumed_step_keeps_its_rejected_answers_and_their_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let skill = warehouse_skill(7, 5);
    assert_eq!(skill.settings().run.max_retries, 2, "3 answers per step");
    let good = correct_answers(7, 5);

    // First process: step 1 accepted, step 2 rejected once, then it dies waiting for the model.
    let mut env = warehouse(7, 5);
    let first = Model::new(vec![good[0].clone(), bad_answer()]);
    let options = TaskOptions::new(first.spec(), skillstate_core::ContextStrategy::State);
    let task = start_task(store.as_ref(), &skill, &mut env, &options)
        .await
        .unwrap();
    {
        let mut quiet = NoProgress;
        let mut runner = Runner::new(store.clone(), first.clone(), &mut env, &mut quiet)
            .with_lease_policy(policy());
        let run = runner.run(&task.id);
        tokio::select! {
            result = run => panic!("the run should hang on its model: {result:?}"),
            () = first.stuck.notified() => {}
        }
    }
    let journal = store.journal(&task.id).await.unwrap();
    let at_step_2: Vec<_> = journal.iter().filter(|e| e.step == 2).collect();
    assert_eq!(at_step_2.len(), 1);
    assert_eq!(at_step_2[0].verdict, Verdict::Rejected);
    assert_eq!(store.task(&task.id).await.unwrap().version, 1);
    // The dead runner's lease runs out (this process is alive, so no early takeover).
    tokio::time::sleep(LEASE * 2).await;

    // Second process: two more bad answers exhaust the step's budget of three.
    let mut env = warehouse(7, 5);
    let second = Model::new(vec![bad_answer(), bad_answer(), good[1].clone()]);
    let outcome = Runner::new(store.clone(), second.clone(), &mut env, &mut NoProgress)
        .with_lease_policy(policy())
        .run(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Failed);
    assert_eq!(outcome.steps, 1);
    let prompts = second.prompts.lock().unwrap().clone();
    assert_eq!(
        prompts.len(),
        2,
        "the answer rejected before the crash counts: only 2 of 3 answers were left"
    );
    // The first prompt after the resume carries the errors of the answer rejected before it.
    assert!(
        prompts[0].contains("# Your previous answer was rejected")
            && prompts[0].contains("/inventory/shelf_9"),
        "{}",
        prompts[0]
    );
    let reason = store.task(&task.id).await.unwrap().outcome.unwrap();
    assert_eq!(reason["reason"], "rejected");
    assert_eq!(reason["step"], 2);
    assert!(
        reason["message"]
            .as_str()
            .unwrap()
            .contains("every one of 3 answers was rejected"),
        "{reason}"
    );
    let journal = store.journal(&task.id).await.unwrap();
    let attempts: Vec<(u32, Verdict)> = journal
        .iter()
        .filter(|e| e.step == 2)
        .map(|e| (e.attempt, e.verdict))
        .collect();
    assert_eq!(
        attempts,
        vec![
            (1, Verdict::Rejected),
            (2, Verdict::Rejected),
            (3, Verdict::Rejected)
        ]
    );
    // What the model received is what the journal rebuilds for those attempts.
    let stored = store.task(&task.id).await.unwrap();
    for (attempt, prompt) in [(2, &prompts[0]), (3, &prompts[1])] {
        let (rebuilt, hash) = rebuild_prompt(store.as_ref(), &stored, 2, attempt)
            .await
            .unwrap();
        assert_eq!(&rebuilt.text(), prompt, "attempt {attempt}");
        assert_eq!(
            hash,
            skillstate_core::json::text_hash(prompt),
            "attempt {attempt}"
        );
    }

    // A retry gives the step a fresh budget; the run goes on in memory from there: the next
    // answer is attempt 4 and is accepted, and later steps start again at attempt 1.
    let mut env = warehouse(7, 5);
    let mut rest = vec![good[1].clone()];
    rest.extend(good[2..].iter().cloned());
    let third = Model::new(rest);
    let outcome = Runner::new(store.clone(), third.clone(), &mut env, &mut NoProgress)
        .with_lease_policy(policy())
        .retry(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);
    assert_eq!(outcome.steps, 5);
    let journal = store.journal(&task.id).await.unwrap();
    let accepted: Vec<(u64, u32)> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .map(|e| (e.step, e.attempt))
        .collect();
    assert_eq!(accepted, vec![(1, 1), (2, 4), (3, 1), (4, 1), (5, 1)]);
    assert!(
        third.prompts.lock().unwrap()[0].contains("/inventory/shelf_9"),
        "the retried step still shows the last rejection's errors"
    );
}
