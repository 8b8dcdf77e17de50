//! New tasks through the group-commit writer: one task (`create_task`), one owned by a tenant
//! (`create_owned_task`, idempotent per key) or a whole batch's (`enqueue_tasks`, all or
//! nothing, its statements prepared once and stepped per task). Each task's `created` event is
//! written with it.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use skillstate_core::json::state_hash;

use super::ops::OpResult;
use crate::StoreError;
use crate::model::NewTask;
use crate::rows::spec_hash;
use crate::rows::to_json;
use crate::service::TaskOwner;

/// The `created` event of the task `?2`, written at `?1` (also by `fork_task`).
pub(super) const CREATED_EVENT: &str = "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
     SELECT id, tenant, 'created', version, json_object('skill', skill_name, 'model', model), ?1 FROM tasks WHERE id = ?2";

/// A task at version 0, serialised: its row, the snapshot of step 0 and the observation step 1
/// starts from.
pub(super) struct TaskRow {
    pub(super) id: String,
    skill_name: String,
    skill: String,
    tools: String,
    /// The skill version's hash (`rows::spec_hash`) and its skill.toml `version`.
    spec_hash: String,
    skill_version: Option<String>,
    context: &'static str,
    context_budget: Option<i64>,
    model: String,
    environment: Option<String>,
    env_checkpoint: Option<String>,
    state: String,
    state_hash: String,
    opening_observation: String,
    labels: Option<String>,
    tenant: Option<String>,
    idempotency_key: Option<String>,
    trace_context: Option<String>,
}

impl TaskRow {
    pub(super) fn new(task: &NewTask, initial_state: &Value, labels: Option<&Value>) -> Self {
        let skill = to_json(&task.skill);
        let tools = to_json(&task.tools);
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            skill_name: task.skill.name.clone(),
            spec_hash: spec_hash(&skill, &tools),
            skill_version: task
                .skill
                .settings
                .version
                .as_ref()
                .map(ToString::to_string),
            skill,
            tools,
            context: task.context.as_str(),
            context_budget: task.context_budget.map(|b| b as i64),
            model: task.model.clone(),
            environment: task.environment.as_ref().map(to_json),
            env_checkpoint: task.env_checkpoint.as_ref().map(to_json),
            state: to_json(initial_state),
            state_hash: state_hash(initial_state),
            opening_observation: task.opening_observation.clone(),
            labels: labels.map(to_json),
            tenant: None,
            idempotency_key: None,
            trace_context: None,
        }
    }

    /// The task owned by `tenant` (`None`: by no tenant).
    pub(super) fn of_tenant(self, tenant: Option<String>) -> Self {
        Self { tenant, ..self }
    }

    /// A task owned by `owner.tenant`, with its labels and idempotency key.
    pub(super) fn owned(task: &NewTask, initial_state: &Value, owner: &TaskOwner) -> Self {
        Self {
            tenant: Some(owner.tenant.clone()),
            idempotency_key: owner.idempotency_key.clone(),
            trace_context: owner.trace_context.clone(),
            ..Self::new(task, initial_state, Some(&owner.labels))
        }
    }
}

/// New tasks, queued in `batch` when given, attached to `board` when given; created at `now`.
pub(super) struct NewTasks {
    pub(super) rows: Vec<TaskRow>,
    pub(super) batch: Option<String>,
    pub(super) board: Option<String>,
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
        if let Some(board) = &self.board {
            let found: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM boards WHERE id = ?")?
                .query_row([board], |row| row.get(0))
                .optional()?;
            if found.is_none() {
                return Err(StoreError::NoSuchBoard(board.clone()).into());
            }
        }
        insert_tasks(conn, &self.rows, self.batch.as_deref(), self.now)?;
        if let Some(board) = &self.board {
            let mut member = conn.prepare_cached(
                "INSERT INTO board_members (task_id, board_id, attached_at) VALUES (?, ?, ?)",
            )?;
            for row in &self.rows {
                member.execute(params![row.id, board, self.now])?;
            }
        }
        Ok(())
    }
}

/// Writes `rows` (queued in `batch` when given) with their skill versions (each stored once:
/// `skill_versions`, `task_versions`), snapshots, opening observations and `created` events.
pub(super) fn insert_tasks(
    conn: &Connection,
    rows: &[TaskRow],
    batch: Option<&str>,
    now: i64,
) -> OpResult<()> {
    let mut task = conn.prepare_cached(
            "INSERT INTO tasks (id, skill_name, context, context_budget, model, environment, env_checkpoint, status, state, version, created_at, updated_at, batch_id, queue, labels, tenant, idempotency_key, spec_hash, trace_context) \
             VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )?;
    let mut version = conn.prepare_cached(super::INSERT_VERSION)?;
    let mut runs = conn.prepare_cached(
        "INSERT INTO task_versions (task_id, from_step, spec_hash) VALUES (?, 0, ?)",
    )?;
    // The version of the row before, stored by this call: a batch's tasks share one.
    let mut stored: Option<&str> = None;
    let mut snapshot = conn.prepare_cached(
        "INSERT INTO snapshots (task_id, step, state, state_hash) VALUES (?, 0, ?, ?)",
    )?;
    let mut observation =
        conn.prepare_cached("INSERT INTO observations (task_id, step, text) VALUES (?, 1, ?)")?;
    let mut created = conn.prepare_cached(CREATED_EVENT)?;
    let queue = batch.map(|_| "queued");
    for row in rows {
        if stored != Some(row.spec_hash.as_str()) {
            version.execute(params![
                row.spec_hash,
                row.skill_name,
                row.skill_version,
                row.skill,
                row.tools,
                now
            ])?;
            stored = Some(&row.spec_hash);
        }
        task.execute(params![
            row.id,
            row.skill_name,
            row.context,
            row.context_budget,
            row.model,
            row.environment,
            row.env_checkpoint,
            row.state,
            now,
            now,
            batch,
            queue,
            row.labels,
            row.tenant,
            row.idempotency_key,
            row.spec_hash,
            row.trace_context,
        ])?;
        runs.execute(params![row.id, row.spec_hash])?;
        snapshot.execute(params![row.id, row.state, row.state_hash])?;
        observation.execute(params![row.id, row.opening_observation])?;
        created.execute(params![now, row.id])?;
    }
    Ok(())
}

/// A task owned by a tenant; when the tenant already used its idempotency key, nothing is
/// written and the earlier task's id is the answer.
pub(super) struct OwnedTask {
    pub(super) row: TaskRow,
    /// The batch it is queued in, when created as part of one.
    pub(super) batch: Option<String>,
    pub(super) now: i64,
}

impl OwnedTask {
    /// The task's id, and whether it was created now.
    pub(super) fn run(&self, conn: &Connection) -> OpResult<(String, bool)> {
        // The writer holds the database's write lock: no other create with this key can come
        // between the look-up and the insert (the unique index would refuse it anyway).
        if let (Some(tenant), Some(key)) = (&self.row.tenant, &self.row.idempotency_key) {
            let earlier: Option<String> = conn
                .prepare_cached("SELECT id FROM tasks WHERE tenant = ? AND idempotency_key = ?")?
                .query_row([tenant, key], |row| row.get(0))
                .optional()?;
            if let Some(id) = earlier {
                return Ok((id, false));
            }
        }
        insert_tasks(
            conn,
            std::slice::from_ref(&self.row),
            self.batch.as_deref(),
            self.now,
        )?;
        Ok((self.row.id.clone(), true))
    }
}
