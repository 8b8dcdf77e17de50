//! `Runtime.upgrade` and `Runtime.skills`: a stored task moved to another version of its skill
//! (the runtime's `upgrade_task`, as `skillstate upgrade` calls it) and the skill versions the
//! database keeps.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use serde_json::{Value, json};
use skillstate_core::skill::LoadedSkill;
use skillstate_core::{Skill, SkillDefinition, ToolSpec};
use skillstate_runtime::presented_tools;
use skillstate_runtime::upgrade::{Upgrade, UpgradeError, Upgraded, upgrade_task};
use skillstate_tools::{CallContext, Tool, ToolError, ToolOutput};

use crate::callables::PYTHON_SOURCE;
use crate::convert::to_py;
use crate::errors;
use crate::runtime::{Inner, task_environment, world_with};
use crate::skill::{PySkill, callable_tools};

/// A Python tool the task was given, known by its stored spec alone: what the new version
/// presents of it when the caller gives no tools. An upgrade calls no tool.
struct Declared {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Declared {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Unknown(self.spec.name.clone()))
    }
}

/// The version to move to, as the caller named it.
struct Target {
    definition: SkillDefinition,
    /// The Python tools it offers; `None`: the ones the task was given.
    tools: Option<Vec<Arc<dyn Tool>>>,
}

/// A `Skill`, or the path of a skill directory (str or os.PathLike).
fn target(py: Python<'_>, skill: &Bound<'_, PyAny>) -> PyResult<Target> {
    if let Ok(skill) = skill.cast::<PySkill>() {
        let skill = skill.get();
        let tools: Vec<Arc<dyn Tool>> = callable_tools(py, &skill.tools)
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>)
            .collect();
        return Ok(Target {
            definition: skill.frame.skill().definition.clone(),
            tools: (!tools.is_empty()).then_some(tools),
        });
    }
    let path: PathBuf = skill.extract().map_err(|_| {
        let kind = skill
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        PyTypeError::new_err(format!(
            "skill: expected a skillstate.Skill or the path of a skill directory (str or os.PathLike), got {kind}"
        ))
    })?;
    let loaded = py.detach(|| Skill::load(&path));
    let LoadedSkill { skill, .. } = loaded.map_err(|e| errors::skill_error(py, &e))?;
    Ok(Target {
        definition: skill.definition,
        tools: None,
    })
}

/// `definition` with `tools` added to `[tools] allow` (giving a tool to a task allows it).
fn allowing_all(mut definition: SkillDefinition, tools: &[Arc<dyn Tool>]) -> SkillDefinition {
    for tool in tools {
        let name = &tool.spec().name;
        let allow = &mut definition.settings.tools.allow;
        if !allow.contains(name) {
            allow.push(name.clone());
        }
    }
    definition
}

pub fn upgrade<'py>(
    inner: &Inner,
    py: Python<'py>,
    task_id: &str,
    skill: &Bound<'py, PyAny>,
    apply: bool,
    author: &str,
) -> PyResult<Bound<'py, PyAny>> {
    if author.trim().is_empty() {
        return Err(PyValueError::new_err(
            "author: name who asks for the upgrade (the journal records it), such as \"operator\"",
        ));
    }
    let target = target(py, skill)?;
    let store = inner.store(py)?;
    let task = inner
        .block(py, async { store.task(task_id).await })
        .map_err(|e| errors::store_error(py, &e))?;
    let settings = task_environment(py, &task)?;
    let tools = target.tools.unwrap_or_else(|| {
        task.tools
            .iter()
            .filter(|spec| spec.source == PYTHON_SOURCE)
            .map(|spec| Arc::new(Declared { spec: spec.clone() }) as Arc<dyn Tool>)
            .collect()
    });
    let definition = allowing_all(target.definition, &tools);
    let skill = Skill::from_definition(definition).map_err(|message| {
        errors::raise::<errors::SkillError>(py, "skill", None, Vec::new(), message)
    })?;
    let env = world_with(settings.as_ref(), "", tools).map_err(|message| {
        errors::raise::<errors::TaskError>(
            py,
            "environment",
            None,
            Vec::new(),
            format!(
                "task {}: its environment cannot be rebuilt for the new version: {message}",
                task.id
            ),
        )
    })?;
    let specs = presented_tools(&skill, env.as_ref()).map_err(|e| errors::runtime_error(py, &e))?;
    drop(env);
    let request = Upgrade {
        task: &task.id,
        to: &skill,
        tools: &specs,
        author,
        apply,
    };
    let outcome = inner.block(py, async { upgrade_task(&store, &request).await });
    match outcome {
        Ok(done) => to_py(py, &outcome_json(&done, apply)),
        Err(error) => Err(upgrade_error(py, error)),
    }
}

/// The outcome as `skillstate upgrade --json` reports it, flattened: `moved` (committed),
/// `scheduled` (stored, committed once the waiting action is settled) or `planned` (a dry
/// run, written nowhere; `scheduled` then says whether applying would wait).
fn outcome_json(done: &Upgraded, apply: bool) -> Value {
    let outcome = if done.applied {
        "moved"
    } else if apply && done.scheduled {
        "scheduled"
    } else {
        "planned"
    };
    json!({
        "task": done.task,
        "outcome": outcome,
        "from": done.from,
        "to": done.to,
        "migrations": done.migrations,
        "diff": done.diff,
        "step": done.step,
        "applied": done.applied,
        "scheduled": done.scheduled,
    })
}

fn upgrade_error(py: Python<'_>, error: UpgradeError) -> PyErr {
    let task_error = |kind: &str, message: String| {
        errors::raise::<errors::TaskError>(
            py,
            kind,
            None,
            vec![(kind.to_owned(), String::new(), message.clone())],
            message,
        )
    };
    match error {
        UpgradeError::Store(store) => errors::store_error(py, &store),
        UpgradeError::Refused {
            task,
            to,
            rejections,
        } => errors::upgrade_refused(py, &task, &to, &rejections),
        UpgradeError::Unchanged { task, version } => task_error(
            "unchanged",
            format!("task {task} already runs {version}: there is nothing to upgrade"),
        ),
        UpgradeError::OtherSkill { task, runs, target } => task_error(
            "other_skill",
            format!(
                "task {task} runs skill `{runs}`, not `{target}`: pass a version of `{runs}` (its directory, or a Skill loaded from it)"
            ),
        ),
        UpgradeError::Busy { task, holder } => task_error(
            "busy",
            format!(
                "task {task} is being run by {holder}: a task is upgraded between runs; call upgrade again once that run stops or pauses"
            ),
        ),
        UpgradeError::Pending { task, step, what } => task_error(
            "pending",
            format!(
                "task {task} has an action at step {step} that is {what} (its run stopped during the call): settle it first with Runtime.resume(task_id, model, tools=...), then upgrade"
            ),
        ),
        UpgradeError::Stale { task, actual } => task_error(
            "stale",
            format!(
                "task {task} took a step (it is now at version {actual}) while the upgrade was checked: call upgrade again"
            ),
        ),
    }
}

pub fn skills<'py>(inner: &Inner, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let store = inner.store(py)?;
    let versions = inner
        .block(py, async { store.skill_versions().await })
        .map_err(|e| errors::store_error(py, &e))?;
    versions
        .into_iter()
        .map(|v| {
            to_py(
                py,
                &json!({
                    "name": v.name,
                    "version": v.version,
                    "hash": v.hash,
                    "tasks": v.tasks,
                    "former_tasks": v.former_tasks,
                    "bytes": v.bytes,
                    "created_at": v.created_at,
                }),
            )
        })
        .collect()
}
