//! Python callables as the runtime's tools and model. The runtime awaits them on tokio's
//! blocking pool; each call attaches to the interpreter only for the call itself, so the
//! interpreter is free while the runtime waits on the database or another call.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde_json::{Value, json};
use skillstate_core::{SideEffect, ToolSpec};
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_tools::{CallContext, Tool, ToolError, ToolOutput};

use crate::convert::{to_json, to_py};
use crate::errors;

/// The tool source of Python callables, as `skillstate tools` and the journal show it.
pub const PYTHON_SOURCE: &str = "python";

/// A Python callable declared as a tool: its name, description, parameters (a JSON Schema of
/// the arguments object) and side-effect class. Build one with `skillstate.tool(...)`.
#[pyclass(module = "skillstate", name = "Tool", frozen)]
pub struct PyTool {
    pub(crate) spec: ToolSpec,
    pub(crate) function: Arc<Py<PyAny>>,
    pub(crate) pass_context: bool,
}

pub fn parse_side_effect(text: &str) -> Option<SideEffect> {
    match text {
        "read_only" => Some(SideEffect::ReadOnly),
        "idempotent" => Some(SideEffect::Idempotent),
        "effectful" => Some(SideEffect::Effectful),
        _ => None,
    }
}

#[pymethods]
impl PyTool {
    /// Tool(function, name, description, parameters, side_effect="effectful", pass_context=False, needs_approval=False)
    ///
    /// `parameters` is the JSON Schema of the arguments object; the model's arguments are
    /// validated against it before the call, and `function` is called with them as keyword
    /// arguments. `side_effect` decides what happens when a process dies during the call:
    /// "read_only" and "idempotent" calls are run again on resume, an "effectful" one is not
    /// (its outcome becomes unknown, as for built-in tools). With `pass_context=True` the
    /// function also gets `context={"task_id", "step", "idempotency_key"}`. With
    /// `needs_approval=True` every call waits for a human: the task pauses
    /// (`awaiting_approval`) until `Runtime.approve` runs the call once or `Runtime.reject`
    /// refuses it, as skillstate.toml's `require_approval` does for built-in tools.
    #[new]
    #[pyo3(signature = (function, name, description, parameters, side_effect = "effectful", pass_context = false, needs_approval = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        function: Py<PyAny>,
        name: &str,
        description: &str,
        parameters: &Bound<'_, PyAny>,
        side_effect: &str,
        pass_context: bool,
        needs_approval: bool,
    ) -> PyResult<Self> {
        let tool_error = |message: String| {
            errors::raise::<errors::ToolError>(py, "tool", None, Vec::new(), message)
        };
        if !function.bind(py).is_callable() {
            return Err(tool_error(format!(
                "tool `{name}`: the function is not callable"
            )));
        }
        let valid_name = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid_name {
            return Err(tool_error(format!(
                "tool name `{name}`: use 1 to 64 letters, digits, `_`, `-` or `.`"
            )));
        }
        let side_effect = parse_side_effect(side_effect).ok_or_else(|| {
            tool_error(format!(
                "tool `{name}`: side_effect `{side_effect}` is not one of read_only, idempotent, effectful"
            ))
        })?;
        let input_schema = to_json(parameters, &format!("tool `{name}` parameters"))?;
        if input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(tool_error(format!(
                "tool `{name}`: parameters must be a JSON Schema with \"type\": \"object\" (the arguments are passed as keywords)"
            )));
        }
        Ok(Self {
            spec: ToolSpec {
                name: name.to_owned(),
                description: description.to_owned(),
                input_schema,
                side_effect,
                source: PYTHON_SOURCE.to_owned(),
                needs_approval,
            },
            function: Arc::new(function),
            pass_context,
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.spec.name
    }

    #[getter]
    fn description(&self) -> &str {
        &self.spec.description
    }

    #[getter]
    fn parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.spec.input_schema)
    }

    #[getter]
    fn side_effect(&self) -> &'static str {
        self.spec.side_effect.as_str()
    }

    /// Whether each call waits for a human's approval.
    #[getter]
    fn needs_approval(&self) -> bool {
        self.spec.needs_approval
    }

    #[getter]
    fn function(&self, py: Python<'_>) -> Py<PyAny> {
        self.function.clone_ref(py)
    }

    /// Calls the function directly, outside any task (for tests and notebooks).
    #[pyo3(signature = (**kwargs))]
    fn __call__(&self, py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        self.function.call(py, (), kwargs)
    }

    fn __repr__(&self) -> String {
        format!(
            "Tool(name={:?}, side_effect={:?})",
            self.spec.name,
            self.spec.side_effect.as_str()
        )
    }
}

/// A declared Python tool as the runtime's `Tool`.
#[derive(Clone)]
pub struct CallableTool {
    pub spec: ToolSpec,
    function: Arc<Py<PyAny>>,
    pass_context: bool,
}

impl CallableTool {
    pub fn new(tool: &PyTool) -> Self {
        Self {
            spec: tool.spec.clone(),
            function: tool.function.clone(),
            pass_context: tool.pass_context,
        }
    }
}

/// `ExceptionType: message` of a Python exception.
pub fn describe(py: Python<'_>, error: &PyErr) -> String {
    let name = error
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".to_owned());
    let text = error
        .value(py)
        .str()
        .map(|s| s.to_string())
        .unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

/// What a callable returned, as text: a `str` as is, `None` as nothing, anything else as JSON.
fn returned_text(value: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    if value.is_none() {
        return Ok(String::new());
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    let json = to_json(value, what)?;
    serde_json::to_string(&json).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[async_trait]
impl Tool for CallableTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let function = self.function.clone();
        let args = args.clone();
        let ctx = ctx.clone();
        let pass_context = self.pass_context;
        let name = self.spec.name.clone();
        let joined = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> Result<String, String> {
                let call = || -> PyResult<String> {
                    let kwargs = PyDict::new(py);
                    if let Value::Object(map) = &args {
                        for (key, value) in map {
                            kwargs.set_item(key, to_py(py, value)?)?;
                        }
                    }
                    if pass_context {
                        let context = json!({
                            "task_id": ctx.task_id,
                            "step": ctx.step,
                            "idempotency_key": ctx.idempotency_key,
                        });
                        kwargs.set_item("context", to_py(py, &context)?)?;
                    }
                    let result = function.call(py, (), Some(&kwargs))?;
                    returned_text(result.bind(py), &format!("the result of tool `{name}`"))
                };
                call().map_err(|error| describe(py, &error))
            })
        })
        .await;
        match joined {
            Ok(Ok(text)) => Ok(ToolOutput::success(text)),
            Ok(Err(message)) => Err(ToolError::Failed {
                tool: self.spec.name.clone(),
                message,
            }),
            Err(join) => Err(ToolError::Failed {
                tool: self.spec.name.clone(),
                message: format!("the call did not complete: {join}"),
            }),
        }
    }
}

/// What a Python model callable receives: the prompt as its two parts (`prefix`, identical at
/// every step of a task, and `body`), the same as chat `messages` (system = prefix, user =
/// body, as the OpenAI-compatible client sends them), and the JSON Schema a whole answer must
/// match (`output_schema`, for constrained decoding).
#[pyclass(module = "skillstate", name = "ModelRequest", frozen, get_all)]
pub struct PyModelRequest {
    /// The stable part of the prompt: procedure and tools.
    prefix: String,
    /// The part that changes: state, observation, and the errors of a rejected answer.
    body: String,
    /// o200k_base tokens of the whole prompt.
    prompt_tokens: usize,
    /// `[{"role": "system", "content": prefix}, {"role": "user", "content": body}]`.
    messages: Py<PyAny>,
    /// The JSON Schema of an answer `{"reasoning", "state_patch", "action"}`.
    output_schema: Py<PyAny>,
}

#[pymethods]
impl PyModelRequest {
    /// The whole prompt (`prefix + body`), as the journal's prompt hash covers it.
    #[getter]
    fn text(&self) -> String {
        format!("{}{}", self.prefix, self.body)
    }

    fn __repr__(&self) -> String {
        format!("ModelRequest(prompt_tokens={})", self.prompt_tokens)
    }
}

/// A Python callable as the runtime's model: `model(request: ModelRequest) -> str`.
pub struct CallableModel {
    function: Arc<Py<PyAny>>,
    spec: String,
    /// The first exception the callable raised, re-raised to the caller after the run.
    pub raised: Arc<Mutex<Option<PyErr>>>,
}

impl CallableModel {
    pub fn new(py: Python<'_>, function: Py<PyAny>) -> Self {
        let bound = function.bind(py);
        let name = bound
            .getattr("__qualname__")
            .or_else(|_| bound.get_type().getattr("__qualname__"))
            .and_then(|n| n.extract::<String>())
            .unwrap_or_else(|_| "callable".to_owned());
        Self {
            function: Arc::new(function),
            spec: format!("python:{name}"),
            raised: Arc::new(Mutex::new(None)),
        }
    }
}

#[async_trait]
impl ModelProvider for CallableModel {
    fn spec(&self) -> String {
        self.spec.clone()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let function = self.function.clone();
        let prefix = request.prompt.prefix.clone();
        let body = request.prompt.body.clone();
        let prompt_tokens = request.prompt_tokens;
        let schema = request.output_schema.clone();
        let raised = self.raised.clone();
        let started = Instant::now();
        let joined = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> Result<String, String> {
                let call = || -> PyResult<String> {
                    let messages = to_py(
                        py,
                        &json!([
                            {"role": "system", "content": prefix},
                            {"role": "user", "content": body},
                        ]),
                    )?
                    .unbind();
                    let output_schema = match &schema {
                        Some(schema) => to_py(py, schema)?.unbind(),
                        None => py.None(),
                    };
                    let request = Py::new(
                        py,
                        PyModelRequest {
                            prefix,
                            body,
                            prompt_tokens,
                            messages,
                            output_schema,
                        },
                    )?;
                    let answer = function.call1(py, (request,))?;
                    returned_text(answer.bind(py), "the model's answer")
                };
                call().map_err(|error| {
                    let text = describe(py, &error);
                    if let Ok(mut slot) = raised.lock()
                        && slot.is_none()
                    {
                        *slot = Some(error);
                    }
                    text
                })
            })
        })
        .await;
        let text = match joined {
            Ok(Ok(text)) => text,
            Ok(Err(message)) => {
                return Err(ProviderError::Unavailable {
                    provider: self.spec.clone(),
                    attempts: 1,
                    last: format!("the model callable raised {message}"),
                });
            }
            Err(join) => {
                return Err(ProviderError::Protocol {
                    provider: self.spec.clone(),
                    message: format!("the call did not complete: {join}"),
                });
            }
        };
        Ok(ModelResponse {
            text,
            usage: None,
            latency: started.elapsed(),
            truncated: false,
        })
    }
}
