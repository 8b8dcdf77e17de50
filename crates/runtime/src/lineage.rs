//! Forks and journal verification: a task's history as data.

use skillstate_core::json::state_hash;
use skillstate_core::{Action, StatePatch};
use skillstate_store::{Store, StoreError, TaskRecord, Verdict, state_at};
use skillstate_tools::{Environment, find_tool};

use crate::RuntimeError;

/// A new task whose state is `task`'s state after `step`; the original is untouched. When
/// `env` is a fresh instance of the task's environment and that environment is replayable,
/// the world is rebuilt as it was after `step` by replaying the recorded actions in it;
/// otherwise the fork continues in whatever world it is resumed with.
pub async fn fork_task(
    store: &dyn Store,
    task_id: &str,
    step: u64,
    env: Option<&mut dyn Environment>,
) -> Result<TaskRecord, RuntimeError> {
    let task = store.task(task_id).await?;
    let state = state_at(store, &task.id, step, task.version).await?;
    let checkpoint = match env {
        Some(env) if env.replayable() => Some(replay_world(store, &task, step, env).await?),
        _ => None,
    };
    Ok(store
        .fork_task(&task.id, step, &state, checkpoint.as_ref())
        .await?)
}

/// Runs the recorded actions of steps 1..=`step` in a fresh, replayable environment.
async fn replay_world(
    store: &dyn Store,
    task: &TaskRecord,
    step: u64,
    env: &mut dyn Environment,
) -> Result<serde_json::Value, RuntimeError> {
    env.opening_observation();
    let tools = env.tools();
    for entry in store.journal(&task.id).await? {
        if entry.verdict != Verdict::Accepted || entry.step > step {
            continue;
        }
        let Some(Action::Tool { name, args }) =
            entry.action.as_ref().and_then(Action::from_call_json)
        else {
            continue;
        };
        if name == skillstate_core::recall::RECALL_TOOL {
            // Reads the journal, changes nothing in the world; the world saw it happen.
            env.after_action();
            continue;
        }
        if find_tool(&tools, &name).is_none() {
            return Err(RuntimeError::MissingTool {
                task: task.id.clone(),
                tool: name.clone(),
            });
        }
        crate::world::replay_action(env, &tools, &task.id, entry.step, &name, &args).await;
    }
    Ok(env.checkpoint())
}

/// What `replay` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalCheck {
    /// The step the check started from (0, or the snapshot left by gc).
    pub from_step: u64,
    pub steps_checked: u64,
    /// The first inconsistency, if any.
    pub mismatch: Option<(u64, String)>,
}

/// Re-derives every state from the oldest snapshot and the journal's patches, checking each
/// recorded state hash and finally the stored current state.
pub async fn verify_journal(
    store: &dyn Store,
    task: &TaskRecord,
) -> Result<JournalCheck, RuntimeError> {
    let patches = store.accepted_patches(&task.id, 0, task.version).await?;
    let first = patches
        .first()
        .map(|(step, _, _)| *step)
        .unwrap_or(task.version + 1);
    let Some((from_step, mut state)) = store
        .snapshot_before(&task.id, first.saturating_sub(1))
        .await?
    else {
        return Err(StoreError::Compacted {
            task: task.id.clone(),
            step: first,
        }
        .into());
    };
    let mut check = JournalCheck {
        from_step,
        steps_checked: 0,
        mismatch: None,
    };
    let mut expected = from_step + 1;
    for (step, patch, recorded) in patches.into_iter().filter(|(step, _, _)| *step > from_step) {
        if step != expected {
            check.mismatch = Some((expected, "no accepted journal entry for this step".into()));
            return Ok(check);
        }
        let applied = StatePatch::from_value(&patch)
            .map_err(|p| p.message)
            .and_then(|p| {
                p.apply(&state).map_err(|p| {
                    format!(
                        "{} at {}",
                        p.message,
                        skillstate_core::json::pointer_for_humans(&p.pointer, "state")
                    )
                })
            });
        match applied {
            Ok(next) => state = next,
            Err(message) => {
                check.mismatch = Some((
                    step,
                    format!("the recorded patch does not apply: {message}"),
                ));
                return Ok(check);
            }
        }
        let actual = state_hash(&state);
        if actual != recorded {
            check.mismatch = Some((
                step,
                format!("rebuilt state hash {actual} differs from the recorded {recorded}"),
            ));
            return Ok(check);
        }
        check.steps_checked += 1;
        expected += 1;
    }
    if expected != task.version + 1 {
        check.mismatch = Some((expected, "no accepted journal entry for this step".into()));
    } else if state_hash(&state) != state_hash(&task.state) {
        check.mismatch = Some((
            task.version,
            "the stored current state differs from the state the journal rebuilds".into(),
        ));
    }
    Ok(check)
}
