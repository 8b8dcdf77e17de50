//! `Skill` (a loaded skill with the tools it is offered) and `Verdict` (what the validation
//! pipeline said of one answer).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use serde_json::Value;
use skillstate_core::skill::{EnvironmentSettings, LoadedSkill};
use skillstate_core::validate::Document;
use skillstate_core::{
    AcceptedStep, ContextStrategy, Rejection, Skill, SkillDefinition, StepRules, validate_step,
};
use skillstate_runtime::{TaskFrame, select_tools};
use skillstate_tools::{Environment, Tool};

use crate::callables::{CallableTool, PyTool};
use crate::convert::{to_json, to_py};
use crate::errors;

/// A skill directory loaded and checked, with the tools a task of it is offered: the tools of
/// its built-in `[environment]` that skill.toml allows, then the Python tools given.
///
/// `validate` and `render` use the runtime's own validation pipeline and prompt renderer, so a
/// verdict or a prompt here is exactly what a run would produce on the same inputs.
#[pyclass(module = "skillstate", name = "Skill", frozen)]
pub struct PySkill {
    pub(crate) frame: Arc<TaskFrame>,
    pub(crate) path: Option<PathBuf>,
    pub(crate) tools: Vec<Py<PyTool>>,
}

/// The skill's definition with the Python tools' names added to `[tools] allow` (giving a
/// tool to a task is allowing it).
pub fn allowing(mut definition: SkillDefinition, tools: &[CallableTool]) -> SkillDefinition {
    for tool in tools {
        let allow = &mut definition.settings.tools.allow;
        if !allow.contains(&tool.spec.name) {
            allow.push(tool.spec.name.clone());
        }
    }
    definition
}

/// The built-in environment a skill's `[environment]` names, if it has one.
pub fn environment_of(
    settings: Option<&EnvironmentSettings>,
) -> Result<Option<Box<dyn Environment>>, String> {
    settings
        .map(|s| skillstate_envs::build_environment(s).map_err(|e| e.to_string()))
        .transpose()
}

pub fn callable_tools(py: Python<'_>, tools: &[Py<PyTool>]) -> Vec<CallableTool> {
    tools
        .iter()
        .map(|t| CallableTool::new(t.bind(py).get()))
        .collect()
}

/// Tools as a list of `Tool`s: accepts a dict `{name: Tool}` (the names must match), a list or
/// tuple of them, or None.
pub fn tool_list(py: Python<'_>, tools: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Py<PyTool>>> {
    let Some(tools) = tools else {
        return Ok(Vec::new());
    };
    if tools.is_none() {
        return Ok(Vec::new());
    }
    let tool_error =
        |message: String| errors::raise::<errors::ToolError>(py, "tool", None, Vec::new(), message);
    let as_tool = |item: &Bound<'_, PyAny>, key: Option<&str>| -> PyResult<Py<PyTool>> {
        let tool = item.cast::<PyTool>().map_err(|_| {
            tool_error(format!(
                "tools{}: {} is not a skillstate.Tool; declare it with skillstate.tool(function, side_effect=...)",
                key.map(|k| format!("[{k:?}]")).unwrap_or_default(),
                item.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        if let Some(key) = key
            && tool.get().spec.name != key
        {
            return Err(tool_error(format!(
                "tools[{key:?}] is the tool `{}`; the key must be the tool's name",
                tool.get().spec.name
            )));
        }
        Ok(tool.clone().unbind())
    };
    let mut list = Vec::new();
    if let Ok(dict) = tools.cast::<PyDict>() {
        for (key, item) in dict.iter() {
            let key: String = key.extract()?;
            list.push(as_tool(&item, Some(&key))?);
        }
    } else {
        for item in tools.try_iter()? {
            list.push(as_tool(&item?, None)?);
        }
    }
    Ok(list)
}

/// The tools a task of `definition` is offered, in the order a runner presents them.
pub fn offered_specs(
    definition: &SkillDefinition,
    env: Option<&dyn Environment>,
    tools: &[CallableTool],
    strict: bool,
) -> Result<Vec<skillstate_core::ToolSpec>, String> {
    let mut available: Vec<Arc<dyn Tool>> = env.map(|e| e.tools()).unwrap_or_default();
    for tool in tools {
        available.push(Arc::new(tool.clone()));
    }
    let selection = &definition.settings.tools;
    let selected = if strict {
        select_tools(&available, selection).map_err(|e| e.to_string())?
    } else {
        available
            .into_iter()
            .filter(|t| selection.allows(&t.spec().name, &t.spec().source))
            .collect()
    };
    Ok(selected.iter().map(|t| t.spec().clone()).collect())
}

impl PySkill {
    pub fn build(
        py: Python<'_>,
        definition: SkillDefinition,
        path: Option<PathBuf>,
        tools: Vec<Py<PyTool>>,
    ) -> PyResult<Self> {
        let callables = callable_tools(py, &tools);
        let definition = allowing(definition, &callables);
        let task_error = |message: String| {
            errors::raise::<errors::TaskError>(py, "environment", None, Vec::new(), message)
        };
        let env = environment_of(definition.settings.environment.as_ref()).map_err(task_error)?;
        let specs =
            offered_specs(&definition, env.as_deref(), &callables, false).map_err(task_error)?;
        let skill = Skill::from_definition(definition).map_err(|message| {
            errors::raise::<errors::SkillError>(py, "skill", None, Vec::new(), message)
        })?;
        let frame = TaskFrame::for_skill(skill, specs, ContextStrategy::State, None)
            .map_err(|e| errors::runtime_error(py, &e))?;
        Ok(Self {
            frame: Arc::new(frame),
            path,
            tools,
        })
    }
}

/// A state argument: a dict, or a JSON text.
fn state_arg(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(text) = value.cast::<PyString>() {
        return serde_json::from_str(&text.to_cow()?)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("state: not JSON: {e}")));
    }
    to_json(value, "state")
}

#[pymethods]
impl PySkill {
    /// Skill.load(path, tools=None) -> Skill
    ///
    /// Loads and checks the skill directory at `path` (SKILL.md, state.schema.json,
    /// state.init.json, skill.toml). Raises SkillError listing every problem with its file and
    /// line or JSON pointer (the problems `skillstate validate` prints). `tools` are Python
    /// tools (skillstate.tool) the skill is offered besides those of its built-in environment.
    #[staticmethod]
    #[pyo3(signature = (path, tools = None))]
    fn load(py: Python<'_>, path: PathBuf, tools: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let tools = tool_list(py, tools)?;
        let loaded = py.detach(|| Skill::load(&path));
        let LoadedSkill { skill, .. } = loaded.map_err(|e| errors::skill_error(py, &e))?;
        Self::build(py, skill.definition, Some(path), tools)
    }

    /// The same skill offered these Python tools instead of the ones it was loaded with.
    fn with_tools(&self, py: Python<'_>, tools: &Bound<'_, PyAny>) -> PyResult<Self> {
        let tools = tool_list(py, Some(tools))?;
        let mut definition = self.frame.skill().definition.clone();
        // The allow list as loaded: drop the names the earlier tools added.
        let earlier: Vec<String> = self
            .tools
            .iter()
            .map(|t| t.bind(py).get().spec.name.clone())
            .collect();
        definition
            .settings
            .tools
            .allow
            .retain(|a| !earlier.contains(a));
        Self::build(py, definition, self.path.clone(), tools)
    }

    /// validate(state, answer) -> Verdict
    ///
    /// Runs the runtime's validation pipeline on one model answer `answer` (text: a JSON object
    /// `{"reasoning", "state_patch", "action"}`, or prose followed by a ```json block) against
    /// `state` (a dict or JSON text): parse → patch shape → apply to a copy → read-only fields
    /// → schema → state budget → action and its arguments. `state` is not modified. The
    /// verdict's `.errors` are `(kind, pointer, message)`, the same as a run journals.
    fn validate(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        answer: &str,
    ) -> PyResult<PyVerdict> {
        let state = state_arg(state)?;
        let frame = &self.frame;
        let verdict = py.detach(|| {
            let rules = StepRules {
                schema: &frame.skill().schema,
                catalog: frame.catalog(),
                state_token_budget: frame.skill().settings().budgets.state_tokens,
            };
            validate_step(&rules, &state, answer)
        });
        Ok(match verdict {
            Ok(accepted) => PyVerdict {
                accepted: Some(accepted),
                rejections: Vec::new(),
            },
            Err(rejected) => PyVerdict {
                accepted: None,
                rejections: rejected.rejections,
            },
        })
    }

    /// render(state, observation, rejected=None) -> str
    ///
    /// The exact prompt a runner sends at a step of a task of this skill (context strategy
    /// `state`) whose state is `state` and whose observation is `observation`: the same
    /// function renders it. With `rejected` (a rejected Verdict), the prompt of the retry
    /// that feeds its errors back.
    #[pyo3(signature = (state, observation, rejected = None))]
    fn render(
        &self,
        state: &Bound<'_, PyAny>,
        observation: &str,
        rejected: Option<&Bound<'_, PyVerdict>>,
    ) -> PyResult<String> {
        let state = state_arg(state)?;
        let retry: &[Rejection] = match rejected {
            Some(v) => &v.get().rejections,
            None => &[],
        };
        Ok(self.frame.prompt(&state, observation, retry, &[]).text())
    }

    /// The prompt of `render` as its two parts: (prefix, body). The prefix (procedure and
    /// tools) is the same at every step, so providers can cache it.
    #[pyo3(signature = (state, observation, rejected = None))]
    fn render_parts(
        &self,
        state: &Bound<'_, PyAny>,
        observation: &str,
        rejected: Option<&Bound<'_, PyVerdict>>,
    ) -> PyResult<(String, String)> {
        let state = state_arg(state)?;
        let retry: &[Rejection] = match rejected {
            Some(v) => &v.get().rejections,
            None => &[],
        };
        let prompt = self.frame.prompt(&state, observation, retry, &[]);
        Ok((prompt.prefix, prompt.body))
    }

    /// The skill's name (SKILL.md frontmatter).
    #[getter]
    fn name(&self) -> &str {
        &self.frame.skill().definition.name
    }

    /// skill.toml's `version` (semantic: it orders the skill's migrations), or None.
    #[getter]
    fn version(&self) -> Option<String> {
        self.frame
            .skill()
            .settings()
            .version
            .as_ref()
            .map(ToString::to_string)
    }

    #[getter]
    fn description(&self) -> &str {
        &self.frame.skill().definition.description
    }

    /// The procedure: SKILL.md's Markdown body.
    #[getter]
    fn procedure(&self) -> &str {
        &self.frame.skill().definition.procedure
    }

    /// The kind of the skill's built-in environment (`[environment] kind`), or None when a
    /// task's request opens it.
    #[getter]
    fn environment(&self) -> Option<String> {
        self.frame
            .skill()
            .settings()
            .environment
            .as_ref()
            .map(|e| e.kind.clone())
    }

    /// The directory it was loaded from.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.path.clone()
    }

    /// The state schema (JSON Schema 2020-12), as a dict.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.frame.skill().definition.schema)
    }

    /// The initial state (state.init.json), as a new dict.
    #[getter]
    fn initial_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.frame.skill().definition.initial_state)
    }

    /// The JSON Schema of a whole answer (derived from the state schema and the tools).
    #[getter]
    fn output_schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, self.frame.output_schema())
    }

    /// The tools offered, control actions (finish, ask_user) last: name, description,
    /// input_schema, side_effect, source.
    #[getter]
    fn tools<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let specs = serde_json::to_value(self.frame.catalog().specs())
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        to_py(py, &specs)
    }

    /// The Python tools it was given.
    #[getter]
    fn python_tools(&self, py: Python<'_>) -> Vec<Py<PyTool>> {
        self.tools.iter().map(|t| t.clone_ref(py)).collect()
    }

    fn __repr__(&self) -> String {
        format!("Skill(name={:?})", self.frame.skill().definition.name)
    }
}

/// What the validation pipeline said of one answer. True when accepted.
///
/// Accepted: `.new_state`, `.patch` (a merge patch dict, or a JSON Patch list), `.action`
/// (`{"tool", "args"}`), `.reasoning`, `.state_hash`. Rejected: `.errors`, a list of
/// `(kind, pointer, message)` in pipeline order (kinds: parse, patch_shape, patch_apply,
/// read_only, schema, state_budget, unknown_tool, tool_args); `.rejections` adds which document
/// each pointer points into ("output": the answer, "state": the state after the patch).
#[pyclass(module = "skillstate", name = "Verdict", frozen)]
pub struct PyVerdict {
    pub(crate) accepted: Option<AcceptedStep>,
    pub(crate) rejections: Vec<Rejection>,
}

#[pymethods]
impl PyVerdict {
    #[getter]
    fn accepted(&self) -> bool {
        self.accepted.is_some()
    }

    fn __bool__(&self) -> bool {
        self.accepted.is_some()
    }

    #[getter]
    fn new_state<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.accepted
            .as_ref()
            .map(|a| to_py(py, &a.new_state))
            .transpose()
    }

    #[getter]
    fn patch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.accepted
            .as_ref()
            .map(|a| to_py(py, &a.patch.to_value()))
            .transpose()
    }

    #[getter]
    fn action<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.accepted
            .as_ref()
            .map(|a| to_py(py, &a.action.to_call_json()))
            .transpose()
    }

    #[getter]
    fn reasoning(&self) -> Option<&str> {
        self.accepted.as_ref().map(|a| a.reasoning.as_str())
    }

    /// SHA-256 of the new state's canonical JSON, as the journal records it.
    #[getter]
    fn state_hash(&self) -> Option<&str> {
        self.accepted.as_ref().map(|a| a.state_hash.as_str())
    }

    #[getter]
    fn errors<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.rejections
            .iter()
            .map(|r| {
                PyTuple::new(
                    py,
                    [r.kind.as_str(), r.pointer.as_str(), r.message.as_str()],
                )
            })
            .collect()
    }

    #[getter]
    fn rejections<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.rejections
            .iter()
            .map(|r| {
                let dict = PyDict::new(py);
                dict.set_item("kind", r.kind.as_str())?;
                dict.set_item(
                    "document",
                    match r.document {
                        Document::Output => "output",
                        Document::State => "state",
                    },
                )?;
                dict.set_item("pointer", &r.pointer)?;
                dict.set_item("message", &r.message)?;
                Ok(dict)
            })
            .collect()
    }

    /// Raises ValidationError (with `.kind`, `.pointer`, `.errors`) when rejected.
    fn raise_for_errors(&self, py: Python<'_>) -> PyResult<()> {
        if self.accepted.is_some() {
            return Ok(());
        }
        Err(errors::rejections_error(
            py,
            "the answer was rejected",
            &self.rejections,
        ))
    }

    fn __repr__(&self) -> String {
        match &self.accepted {
            Some(a) => format!("Verdict(accepted, action={})", a.action.summary()),
            None => {
                let lines: Vec<String> = self.rejections.iter().map(ToString::to_string).collect();
                format!("Verdict(rejected: {})", lines.join("; "))
            }
        }
    }
}
