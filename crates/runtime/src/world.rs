//! The environment's world across restarts. A world that cannot be replayed is checkpointed
//! with every action result. A replayable one (a simulation: `Environment::replayable`) is
//! checkpointed every [`CHECKPOINT_EVERY`] results: in between, the actions the journal
//! records are its changes, and resuming restores the last checkpoint and runs them again in
//! it, as state snapshots and patches already work. A checkpoint of a whole world at every
//! step is what grew a long task's step time (the warehouse archive's stock of ~1,000 items).
//!
//! Only actions that ran lie between two checkpoints: a result whose tool did not run in the
//! world (refused by a human, answered by one, of unknown outcome) is checkpointed with it,
//! and so is the world when a step stops or pauses the task, so a stopped task's stored world
//! is its last. Every resume goes through [`Runner::restore_world`], the only way the runner
//! restores a world.

use std::sync::Arc;

use serde_json::Value;
use skillstate_store::TaskRecord;
use skillstate_tools::{CallContext, Environment, Tool, find_tool};

use crate::RuntimeError;
use crate::step_loop::Runner;

/// Results between two checkpoints of a replayable world: at most this many actions run again
/// when a task resumes.
pub(crate) const CHECKPOINT_EVERY: u64 = 32;

/// What a recorded result did in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorldChange {
    /// The action's tool was called (when the world has one by that name, as replay does),
    /// then the world moved on.
    Ran,
    /// The tool was not called — refused, answered by a human, of unknown outcome — and the
    /// world moved on: replay could not tell, so the world is checkpointed with the result.
    NotRun,
}

/// Where the stored checkpoint of the runner's task stands.
#[derive(Debug, Default)]
pub(crate) struct WorldClock {
    /// The step whose result the stored checkpoint includes; `None` when unknown, which
    /// checkpoints the world with the next result.
    stored_at: Option<u64>,
}

impl Runner<'_> {
    /// Puts the world as `task` left it into this runner's environment: its stored checkpoint,
    /// then the actions recorded after it run again in order. Without a checkpoint the world
    /// is the one the runner was given.
    pub(crate) async fn restore_world(&mut self, task: &TaskRecord) -> Result<(), RuntimeError> {
        self.world = WorldClock::default();
        let Some(checkpoint) = &task.env_checkpoint else {
            return Ok(());
        };
        self.env.restore(checkpoint)?;
        let Some(at) = task.env_checkpoint_step.filter(|at| *at < task.version) else {
            self.world.stored_at = task.env_checkpoint_step;
            return Ok(());
        };
        if self.env.replayable() {
            let tools = self.env.tools();
            for intent in self.store.intents(&task.id).await? {
                if intent.done && intent.step > at && intent.step <= task.version {
                    replay_action(
                        self.env,
                        &tools,
                        &task.id,
                        intent.step,
                        &intent.tool,
                        &intent.args,
                    )
                    .await;
                }
            }
        }
        // A world that cannot replay keeps the older checkpoint it was given; the next result
        // checkpoints it.
        self.world.stored_at = self.env.replayable().then_some(at);
        Ok(())
    }

    /// The checkpoint to store with the result of `step`, if one is due.
    pub(crate) fn checkpoint_with_result(
        &mut self,
        step: u64,
        change: WorldChange,
    ) -> Option<Value> {
        let due = match (change, self.world.stored_at) {
            (WorldChange::Ran, Some(at)) if self.env.replayable() && !self.env.episode_over() => {
                step.saturating_sub(at) >= CHECKPOINT_EVERY
            }
            _ => true,
        };
        due.then(|| {
            self.world.stored_at = Some(step);
            self.env.checkpoint()
        })
    }

    /// The checkpoint to store with a step that stops or pauses the task (committed on
    /// `version`, the last step with a result), unless the stored one is already as new.
    pub(crate) fn checkpoint_at_stop(&mut self, version: u64) -> Option<Value> {
        (self.world.stored_at != Some(version)).then(|| {
            self.world.stored_at = Some(version);
            self.env.checkpoint()
        })
    }
}

/// Runs one recorded action again in a replayable world: the tool, when the world has one by
/// that name (a `recall` reads the journal, not the world), then the world moves on — as the
/// runner did when the action first ran. The result was recorded then; it is not needed now.
pub(crate) async fn replay_action(
    env: &mut dyn Environment,
    tools: &[Arc<dyn Tool>],
    task: &str,
    step: u64,
    name: &str,
    args: &Value,
) {
    if let Some(tool) = find_tool(tools, name) {
        // Simulated worlds only: the call re-runs inside this instance, nowhere else.
        let _ = tool.call(args, &CallContext::new(task, step)).await;
    }
    env.after_action();
}
