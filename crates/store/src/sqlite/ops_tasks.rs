//! New tasks through the group-commit writer: one task (`create_task`) or a whole batch's
//! (`enqueue_tasks`, all or nothing, its statements prepared once and stepped per task).

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use skillstate_core::json::state_hash;

use super::ops::OpResult;
use crate::StoreError;
use crate::model::NewTask;
use crate::rows::to_json;

/// A task at version 0, serialised: its row, the snapshot of step 0 and the observation step 1
/// starts from.
pub(super) struct TaskRow {
    pub(super) id: String,
    skill_name: String,
    skill: String,
    tools: String,
    context: &'static str,
    context_budget: Option<i64>,
    model: String,
    environment: Option<String>,
    env_checkpoint: Option<String>,
    state: String,
    state_hash: String,
    opening_observation: String,
    labels: Option<String>,
}

impl TaskRow {
    pub(super) fn new(task: &NewTask, initial_state: &Value, labels: Option<&Value>) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            skill_name: task.skill.name.clone(),
            skill: to_json(&task.skill),
            tools: to_json(&task.tools),
            context: task.context.as_str(),
            context_budget: task.context_budget.map(|b| b as i64),
            model: task.model.clone(),
            environment: task.environment.as_ref().map(to_json),
            env_checkpoint: task.env_checkpoint.as_ref().map(to_json),
            state: to_json(initial_state),
            state_hash: state_hash(initial_state),
            opening_observation: task.opening_observation.clone(),
            labels: labels.map(to_json),
        }
    }
}

/// New tasks, queued in `batch` when given; created at `now`.
pub(super) struct NewTasks {
    pub(super) rows: Vec<TaskRow>,
    pub(super) batch: Option<String>,
    pub(super) now: i64,
}

impl NewTasks {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        if let Some(batch) = &self.batch {
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM batches WHERE id = ?")?
                .query_row([batch], |row| row.get(0))
                .optional()?;
            if found.is_none() {
                return Err(StoreError::NoSuchBatch(batch.clone()).into());
            }
        }
        let mut task = conn.prepare_cached(
            "INSERT INTO tasks (id, skill_name, skill, tools, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at, batch_id, queue, labels) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, 0, ?, ?, ?, ?, ?)",
        )?;
        let mut snapshot = conn.prepare_cached(
            "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, 0, ?, ?)",
        )?;
        let mut observation =
            conn.prepare_cached("INSERT INTO observations (task_id, step, text) VALUES (?, 1, ?)")?;
        let queue = self.batch.as_ref().map(|_| "queued");
        for row in &self.rows {
            task.execute(params![
                row.id,
                row.skill_name,
                row.skill,
                row.tools,
                row.context,
                row.context_budget,
                row.model,
                row.environment,
                row.env_checkpoint,
                row.state,
                self.now,
                self.now,
                self.batch,
                queue,
                row.labels,
            ])?;
            snapshot.execute(params![row.id, row.state, row.state_hash])?;
            observation.execute(params![row.id, row.opening_observation])?;
        }
        Ok(())
    }
}
