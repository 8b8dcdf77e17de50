//! `Runtime` (a store and the runner over it) and `Task` (a stored task: state, journal, time
//! travel). Every wait on the database, the model or a tool happens with the interpreter
//! released; Python callables attach to it for their own call only.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde_json::Value;
use skillstate_core::json::text_hash;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_core::{AcceptedStep, ContextStrategy, RejectedStep, Skill};
use skillstate_providers::{ModelProvider, ProviderSettings};
use skillstate_runtime::{
    LeasePolicy, RunObserver, RunOutcome, Runner, RuntimeError, TaskOptions, rebuild_prompt,
    start_task,
};
use skillstate_store::{Store, StoreError, TaskRecord, Verdict, state_at};
use skillstate_tools::{Environment, EnvironmentError, Tool, UserRequest};

use crate::callables::{CallableModel, CallableTool, describe};
use crate::convert::to_py;
use crate::errors;
use crate::skill::{PySkill, allowing, callable_tools, tool_list};

pub struct Inner {
    tokio: tokio::runtime::Runtime,
    store: Mutex<Option<Arc<dyn Store>>>,
    location: String,
}

impl Inner {
    pub(crate) fn store(&self, py: Python<'_>) -> PyResult<Arc<dyn Store>> {
        self.store
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .ok_or_else(|| {
                errors::raise::<errors::StoreError>(
                    py,
                    "closed",
                    None,
                    Vec::new(),
                    format!("the runtime over {} is closed", self.location),
                )
            })
    }

    /// Runs `future` to completion with the interpreter released.
    pub(crate) fn block<F: Future + Send>(&self, py: Python<'_>, future: F) -> F::Output
    where
        F::Output: Send,
    {
        py.detach(|| self.tokio.block_on(future))
    }
}

/// A built-in environment offered Python tools as well.
struct WithTools {
    inner: Box<dyn Environment>,
    extra: Vec<Arc<dyn Tool>>,
}

impl Environment for WithTools {
    fn kind(&self) -> &str {
        self.inner.kind()
    }
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut tools = self.inner.tools();
        tools.extend(self.extra.iter().cloned());
        tools
    }
    fn opening_observation(&mut self) -> String {
        self.inner.opening_observation()
    }
    fn after_action(&mut self) -> Option<String> {
        self.inner.after_action()
    }
    fn episode_over(&self) -> bool {
        self.inner.episode_over()
    }
    fn outcome(&self) -> Value {
        self.inner.outcome()
    }
    fn checkpoint(&self) -> Value {
        self.inner.checkpoint()
    }
    fn restore(&mut self, checkpoint: &Value) -> Result<(), EnvironmentError> {
        self.inner.restore(checkpoint)
    }
    fn replayable(&self) -> bool {
        self.inner.replayable()
    }
}

/// The world of a task: its built-in environment (plus the Python tools), or the request
/// with the Python tools.
fn world(
    settings: Option<&EnvironmentSettings>,
    request: &str,
    tools: &[CallableTool],
) -> Result<Box<dyn Environment>, String> {
    let extra: Vec<Arc<dyn Tool>> = tools
        .iter()
        .map(|t| Arc::new(t.clone()) as Arc<dyn Tool>)
        .collect();
    world_with(settings, request, extra)
}

/// `world` with any tools as the extra ones.
pub(crate) fn world_with(
    settings: Option<&EnvironmentSettings>,
    request: &str,
    extra: Vec<Arc<dyn Tool>>,
) -> Result<Box<dyn Environment>, String> {
    Ok(match settings {
        Some(settings) => {
            let inner = skillstate_envs::build_environment(settings).map_err(|e| e.to_string())?;
            if extra.is_empty() {
                inner
            } else {
                Box::new(WithTools { inner, extra })
            }
        }
        None => Box::new(UserRequest::new(request).with_tools(extra)),
    })
}

/// Counts accepted steps and asks the runner to stop after `limit` of them.
struct StepLimit {
    stop: Arc<AtomicBool>,
    remaining: Option<u64>,
}

impl RunObserver for StepLimit {
    fn attempt(
        &mut self,
        _step: u64,
        _attempt: u32,
        _prompt_tokens: usize,
        result: Result<&AcceptedStep, &RejectedStep>,
    ) {
        if result.is_ok()
            && let Some(remaining) = &mut self.remaining
        {
            *remaining = remaining.saturating_sub(1);
            if *remaining == 0 {
                self.stop.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// The model a run uses: a Python callable, or a spec string as the CLI's `--model` takes.
enum ModelChoice {
    Callable(Arc<CallableModel>),
    Spec(Arc<dyn ModelProvider>),
}

fn model_choice(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    environment: Option<&str>,
    settings: Option<&Bound<'_, PyAny>>,
) -> PyResult<ModelChoice> {
    let model_error = |message: String| {
        errors::raise::<errors::ModelError>(py, "model", None, Vec::new(), message)
    };
    if let Ok(spec) = model.cast::<PyString>() {
        let spec = spec.to_cow()?;
        let spec: &str = &spec;
        if spec == "oracle" {
            let kind = environment.ok_or_else(|| {
                model_error("model \"oracle\" needs a skill with a built-in [environment]".into())
            })?;
            let oracle = skillstate_envs::oracle::OracleModel::for_environment(kind)
                .map_err(|e| model_error(e.to_string()))?;
            return Ok(ModelChoice::Spec(Arc::new(oracle)));
        }
        let mut provider_settings = match settings {
            Some(s) if !s.is_none() => {
                serde_json::from_value(crate::convert::to_json(s, "model_settings")?)
                    .map_err(|e| model_error(format!("model_settings: {e}")))?
            }
            _ => ProviderSettings::default(),
        };
        if provider_settings.base_url.is_none() {
            provider_settings.base_url = std::env::var("SKILLSTATE_BASE_URL").ok();
        }
        let provider = skillstate_providers::from_spec(spec, &provider_settings)
            .map_err(|e| model_error(e.to_string()))?;
        return Ok(ModelChoice::Spec(Arc::from(provider)));
    }
    if model.is_callable() {
        return Ok(ModelChoice::Callable(Arc::new(CallableModel::new(
            py,
            model.clone().unbind(),
        ))));
    }
    Err(model_error(format!(
        "model: expected a callable (request -> str) or a spec string (oracle, scripted:<file.jsonl>, openai:<model>, anthropic:<model>), got {}",
        model.get_type().name()?
    )))
}

impl ModelChoice {
    fn provider(&self) -> Arc<dyn ModelProvider> {
        match self {
            ModelChoice::Callable(model) => model.clone(),
            ModelChoice::Spec(provider) => provider.clone(),
        }
    }

    /// The exception the Python model raised during the run, as a ModelError caused by it.
    fn raised(&self, py: Python<'_>, task: &str) -> Option<PyErr> {
        let ModelChoice::Callable(model) = self else {
            return None;
        };
        let original = model.raised.lock().ok()?.take()?;
        let error = errors::raise::<errors::ModelError>(
            py,
            "model",
            None,
            Vec::new(),
            format!(
                "the model callable raised {} (task {task} failed; continue it with Runtime.resume(task_id, retry=True))",
                describe(py, &original)
            ),
        );
        error.set_cause(py, Some(original));
        Some(error)
    }
}

/// How a stored task is continued.
#[derive(Clone)]
enum Entry {
    Run,
    Retry,
    Approve,
    Reject(String),
    Reply(String),
}

/// A skillstate runtime over one database: SQLite (a file path, `sqlite::memory:`) or
/// PostgreSQL (`postgres://…`). Runs skills as durable tasks and reads them back.
///
/// Runs block the calling thread but release the GIL while the runtime waits on the model,
/// tools or the database: other Python threads keep running. `arun`/`aresume` (from the
/// package) run the same in a worker thread for asyncio.
#[pyclass(module = "skillstate", name = "Runtime", frozen, subclass)]
pub struct PyRuntime {
    inner: Arc<Inner>,
}

impl PyRuntime {
    #[allow(clippy::too_many_arguments)]
    fn drive(
        &self,
        py: Python<'_>,
        task_id: &str,
        entry: Entry,
        model: &ModelChoice,
        tools: &[CallableTool],
        max_steps: Option<u64>,
        settings: Option<EnvironmentSettings>,
    ) -> PyResult<Task> {
        let store = self.inner.store(py)?;
        let provider = model.provider();
        let stop = Arc::new(AtomicBool::new(false));
        let tools = tools.to_vec();
        let id = task_id.to_owned();
        let outcome: Result<RunOutcome, String> = self.inner.block(py, async move {
            let mut env = world(settings.as_ref(), "", &tools)?;
            let mut limit = StepLimit {
                stop: stop.clone(),
                remaining: max_steps,
            };
            let mut runner = Runner::new(store, provider, env.as_mut(), &mut limit)
                .with_stop(stop)
                .with_lease_policy(LeasePolicy {
                    label: format!("python {}", std::process::id()),
                    ..LeasePolicy::default()
                });
            let result = match entry {
                Entry::Run => runner.run(&id).await,
                Entry::Retry => runner.retry(&id).await,
                Entry::Approve => runner.approve(&id).await,
                Entry::Reject(reason) => runner.reject(&id, &reason).await,
                Entry::Reply(answer) => runner.reply(&id, &answer).await,
            };
            result.map_err(|e| error_text(&e))
        });
        if let Some(raised) = model.raised(py, task_id) {
            return Err(raised);
        }
        match outcome {
            Ok(outcome) => Ok(Task {
                inner: self.inner.clone(),
                id: outcome.task_id,
            }),
            Err(text) => Err(errors::raise::<errors::TaskError>(
                py,
                "run",
                None,
                Vec::new(),
                text,
            )),
        }
    }

    /// Continues a stored task with the world rebuilt from its record.
    #[allow(clippy::too_many_arguments)]
    fn continue_task(
        &self,
        py: Python<'_>,
        task_id: &str,
        entry: Entry,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        max_steps: Option<u64>,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let store = self.inner.store(py)?;
        let task = self
            .inner
            .block(py, async { store.task(task_id).await })
            .map_err(|e| errors::store_error(py, &e))?;
        let settings = task_environment(py, &task)?;
        let tools = callable_tools(py, &tool_list(py, tools)?);
        let model = model_choice(
            py,
            model,
            settings.as_ref().map(|s| s.kind.as_str()),
            model_settings,
        )?;
        self.drive(py, &task.id, entry, &model, &tools, max_steps, settings)
    }
}

/// The built-in environment a stored task runs in, from its record (None: its request and the
/// Python tools are its world).
pub(crate) fn task_environment(
    py: Python<'_>,
    task: &TaskRecord,
) -> PyResult<Option<EnvironmentSettings>> {
    match &task.environment {
        Some(record) if !record.is_null() => {
            Ok(Some(serde_json::from_value(record.clone()).map_err(|e| {
                errors::raise::<errors::TaskError>(
                    py,
                    "environment",
                    None,
                    Vec::new(),
                    format!(
                        "task {}: its environment record cannot be rebuilt here ({e}); use the skillstate CLI for it",
                        task.id
                    ),
                )
            })?))
        }
        _ => Ok(None),
    }
}

fn error_text(error: &RuntimeError) -> String {
    error.to_string()
}

#[pymethods]
impl PyRuntime {
    /// Runtime(database="skillstate.db")
    ///
    /// Opens (creating and migrating when needed) the database: a SQLite file path,
    /// `sqlite::memory:`, or a `postgres://` URL.
    #[new]
    #[pyo3(signature = (database = "skillstate.db"))]
    fn new(py: Python<'_>, database: &str) -> PyResult<Self> {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("skillstate")
            .enable_all()
            .build()
            .map_err(|e| {
                errors::raise::<errors::SkillstateError>(
                    py,
                    "runtime",
                    None,
                    Vec::new(),
                    format!("cannot start the runtime's threads: {e}"),
                )
            })?;
        let location = database.to_owned();
        let store = py
            .detach(|| tokio.block_on(skillstate_store::open(&location)))
            .map_err(|e| errors::store_error(py, &e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                tokio,
                store: Mutex::new(Some(store)),
                location,
            }),
        })
    }

    /// The database this runtime was opened on.
    #[getter]
    fn database(&self) -> &str {
        &self.inner.location
    }

    /// run(skill, model, tools=None, input=None, context="state", budget=None, max_steps=None, model_settings=None) -> Task
    ///
    /// Starts a task of `skill` and runs it until it finishes, fails or pauses (or after
    /// `max_steps` accepted steps; `resume` continues it). Every accepted step is committed
    /// to the database before its action runs; an effectful tool's call is journaled first
    /// and never re-run blindly after a crash.
    ///
    /// model: a callable `model(request: ModelRequest) -> str` (request.prefix, .body,
    ///     .messages, .output_schema), or a spec string: "oracle" (built-in environments),
    ///     "scripted:<file.jsonl>", "openai:<model>", "anthropic:<model>" (`model_settings`:
    ///     the [model] table of skillstate.toml as a dict: base_url, temperature, ...).
    /// tools: Python tools (skillstate.tool), a dict {name: Tool} or a list; default: the
    ///     tools the skill was loaded with.
    /// input: the request that opens the task (skills without a built-in environment).
    /// context: state (default), history, summary, stateful or window.
    #[pyo3(signature = (skill, model, tools = None, input = None, context = "state", budget = None, max_steps = None, model_settings = None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        skill: &Bound<'_, PySkill>,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        input: Option<&str>,
        context: &str,
        budget: Option<usize>,
        max_steps: Option<u64>,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let value_error = |message: String| pyo3::exceptions::PyValueError::new_err(message);
        let context = ContextStrategy::parse(context).ok_or_else(|| {
            value_error(format!(
                "context `{context}`: use one of {}",
                ContextStrategy::NAMES.join(", ")
            ))
        })?;
        let skill = skill.get();
        let py_tools = match tools {
            Some(t) if !t.is_none() => tool_list(py, Some(t))?,
            _ => skill.tools.iter().map(|t| t.clone_ref(py)).collect(),
        };
        let tools = callable_tools(py, &py_tools);
        let mut definition = skill.frame.skill().definition.clone();
        let loaded: Vec<String> = skill
            .tools
            .iter()
            .map(|t| t.bind(py).get().spec.name.clone())
            .collect();
        definition
            .settings
            .tools
            .allow
            .retain(|a| !loaded.contains(a));
        let definition = allowing(definition, &tools);
        let settings = definition.settings.environment.clone();
        let task_error = |kind: &str, message: String| {
            errors::raise::<errors::TaskError>(py, kind, None, Vec::new(), message)
        };
        let request = match (&settings, input) {
            (Some(env), Some(_)) => {
                return Err(task_error(
                    "input",
                    format!(
                        "skill `{}` runs in the `{}` environment, which supplies its own observations; drop input",
                        definition.name, env.kind
                    ),
                ));
            }
            (None, None) => {
                return Err(task_error(
                    "input",
                    format!(
                        "skill `{}` has no [environment] in skill.toml, so the task needs a request: pass input=\"...\"",
                        definition.name
                    ),
                ));
            }
            (_, input) => input.unwrap_or_default().to_owned(),
        };
        let model = model_choice(
            py,
            model,
            settings.as_ref().map(|s| s.kind.as_str()),
            model_settings,
        )?;
        let core_skill =
            Skill::from_definition(definition).map_err(|message| task_error("skill", message))?;
        let store = self.inner.store(py)?;
        let options = TaskOptions {
            context_budget: budget,
            ..TaskOptions::new(model.provider().spec(), context)
        };
        let created: Result<TaskRecord, String> = {
            let tools = tools.clone();
            let settings = settings.clone();
            self.inner.block(py, async move {
                let mut env = world(settings.as_ref(), &request, &tools)?;
                start_task(store.as_ref(), &core_skill, env.as_mut(), &options)
                    .await
                    .map_err(|e| error_text(&e))
            })
        };
        let task = created.map_err(|text| task_error("start", text))?;
        self.drive(
            py,
            &task.id,
            Entry::Run,
            &model,
            &tools,
            max_steps,
            settings,
        )
    }

    /// resume(task_id, model, tools=None, max_steps=None, retry=False, model_settings=None) -> Task
    ///
    /// Continues a stored task (by id or a unique prefix) from where it stands, in this or
    /// another process: the journal is checked, an action left in flight is settled (a
    /// read-only or idempotent tool runs again, an effectful one does not — its outcome
    /// becomes unknown), and the task runs on. `tools` must provide the Python tools the
    /// task was given. `retry=True` continues a failed task with a fresh retry budget.
    #[pyo3(signature = (task_id, model, tools = None, max_steps = None, retry = false, model_settings = None))]
    #[allow(clippy::too_many_arguments)]
    fn resume(
        &self,
        py: Python<'_>,
        task_id: &str,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        max_steps: Option<u64>,
        retry: bool,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let entry = if retry { Entry::Retry } else { Entry::Run };
        self.continue_task(py, task_id, entry, model, tools, max_steps, model_settings)
    }

    /// Answers a paused task (an `ask_user` question, or an action whose outcome is unknown)
    /// and runs it on.
    #[pyo3(signature = (task_id, answer, model, tools = None, max_steps = None, model_settings = None))]
    #[allow(clippy::too_many_arguments)]
    fn reply(
        &self,
        py: Python<'_>,
        task_id: &str,
        answer: &str,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        max_steps: Option<u64>,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let entry = Entry::Reply(answer.to_owned());
        self.continue_task(py, task_id, entry, model, tools, max_steps, model_settings)
    }

    /// Runs the action waiting for approval, exactly once, and continues the task.
    #[pyo3(signature = (task_id, model, tools = None, max_steps = None, model_settings = None))]
    fn approve(
        &self,
        py: Python<'_>,
        task_id: &str,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        max_steps: Option<u64>,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        self.continue_task(
            py,
            task_id,
            Entry::Approve,
            model,
            tools,
            max_steps,
            model_settings,
        )
    }

    /// Refuses the action waiting for approval; the refusal and `reason` become the next
    /// observation, and the task continues.
    #[pyo3(signature = (task_id, reason, model, tools = None, max_steps = None, model_settings = None))]
    #[allow(clippy::too_many_arguments)]
    fn reject(
        &self,
        py: Python<'_>,
        task_id: &str,
        reason: &str,
        model: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        max_steps: Option<u64>,
        model_settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Task> {
        let entry = Entry::Reject(reason.to_owned());
        self.continue_task(py, task_id, entry, model, tools, max_steps, model_settings)
    }

    /// upgrade(task_id, skill, *, apply=False, author="operator") -> dict
    ///
    /// Moves a stored task (by id or a unique prefix) to another version of its skill, as
    /// `skillstate upgrade` does: the new version's migrations run on the task's state, the
    /// result must pass the new schema, state budget and read-only rule, and the upgrade is a
    /// step of the task's journal authored by `author`. Without `apply` nothing is written:
    /// the answer is what applying would do now.
    ///
    /// skill: a Skill, or the path of a skill directory. The Python tools the new version
    ///     offers are the Skill's (Skill.load(path, tools=...)); a path, or a Skill loaded
    ///     without tools, keeps the Python tools the task was given.
    ///
    /// A task waiting for an approval or a reply is not moved at once: the upgrade is
    /// checked now and scheduled, and committed by whoever settles the waiting action
    /// (approve, reject, reply), before the next model call.
    ///
    /// Returns a dict: task, outcome ("moved": committed; "scheduled": committed once the
    /// waiting action is settled; "planned": a dry run), from and to ({"hash", "version"}),
    /// migrations (the versions their files start from), diff (RFC 6902 operations from the
    /// state before to the state after), step (the step that records it), applied, scheduled
    /// (whether it waits, or would wait, for the pending action).
    ///
    /// Raises UpgradeRefused (`.errors`, `.rejections` with each problem's pointer) when the
    /// migrated state does not fit, TaskError (kind unchanged, other_skill, busy, pending or
    /// stale) when the task cannot move now, StoreError, SkillError for a bad directory.
    #[pyo3(signature = (task_id, skill, *, apply = false, author = "operator"))]
    fn upgrade<'py>(
        &self,
        py: Python<'py>,
        task_id: &str,
        skill: &Bound<'py, PyAny>,
        apply: bool,
        author: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::upgrade::upgrade(&self.inner, py, task_id, skill, apply, author)
    }

    /// The skill versions the database keeps, oldest first: dicts with name, version
    /// (skill.toml's, or None), hash, tasks (running it now), former_tasks (moved to another
    /// version since), bytes (its stored skill and tools) and created_at (milliseconds since
    /// the Unix epoch), as `skillstate skills` lists them.
    fn skills<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        crate::upgrade::skills(&self.inner, py)
    }

    /// The stored task with this id (or unique id prefix).
    fn task(&self, py: Python<'_>, task_id: &str) -> PyResult<Task> {
        let store = self.inner.store(py)?;
        let task = self
            .inner
            .block(py, async { store.task(task_id).await })
            .map_err(|e| errors::store_error(py, &e))?;
        Ok(Task {
            inner: self.inner.clone(),
            id: task.id,
        })
    }

    /// Closes the database: finishes the writes already handed over, closes every connection
    /// and returns once this process no longer uses the file (or server). Closing twice is
    /// harmless; anything asked of the runtime or its tasks afterwards raises StoreError
    /// "closed". Garbage collection closes too, but in the background: close (or a `with`
    /// block) before another program or library opens the same SQLite file.
    fn close(&self, py: Python<'_>) {
        let store = self.inner.store.lock().ok().and_then(|mut s| s.take());
        if let Some(store) = store {
            self.inner.block(py, async move { store.release().await });
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the runtime at the end of a `with` block (exceptions propagate).
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("Runtime({:?})", self.inner.location)
    }
}

/// A stored task. Every property reads the database afresh.
#[pyclass(module = "skillstate", name = "Task", frozen)]
pub struct Task {
    inner: Arc<Inner>,
    id: String,
}

impl Task {
    fn record(&self, py: Python<'_>) -> PyResult<TaskRecord> {
        let store = self.inner.store(py)?;
        self.inner
            .block(py, async { store.task(&self.id).await })
            .map_err(|e| errors::store_error(py, &e))
    }
}

#[pymethods]
impl Task {
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The current state (a new dict).
    #[getter]
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.record(py)?.state)
    }

    /// running, completed, failed, awaiting_input or awaiting_approval.
    #[getter]
    fn status(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(self.record(py)?.status.as_str())
    }

    /// Accepted steps so far (the state's version).
    #[getter]
    fn version(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.record(py)?.version)
    }

    /// Why the task stopped (finish result, failure reason, pause), or None while it runs.
    #[getter]
    fn outcome<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.record(py)?.outcome.unwrap_or(Value::Null))
    }

    /// The model spec recorded with the task.
    #[getter]
    fn model(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.record(py)?.model)
    }

    /// Every answer in the journal, rejected ones included, as dicts: step, attempt, verdict
    /// ("accepted"/"rejected"), output (the answer's text), patch, action, errors
    /// ([(kind, pointer, message)]), state_hash, prompt_hash, prompt_tokens, output_tokens,
    /// latency_ms, and for accepted steps with an action: result and ok.
    fn steps<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let store = self.inner.store(py)?;
        let id = self.id.clone();
        let (journal, intents) = self
            .inner
            .block(py, async move {
                let journal = store.journal(&id).await?;
                let intents = store.intents(&id).await?;
                Ok::<_, StoreError>((journal, intents))
            })
            .map_err(|e| errors::store_error(py, &e))?;
        let mut rows = Vec::with_capacity(journal.len());
        for entry in journal {
            let dict = PyDict::new(py);
            dict.set_item("step", entry.step)?;
            dict.set_item("attempt", entry.attempt)?;
            dict.set_item(
                "verdict",
                match entry.verdict {
                    Verdict::Accepted => "accepted",
                    Verdict::Rejected => "rejected",
                },
            )?;
            dict.set_item("output", &entry.output)?;
            dict.set_item(
                "patch",
                to_py(py, entry.patch.as_ref().unwrap_or(&Value::Null))?,
            )?;
            dict.set_item(
                "action",
                to_py(py, entry.action.as_ref().unwrap_or(&Value::Null))?,
            )?;
            let errors: Vec<(String, String, String)> = entry
                .errors
                .as_ref()
                .and_then(|e| {
                    serde_json::from_value::<Vec<skillstate_core::Rejection>>(e.clone()).ok()
                })
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.kind.as_str().to_owned(), r.pointer, r.message))
                .collect();
            dict.set_item("errors", errors)?;
            dict.set_item("state_hash", entry.state_hash.as_deref())?;
            dict.set_item("prompt_hash", &entry.prompt_hash)?;
            dict.set_item("prompt_tokens", entry.prompt_tokens)?;
            dict.set_item("output_tokens", entry.output_tokens)?;
            dict.set_item("latency_ms", entry.latency_ms)?;
            dict.set_item("author", entry.author.as_deref())?;
            if entry.verdict == Verdict::Accepted
                && let Some(intent) = intents.iter().find(|i| i.step == entry.step)
            {
                dict.set_item("tool", &intent.tool)?;
                dict.set_item("side_effect", &intent.side_effect)?;
                dict.set_item("done", intent.done)?;
                // `ok` is None while pending and when a crash left the outcome unknown;
                // `action_outcome` tells the two apart.
                dict.set_item("ok", intent.ok)?;
                dict.set_item(
                    "action_outcome",
                    match intent.outcome() {
                        skillstate_store::ActionOutcome::Pending => "pending",
                        skillstate_store::ActionOutcome::Succeeded => "succeeded",
                        skillstate_store::ActionOutcome::Failed => "failed",
                        skillstate_store::ActionOutcome::Unknown => "unknown",
                    },
                )?;
                dict.set_item("result", intent.result.as_deref())?;
            }
            rows.push(dict);
        }
        Ok(rows)
    }

    /// The state as it was after step `step` (0: the initial state), rebuilt from the journal.
    fn state_at<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyAny>> {
        let record = self.record(py)?;
        let store = self.inner.store(py)?;
        let state = self
            .inner
            .block(py, async {
                state_at(store.as_ref(), &record.id, step, record.version).await
            })
            .map_err(|e| errors::store_error(py, &e))?;
        to_py(py, &state)
    }

    /// The exact prompt the model received at step `step` (answer `attempt`; default: the
    /// accepted one, else the last), rebuilt from the journal and checked against the SHA-256
    /// recorded when it was sent.
    #[pyo3(signature = (step, attempt = None))]
    fn prompt_at(&self, py: Python<'_>, step: u64, attempt: Option<u32>) -> PyResult<String> {
        if step == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "step 0 is the initial state; prompts start at step 1",
            ));
        }
        let record = self.record(py)?;
        let store = self.inner.store(py)?;
        let rebuilt = self
            .inner
            .block(py, async {
                let attempt = match attempt {
                    Some(a) => a,
                    None => {
                        let journal = store.journal(&record.id).await?;
                        let at_step: Vec<_> = journal.iter().filter(|e| e.step == step).collect();
                        at_step
                            .iter()
                            .find(|e| e.verdict == Verdict::Accepted)
                            .or(at_step.last())
                            .map(|e| e.attempt)
                            .unwrap_or(1)
                    }
                };
                rebuild_prompt(store.as_ref(), &record, step, attempt).await
            })
            .map_err(|e| errors::runtime_error(py, &e))?;
        let (prompt, recorded) = rebuilt;
        let text = prompt.text();
        if text_hash(&text) != recorded {
            return Err(errors::raise::<errors::TaskError>(
                py,
                "prompt_mismatch",
                None,
                Vec::new(),
                format!(
                    "task {}: the prompt rebuilt for step {step} does not match the hash recorded when it was sent",
                    self.id
                ),
            ));
        }
        Ok(text)
    }

    fn __repr__(&self) -> String {
        format!("Task({:?})", self.id)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Task>().is_ok_and(|t| t.get().id == self.id)
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.id.hash(&mut hasher);
        hasher.finish()
    }
}
