//! A replayable world (the warehouse simulation) is checkpointed every few results, not at
//! every one; a task stopped between two checkpoints and resumed by a new runner with a fresh
//! environment goes on in exactly the world an uninterrupted run has: the same observations at
//! every step, the same outcome, the same final world. A human's answer — a result whose tool
//! never ran — lies on a checkpoint. Real SQLite files.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use skillstate_core::ContextStrategy;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::{Store, TaskRecord, TaskStatus};

const SEED: u64 = 11;
const EVENTS: u32 = 90;
/// The step whose answer asks the user instead (its event is then passed by).
const ASKS_AT: usize = 10;

fn answers() -> Vec<String> {
    let mut answers = correct_answers(SEED, EVENTS);
    answers[ASKS_AT - 1] = json!({"reasoning": "r", "state_patch": {}, "action": {"tool": "ask_user", "args": {"question": "Go on?"}}}).to_string();
    answers
}

/// Runs a warehouse task with the first `available` answers (the model fails after them, or
/// pauses at `ASKS_AT`), answering the pause and retrying after a failure with a new runner, a
/// new model and a fresh environment each time, as a restarted process would. Returns the
/// task, its observations, and the checkpoint step and version seen at each interruption.
async fn run_in_parts(cuts: &[usize]) -> (TaskRecord, Vec<(u64, String)>, Vec<(Option<u64>, u64)>) {
    let tmp = tempfile::tempdir().unwrap();
    let (store, _) = sqlite_store(tmp.path()).await;
    let store: Arc<dyn Store> = store;
    let skill = warehouse_skill(SEED, EVENTS);
    let all = answers();
    let model_with = |n: usize| scripted(all.iter().take(n).cloned().collect());
    let first = cuts.first().copied().unwrap_or(all.len());
    let mut env = warehouse(SEED, EVENTS);
    let model = model_with(first);
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    let mut outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut cut = 0;
    for _round in 0..cuts.len() + 3 {
        let stored = store.task(&task.id).await.unwrap();
        if outcome.status == TaskStatus::Failed {
            seen.push((stored.env_checkpoint_step, stored.version));
            cut += 1;
        }
        let available = cuts.get(cut).copied().unwrap_or(all.len());
        let mut env = warehouse(SEED, EVENTS);
        let mut progress = NoProgress;
        let mut runner = Runner::new(
            store.clone(),
            model_with(available),
            &mut env,
            &mut progress,
        );
        outcome = match outcome.status {
            TaskStatus::Completed => return finished(store.as_ref(), &task.id, seen).await,
            TaskStatus::AwaitingInput => runner.reply(&task.id, "yes").await.unwrap(),
            TaskStatus::Failed => runner.retry(&task.id).await.unwrap(),
            other => panic!("unexpected status {other:?}"),
        };
    }
    panic!("the task did not complete: {seen:?}");
}

async fn finished(
    store: &dyn Store,
    task: &str,
    seen: Vec<(Option<u64>, u64)>,
) -> (TaskRecord, Vec<(u64, String)>, Vec<(Option<u64>, u64)>) {
    let observations = store.observations(task).await.unwrap();
    (store.task(task).await.unwrap(), observations, seen)
}

#[tokio::test]
async fn a_resumed_world_is_the_world_of_an_uninterrupted_run() {
    let (whole, whole_observations, _) = run_in_parts(&[]).await;
    assert_eq!(whole.status, TaskStatus::Completed);
    assert_eq!(whole.outcome.as_ref().unwrap()["reason"], "episode_over");
    assert_eq!(whole_observations.len(), EVENTS as usize + 1);

    // Stopped between checkpoints (and once right after the human's answer), then resumed.
    let (parts, observations, seen) = run_in_parts(&[7, 12, 33, 61, 62]).await;
    assert_eq!(parts.status, TaskStatus::Completed);
    assert_eq!(observations, whole_observations);
    assert_eq!(parts.state, whole.state);
    assert_eq!(parts.outcome, whole.outcome);
    // The stored world is the last one once the task has stopped.
    assert_eq!(parts.env_checkpoint, whole.env_checkpoint);
    let done = warehouse(SEED, EVENTS);
    assert_ne!(
        parts.env_checkpoint.as_ref(),
        Some(&skillstate_tools::Environment::checkpoint(&done))
    );

    // Each stop left a checkpoint older than the task, and the resume replayed the rest.
    assert_eq!(seen.len(), 5, "{seen:?}");
    for (at, version) in &seen {
        let at = at.expect("a checkpoint step is recorded");
        assert!(at < *version, "checkpoint at {at}, version {version}");
    }
    // The answer to the question lies on a checkpoint: stopped two steps later, only the two
    // actions after it run again.
    assert_eq!(seen[1], (Some(ASKS_AT as u64), 12));
}
