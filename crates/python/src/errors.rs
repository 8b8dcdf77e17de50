//! The exceptions of the package: `SkillstateError` and one subclass per kind of failure, each
//! carrying `.kind` (the same names the CLI and the service use), `.pointer` (the JSON pointer
//! a problem is at, when it has one) and `.errors` (every problem, as `(kind, pointer, message)`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use skillstate_core::skill::Location;
use skillstate_core::{Rejection, SkillErrors};
use skillstate_runtime::RuntimeError;
use skillstate_runtime::upgrade::VersionName;
use skillstate_store::StoreError as StoreFailure;

create_exception!(
    skillstate,
    SkillstateError,
    PyException,
    "Base of every error skillstate raises. `.kind` names the failure, `.pointer` the JSON pointer it is at (or None), `.errors` lists every problem as (kind, pointer, message)."
);
create_exception!(
    skillstate,
    SkillError,
    SkillstateError,
    "A skill directory could not be loaded: `.errors` holds (file, location, message) for each problem."
);
create_exception!(
    skillstate,
    ValidationError,
    SkillstateError,
    "A state or answer broke the skill's rules: `.errors` holds (kind, pointer, message) for each problem."
);
create_exception!(
    skillstate,
    UpgradeRefused,
    ValidationError,
    "A task could not move to another version of its skill: the migrated state fails the new version's checks (schema, state budget, read-only locations), and nothing was changed. `.errors` holds (kind, pointer, message) for each problem, `.rejections` the same as dicts, `.task` the task's id and `.to` the version ({\"hash\", \"version\"})."
);
create_exception!(
    skillstate,
    StoreError,
    SkillstateError,
    "The database could not be opened, read or written, or holds no such task."
);
create_exception!(
    skillstate,
    TaskError,
    SkillstateError,
    "A task cannot be started or continued as asked (not resumable, a tool it needs is missing, its stored record is unusable)."
);
create_exception!(
    skillstate,
    ModelError,
    SkillstateError,
    "The model could not be built from its spec, or a Python model callable raised (the original exception is the __cause__)."
);
create_exception!(
    skillstate,
    ToolError,
    SkillstateError,
    "A tool could not be declared (bad name, parameters schema or side-effect class)."
);

/// Builds an exception of type `T` with its attributes set.
pub fn raise<T: pyo3::PyTypeInfo>(
    py: Python<'_>,
    kind: &str,
    pointer: Option<&str>,
    errors: Vec<(String, String, String)>,
    message: String,
) -> PyErr {
    let error = PyErr::new::<T, _>(message);
    let value = error.value(py);
    let _ = value.setattr("kind", kind);
    let _ = value.setattr("pointer", pointer);
    let list: Vec<Bound<'_, PyTuple>> = errors
        .into_iter()
        .filter_map(|(a, b, c)| PyTuple::new(py, [a, b, c]).ok())
        .collect();
    let _ = value.setattr("errors", list);
    error
}

/// `CamelCase` variant name of an error's Debug form as `snake_case`.
fn variant_kind(debug: &str) -> String {
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let mut kind = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                kind.push('_');
            }
            kind.push(c.to_ascii_lowercase());
        } else {
            kind.push(c);
        }
    }
    kind
}

pub fn skill_error(py: Python<'_>, errors: &SkillErrors) -> PyErr {
    let pointer = errors.problems.iter().find_map(|p| match &p.location {
        Some(Location::Pointer(pointer)) => Some(pointer.clone()),
        _ => None,
    });
    let list = errors
        .problems
        .iter()
        .map(|p| {
            let location = match &p.location {
                Some(Location::Line {
                    line,
                    column: Some(column),
                }) => format!("{line}:{column}"),
                Some(Location::Line { line, column: None }) => line.to_string(),
                Some(Location::Pointer(pointer)) => pointer.clone(),
                None => String::new(),
            };
            (p.file.display().to_string(), location, p.message.clone())
        })
        .collect();
    raise::<SkillError>(
        py,
        "skill",
        pointer.as_deref(),
        list,
        errors.to_string().trim_end().to_owned(),
    )
}

/// What a refusal's exception carries of its rejections: the first one's kind (`schema` when
/// there is none) and pointer, each as (kind, pointer, message), and each as a line.
struct RejectionParts<'a> {
    kind: &'a str,
    pointer: Option<&'a str>,
    list: Vec<(String, String, String)>,
    lines: Vec<String>,
}

impl<'a> RejectionParts<'a> {
    fn of(rejections: &'a [Rejection]) -> Self {
        let first = rejections.first();
        Self {
            kind: first.map(|r| r.kind.as_str()).unwrap_or("schema"),
            pointer: first.map(|r| r.pointer.as_str()),
            list: rejections
                .iter()
                .map(|r| {
                    (
                        r.kind.as_str().to_owned(),
                        r.pointer.clone(),
                        r.message.clone(),
                    )
                })
                .collect(),
            lines: rejections.iter().map(ToString::to_string).collect(),
        }
    }
}

pub fn rejections_error(py: Python<'_>, what: &str, rejections: &[Rejection]) -> PyErr {
    let RejectionParts {
        kind,
        pointer,
        list,
        lines,
    } = RejectionParts::of(rejections);
    raise::<ValidationError>(
        py,
        kind,
        pointer,
        list,
        format!("{what}:\n  {}", lines.join("\n  ")),
    )
}

/// The refusal of an upgrade: every problem of the migrated state with its pointer.
pub fn upgrade_refused(
    py: Python<'_>,
    task: &str,
    to: &VersionName,
    rejections: &[Rejection],
) -> PyErr {
    let RejectionParts {
        kind,
        pointer,
        list,
        lines,
    } = RejectionParts::of(rejections);
    let error = raise::<UpgradeRefused>(
        py,
        kind,
        pointer,
        list,
        format!(
            "task {task} cannot move to {to}: the migrated state does not fit it, so nothing was changed:\n  {}\nfix the new version's migration (migrations/<version>.json) or its schema, then upgrade again",
            lines.join("\n  ")
        ),
    );
    let value = error.value(py);
    let dicts: Vec<Bound<'_, PyDict>> = rejections
        .iter()
        .filter_map(|r| {
            let dict = PyDict::new(py);
            dict.set_item("kind", r.kind.as_str()).ok()?;
            dict.set_item("pointer", &r.pointer).ok()?;
            dict.set_item("message", &r.message).ok()?;
            Some(dict)
        })
        .collect();
    let _ = value.setattr("rejections", dicts);
    let _ = value.setattr("task", task);
    let version = PyDict::new(py);
    let _ = version.set_item("hash", &to.hash);
    let _ = version.set_item("version", to.version.as_deref());
    let _ = value.setattr("to", version);
    error
}

pub fn store_error(py: Python<'_>, error: &StoreFailure) -> PyErr {
    let kind = variant_kind(&format!("{error:?}"));
    let message = error.to_string();
    raise::<StoreError>(
        py,
        &kind,
        None,
        vec![(kind.clone(), String::new(), message.clone())],
        message,
    )
}

pub fn runtime_error(py: Python<'_>, error: &RuntimeError) -> PyErr {
    match error {
        RuntimeError::Store(store) => store_error(py, store),
        other => {
            let kind = match other {
                RuntimeError::Environment(_) => "environment".to_owned(),
                RuntimeError::Tools(_) => "tools".to_owned(),
                RuntimeError::Catalog(_) => "catalog".to_owned(),
                other => variant_kind(&format!("{other:?}")),
            };
            let message = other.to_string();
            raise::<TaskError>(
                py,
                &kind,
                None,
                vec![(kind.clone(), String::new(), message.clone())],
                message,
            )
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SkillstateError", py.get_type::<SkillstateError>())?;
    m.add("SkillError", py.get_type::<SkillError>())?;
    m.add("ValidationError", py.get_type::<ValidationError>())?;
    m.add("UpgradeRefused", py.get_type::<UpgradeRefused>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("TaskError", py.get_type::<TaskError>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("ToolError", py.get_type::<ToolError>())?;
    Ok(())
}
