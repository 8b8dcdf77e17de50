//! How a create request becomes a task.
//!
//! The server knows requests, tenants and the store; it does not know how a skill's world is
//! built (built-in environments, tool boxes with MCP servers, model specs): that is the
//! caller's [`TaskFactory`], which the `skillstate` binary implements with its environments and
//! tool boxes. The server checks what it can on its own first ([`check_request`]: names, labels,
//! numbers) and resolves what the request names on the server through its
//! [`ServicePolicy`](crate::ServicePolicy), then asks the factory for the frozen task and its
//! initial state, handing it only the [`ResolvedRequest`].
//!
//! Helpers for factories: [`skill_dir`] finds a skill in the server's skills directory without
//! letting a name escape it, [`check_initial_state`] checks a given state as state.init.json is
//! checked, with one error per problem and its pointer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use skillstate_core::{ContextStrategy, Skill, ToolSpec};
use skillstate_store::{NewTask, TaskRecord};
use skillstate_tools::Environment;
use utoipa::ToSchema;

use crate::policy::{ResolvedRequest, ResolvedSkill};
use crate::problem::{ApiError, FieldError};

/// A request to create a task.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTaskRequest {
    /// The skill's name: a directory of the server's skills directory.
    #[schema(example = "warehouse")]
    pub skill: String,
    /// The model, as `skillstate run --model` takes it (`oracle`, `openai:<model>`,
    /// `anthropic:<model>`): one the server's allow-list names (`serve --allow-model`; 422 at
    /// `/model` otherwise). `scripted:<name>` only where the operator turned scripted models on
    /// for a directory (`serve --scripted-dir`), `<name>` relative to it.
    #[schema(example = "oracle")]
    pub model: String,
    /// What each prompt keeps besides the procedure and tools.
    #[serde(default)]
    pub context: ContextName,
    /// Token budget of the whole prompt for the `window` and `summary` strategies.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub budget: Option<u64>,
    /// The request that opens the task, for skills without a built-in environment.
    #[serde(default)]
    pub input: Option<String>,
    /// The task's initial state instead of the skill's state.init.json; checked against the
    /// skill's state schema and state budget.
    #[serde(default)]
    pub state: Option<Value>,
    /// Overrides of the skill's `[environment]` parameters (`seed`, `events`, ...), for skills
    /// with a built-in environment. Settings that name a file on the server (`audit_log`) are
    /// the operator's, in skill.toml: 422 at `/environment/<name>`.
    #[serde(default)]
    pub environment: BTreeMap<String, Value>,
    /// String labels, filterable in listings (`GET /v1/tasks?label=team:ops`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The version of the skill the task must run: skill.toml's `version`, or its content hash
    /// (a prefix of at least 6 hexadecimal digits). When the server's skill is another version
    /// (the operator deployed a new one), the create is refused with 422 at `/skill_version`
    /// rather than run on a version the caller did not write for.
    #[serde(default)]
    #[schema(example = "1.2.0")]
    pub skill_version: Option<String>,
}

/// A context strategy (docs/concepts.md, "Context strategies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContextName {
    #[default]
    State,
    History,
    Summary,
    Stateful,
    Window,
}

impl ContextName {
    pub fn strategy(self) -> ContextStrategy {
        match self {
            ContextName::State => ContextStrategy::State,
            ContextName::History => ContextStrategy::History,
            ContextName::Summary => ContextStrategy::Summary,
            ContextName::Stateful => ContextStrategy::Stateful,
            ContextName::Window => ContextStrategy::Window,
        }
    }
}

/// Builds tasks for the server. Implemented by whoever wires the server (the CLI, tests).
#[async_trait]
pub trait TaskFactory: Send + Sync {
    /// The task `request` asks for (skill definition and tools frozen, opening observation
    /// recorded) and its initial state. Problems the caller can fix are
    /// `ApiError::Invalid` with pointers into the request (`/skill`, `/state/inventory`);
    /// nothing is stored yet.
    ///
    /// The request was resolved by the server's [`ServicePolicy`](crate::ServicePolicy)
    /// first: its skill, model and environment settings are ones the operator allows. This
    /// runs on a thread of its own ([`crate::offload`]), so it may compute at length; the
    /// request gives up on it at the server's work deadline.
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError>;

    /// A fresh instance of `task`'s world for a fork, so a replayable (simulated) world can be
    /// rebuilt as it was at the fork's step; `None` (the default) forks without one.
    async fn fork_world(
        &self,
        _task: &TaskRecord,
    ) -> Result<Option<Box<dyn Environment>>, ApiError> {
        Ok(None)
    }

    /// The version of `skill` the server holds now, compiled, with the tools `task`'s world
    /// presents with it: what an upgrade of `task` moves it to
    /// (`POST /v1/tasks/{id}:upgrade`). A skill that does not load is a 422 at `/skill`. The
    /// default: this server cannot build versions (409).
    async fn upgrade_target(
        &self,
        _task: &TaskRecord,
        skill: &ResolvedSkill,
    ) -> Result<UpgradeTarget, ApiError> {
        Err(ApiError::conflict(format!(
            "this server cannot build skill `{}` to upgrade tasks to; run `skillstate upgrade` where the skill's directory is",
            skill.name
        )))
    }
}

/// A version of a skill to move tasks to, as a [`TaskFactory`] builds it.
pub struct UpgradeTarget {
    pub skill: Skill,
    /// The tools the task's world presents with it.
    pub tools: Vec<ToolSpec>,
}

/// Longest skill name, label name, label value and input accepted.
pub const MAX_NAME: usize = 64;
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_VALUE: usize = 256;
pub const MAX_BUDGET: u64 = 10_000_000;

/// What the server checks of a create request on its own, every problem with its pointer.
pub fn check_request(request: &CreateTaskRequest) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !is_name(&request.skill) {
        errors.push(FieldError::new(
            "field",
            "/skill",
            format!(
                "`{}` is not a skill name: use 1-{MAX_NAME} of a-z, A-Z, 0-9, `-`, `_` (the name of a directory of the server's skills directory)",
                request.skill
            ),
        ));
    }
    if request.model.trim().is_empty() {
        errors.push(FieldError::new(
            "field",
            "/model",
            "give a model, for example `oracle`",
        ));
    }
    if let Some(budget) = request.budget
        && !(1..=MAX_BUDGET).contains(&budget)
    {
        errors.push(FieldError::new(
            "field",
            "/budget",
            format!("{budget} is out of range; give 1 to {MAX_BUDGET} tokens"),
        ));
    }
    if let Some(state) = &request.state
        && !state.is_object()
    {
        errors.push(FieldError::new(
            "field",
            "/state",
            "the initial state must be a JSON object",
        ));
    }
    if let Some(pin) = &request.skill_version
        && !is_version_pin(pin)
    {
        errors.push(FieldError::new(
            "field",
            "/skill_version",
            "give skill.toml's version (1.2.0) or at least 6 hexadecimal digits of the version's content hash, as `skillstate skills` lists them",
        ));
    }
    if request.labels.len() > MAX_LABELS {
        errors.push(FieldError::new(
            "field",
            "/labels",
            format!(
                "{} labels given; at most {MAX_LABELS} are kept per task",
                request.labels.len()
            ),
        ));
    }
    for (key, value) in &request.labels {
        let pointer = format!("/labels/{}", key.replace('~', "~0").replace('/', "~1"));
        if !is_label_name(key) {
            errors.push(FieldError::new(
                "field",
                pointer.clone(),
                format!(
                    "a label name is 1-{MAX_NAME} of a-z, A-Z, 0-9, `-`, `_`, `.` (so `label=name:value` filters are unambiguous)"
                ),
            ));
        }
        if value.chars().count() > MAX_LABEL_VALUE || value.chars().any(char::is_control) {
            errors.push(FieldError::new(
                "field",
                pointer,
                format!("a label value is at most {MAX_LABEL_VALUE} characters, none of them control characters"),
            ));
        }
    }
    errors
}

/// Whether `pin` can name a skill version: a semantic version, or a hash prefix.
pub(crate) fn is_version_pin(pin: &str) -> bool {
    skillstate_core::skill::SkillVersion::parse(pin).is_ok() || is_hash_prefix(pin)
}

fn is_hash_prefix(text: &str) -> bool {
    (6..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `version` (as reports name it) is the one `pin` names.
pub(crate) fn pin_names(pin: &str, version: &skillstate_runtime::upgrade::VersionName) -> bool {
    version.version.as_deref() == Some(pin)
        || (is_hash_prefix(pin) && version.hash.starts_with(&pin.to_ascii_lowercase()))
}

pub(crate) fn is_name(text: &str) -> bool {
    (1..=MAX_NAME).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(crate) fn is_label_name(text: &str) -> bool {
    (1..=MAX_NAME).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The directory of skill `name` in `skills_dir`: a direct child holding SKILL.md. A name
/// that is not a plain name, or no such skill, is a 422 at `/skill` that names no path.
pub fn skill_dir(skills_dir: &Path, name: &str) -> Result<PathBuf, ApiError> {
    let missing = || {
        ApiError::invalid(
            format!("this server has no skill `{name}`"),
            vec![FieldError::new(
                "field",
                "/skill",
                format!("no skill named `{name}` on this server"),
            )],
        )
    };
    if !is_name(name) {
        return Err(missing());
    }
    let dir = skills_dir.join(name);
    if dir.join("SKILL.md").is_file() {
        Ok(dir)
    } else {
        Err(missing())
    }
}

/// A given initial state must satisfy the skill's schema and fit its state budget, as
/// state.init.json must. Every violation is one error at `/state<pointer>`; a message never
/// quotes a write-only value of the state.
pub fn check_initial_state(skill: &Skill, state: &Value) -> Result<(), ApiError> {
    let reader = skill.schema.whole_view();
    let mut errors: Vec<FieldError> = skill
        .schema
        .violations(state)
        .iter()
        .map(|v| {
            let v = v.render(&reader);
            FieldError::new(
                "schema",
                format!("/state{}", v.pointer),
                format!("does not satisfy the skill's state schema: {}", v.message),
            )
        })
        .collect();
    let budget = skill.settings().budgets.state_tokens;
    let compact = serde_json::to_string(state).unwrap_or_default();
    if errors.is_empty() && !skillstate_core::tokens::fits_in_tokens(&compact, budget) {
        errors.push(FieldError::new(
            "state_budget",
            "/state",
            format!("the state is over the skill's state budget of {budget} tokens; give a smaller state"),
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "the initial state is not acceptable for this skill",
            errors,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CreateTaskRequest {
        CreateTaskRequest {
            skill: "warehouse".into(),
            model: "oracle".into(),
            context: ContextName::State,
            budget: None,
            input: None,
            state: None,
            environment: BTreeMap::new(),
            labels: BTreeMap::new(),
            skill_version: None,
        }
    }

    #[test]
    fn requests_are_checked_with_pointers() {
        assert!(check_request(&request()).is_empty());
        let mut bad = request();
        bad.skill = "../etc".into();
        bad.budget = Some(0);
        bad.state = Some(Value::Null);
        bad.labels.insert("a/b".into(), "x".into());
        bad.skill_version = Some("abc".into());
        let pointers: Vec<String> = check_request(&bad).into_iter().map(|e| e.pointer).collect();
        assert_eq!(
            pointers,
            [
                "/skill",
                "/budget",
                "/state",
                "/skill_version",
                "/labels/a~1b"
            ]
        );
        for pin in ["1.2.0", "abcdef", "7E6E6743E3F4"] {
            let mut ok = request();
            ok.skill_version = Some(pin.into());
            assert!(check_request(&ok).is_empty(), "{pin}");
        }
    }

    #[test]
    fn skill_names_cannot_leave_the_skills_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::create_dir_all(dir.join("ok")).unwrap();
        std::fs::write(dir.join("ok/SKILL.md"), "x").unwrap();
        assert!(skill_dir(dir, "ok").is_ok());
        for name in ["..", "../ok", "ok/..", "", "nope"] {
            let error = skill_dir(dir, name).unwrap_err();
            assert!(!error.problem().detail.contains(dir.to_str().unwrap()));
        }
    }
}
