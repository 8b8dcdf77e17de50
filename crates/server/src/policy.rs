//! What an API caller may name on the server: the one place where every create-request field
//! that names something on the server (a skill, a model spec, an environment setting that is a
//! path) is resolved against what the operator configured, before any [`TaskFactory`] sees the
//! request. A factory receives a [`ResolvedRequest`], which only [`ServicePolicy::resolve`]
//! makes, so it cannot be handed a raw name or path.
//!
//! - skill: a plain name, a direct child of the skills directory holding SKILL.md;
//! - model: on the operator's allow-list (exact specs, or `prefix*` patterns such as
//!   `openai:*`). `scripted:<file>` reads a file on the server: refused unless the operator
//!   named that exact spec, or turned scripted models on for a directory, and then the name is
//!   resolved inside that directory only (a relative path of plain components, no symbolic
//!   link on the way, a regular file);
//! - environment: settings that take a path (`audit_log`) are the operator's (skill.toml).
//!
//! Refusals are 422 with the field's pointer, and never tell whether a path exists: a missing
//! file, a directory and an unreadable one give the same message.
//!
//! [`TaskFactory`]: crate::TaskFactory

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::factory::{ContextName, CreateTaskRequest, check_request, skill_dir};
use crate::problem::{ApiError, FieldError};

/// The prefix of model specs that read a local file.
pub const SCRIPTED_PREFIX: &str = "scripted:";

/// Longest model spec accepted.
pub const MAX_MODEL_SPEC: usize = 256;

/// The operator's rules for what requests may name. Built once when the service starts.
#[derive(Debug, Clone)]
pub struct ServicePolicy {
    skills_dir: Option<PathBuf>,
    models: Vec<String>,
    scripted_dir: Option<PathBuf>,
    operator_only_environment: Vec<String>,
}

impl Default for ServicePolicy {
    /// Only the `oracle` model, no scripted models, no skills directory (the factory looks
    /// skills up by their checked plain name), no operator-only environment settings.
    fn default() -> Self {
        Self {
            skills_dir: None,
            models: vec!["oracle".into()],
            scripted_dir: None,
            operator_only_environment: Vec::new(),
        }
    }
}

impl ServicePolicy {
    /// Skills are the directories of `skills_dir` (an absolute, canonical path).
    pub fn with_skills_dir(mut self, skills_dir: PathBuf) -> Self {
        self.skills_dir = Some(skills_dir);
        self
    }

    /// The model specs requests may name: exact specs, or patterns ending in `*` that allow
    /// every spec with that prefix (`openai:*`). Replaces the default (`oracle`).
    pub fn with_models(mut self, models: impl IntoIterator<Item = String>) -> Self {
        self.models = models.into_iter().collect();
        self
    }

    /// Accepts `scripted:<name>` for files inside `dir` (an absolute, canonical path).
    pub fn with_scripted_dir(mut self, dir: PathBuf) -> Self {
        self.scripted_dir = Some(dir);
        self
    }

    /// Environment settings only the operator sets (they name files on the host).
    pub fn with_operator_only_environment(
        mut self,
        keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.operator_only_environment = keys.into_iter().map(Into::into).collect();
        self
    }

    /// The allowed model patterns, as configured.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// Resolves a create request, or says what is wrong with each field (pointers relative to
    /// the request).
    pub fn resolve(&self, request: &CreateTaskRequest) -> Result<ResolvedRequest, Vec<FieldError>> {
        let mut errors = check_request(request);
        let skill_dir = match &self.skills_dir {
            Some(dir) if errors.iter().all(|e| e.pointer != "/skill") => {
                match skill_dir(dir, &request.skill) {
                    Ok(found) => Some(found),
                    Err(ApiError::Invalid { errors: found, .. }) => {
                        errors.extend(found);
                        None
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        let model = match self.resolve_model(&request.model) {
            Ok(model) => model,
            Err(error) => {
                if errors.iter().all(|e| e.pointer != "/model") {
                    errors.push(error);
                }
                String::new()
            }
        };
        for key in request.environment.keys() {
            if self.operator_only_environment.iter().any(|k| k == key) {
                errors.push(FieldError::new(
                    "operator_only",
                    format!("/environment/{}", key.replace('~', "~0").replace('/', "~1")),
                    format!(
                        "`{key}` names a file on the server: only the operator sets it, in the skill's skill.toml [environment]; leave it out of the request"
                    ),
                ));
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(ResolvedRequest {
            skill: request.skill.clone(),
            skill_dir,
            model,
            context: request.context,
            budget: request.budget,
            input: request.input.clone(),
            state: request.state.clone(),
            environment: request.environment.clone(),
            labels: request.labels.clone(),
            skill_version: request.skill_version.clone(),
        })
    }

    /// The skill a request names by `name` (at `pointer` of the request): a checked plain name,
    /// with its directory inside the skills directory when the policy has one; a 422 at
    /// `pointer` otherwise, naming no path.
    pub fn resolve_skill(&self, name: &str, pointer: &str) -> Result<ResolvedSkill, ApiError> {
        let at = |error: ApiError| match error {
            ApiError::Invalid { detail, errors } => ApiError::Invalid {
                detail,
                errors: errors
                    .into_iter()
                    .map(|mut e| {
                        e.pointer = pointer.to_owned();
                        e
                    })
                    .collect(),
            },
            other => other,
        };
        let dir = match &self.skills_dir {
            Some(dir) => Some(skill_dir(dir, name).map_err(at)?),
            None if crate::factory::is_name(name) => None,
            None => {
                return Err(at(ApiError::invalid(
                    format!("`{name}` is not a skill name"),
                    vec![FieldError::new(
                        "field",
                        pointer,
                        "use the name of a directory of the server's skills directory",
                    )],
                )));
            }
        };
        Ok(ResolvedSkill {
            name: name.to_owned(),
            dir,
        })
    }

    /// The model spec a request may use, or the error at `/model`.
    fn resolve_model(&self, spec: &str) -> Result<String, FieldError> {
        let refuse = |message: String| FieldError::new("model", "/model", message);
        if spec.len() > MAX_MODEL_SPEC || spec.chars().any(char::is_control) {
            return Err(refuse(format!(
                "a model spec is at most {MAX_MODEL_SPEC} bytes, without control characters"
            )));
        }
        if let Some(name) = spec.strip_prefix(SCRIPTED_PREFIX) {
            if self.models.iter().any(|m| m == spec) {
                return Ok(spec.to_owned());
            }
            return match &self.scripted_dir {
                None => Err(refuse(
                    "scripted models read a file on the server and are off for this service (the operator turns them on for a directory with `serve --scripted-dir DIR`)".into(),
                )),
                Some(dir) => scripted_file(dir, name)
                    .map(|path| format!("{SCRIPTED_PREFIX}{}", path.display()))
                    .ok_or_else(|| {
                        refuse(format!(
                            "no script `{name}` in this server's scripted directory: give the name of a file there, as a relative path"
                        ))
                    }),
            };
        }
        if self.models.iter().any(|pattern| matches(pattern, spec)) {
            Ok(spec.to_owned())
        } else {
            Err(refuse(format!(
                "model `{spec}` is not allowed on this server; allowed: {}",
                self.models.join(", ")
            )))
        }
    }
}

/// Whether an allow-list entry admits `spec`: equal, or `prefix*` and `spec` starts with the
/// prefix. A pattern never admits a scripted spec (those are resolved on their own).
fn matches(pattern: &str, spec: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => spec.starts_with(prefix) && !spec.starts_with(SCRIPTED_PREFIX),
        None => pattern == spec,
    }
}

/// `name` inside `dir`: a relative path of plain components, none of them a symbolic link
/// (checked with `symlink_metadata`, which never follows one out of `dir`), naming a regular
/// file. `None` for anything else, whatever the reason, so the answer tells nothing about
/// what exists.
fn scripted_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let relative = Path::new(name);
    if name.is_empty()
        || name.contains('\0')
        || !relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return None;
    }
    let mut path = dir.to_path_buf();
    let mut components = relative.components().peekable();
    while let Some(component) = components.next() {
        path.push(component);
        let metadata = std::fs::symlink_metadata(&path).ok()?;
        let last = components.peek().is_none();
        let fits = if last {
            metadata.file_type().is_file()
        } else {
            metadata.file_type().is_dir()
        };
        if !fits {
            return None;
        }
    }
    Some(path)
}

/// A create request whose every server-naming field was resolved by the [`ServicePolicy`]:
/// the only form a [`TaskFactory`](crate::TaskFactory) receives.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ResolvedRequest {
    /// The skill's name (a checked plain name).
    pub skill: String,
    /// The skill's directory inside the skills directory, when the policy has one.
    pub skill_dir: Option<PathBuf>,
    /// An allowed model spec; a scripted one names a file inside the scripted directory.
    pub model: String,
    pub context: ContextName,
    pub budget: Option<u64>,
    pub input: Option<String>,
    pub state: Option<Value>,
    /// Overrides of the skill's `[environment]`, none of them operator-only.
    pub environment: BTreeMap<String, Value>,
    pub labels: BTreeMap<String, String>,
    /// The version the task must run (checked by the server against what the factory built).
    pub skill_version: Option<String>,
}

/// A skill a request named, resolved by the [`ServicePolicy`]: what a
/// [`TaskFactory`](crate::TaskFactory) is given to build a version of a skill from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ResolvedSkill {
    /// The skill's name (a checked plain name).
    pub name: String,
    /// Its directory inside the skills directory, when the policy has one.
    pub dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(model: &str) -> CreateTaskRequest {
        CreateTaskRequest {
            skill: "warehouse".into(),
            model: model.into(),
            context: ContextName::State,
            budget: None,
            input: None,
            state: None,
            environment: BTreeMap::new(),
            labels: BTreeMap::new(),
            skill_version: None,
        }
    }

    fn pointers(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.pointer.as_str()).collect()
    }

    #[test]
    fn models_come_from_the_allow_list() {
        let policy = ServicePolicy::default().with_models(["oracle".into(), "openai:*".into()]);
        assert!(policy.resolve(&request("oracle")).is_ok());
        assert!(policy.resolve(&request("openai:gpt-4o")).is_ok());
        for refused in [
            "anthropic:x",
            "oracle2",
            "scripted:a.jsonl",
            "scripted:/etc/passwd",
        ] {
            let errors = policy.resolve(&request(refused)).unwrap_err();
            assert_eq!(pointers(&errors), ["/model"], "{refused}");
        }
        // Even a catch-all pattern does not admit file-reading specs.
        let open = ServicePolicy::default().with_models(["*".into()]);
        assert!(open.resolve(&request("scripted:/etc/passwd")).is_err());
    }

    #[test]
    fn scripted_names_stay_inside_their_directory_and_tell_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let dir = root.join("scripts");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.jsonl"), "{}\n").unwrap();
        std::fs::write(dir.join("sub/b.jsonl"), "{}\n").unwrap();
        std::fs::write(root.join("outside.jsonl"), "{}\n").unwrap();
        std::os::unix::fs::symlink(root.join("outside.jsonl"), dir.join("link.jsonl")).unwrap();
        std::os::unix::fs::symlink(&root, dir.join("up")).unwrap();
        let policy = ServicePolicy::default().with_scripted_dir(dir.clone());
        let ok = policy.resolve(&request("scripted:sub/b.jsonl")).unwrap();
        assert_eq!(
            ok.model,
            format!("scripted:{}", dir.join("sub/b.jsonl").display())
        );
        let mut messages = Vec::new();
        for name in [
            "missing.jsonl",
            "sub",
            "../outside.jsonl",
            "link.jsonl",
            "up/outside.jsonl",
            "./a.jsonl",
            "",
        ] {
            let path = root.join("outside.jsonl");
            for spec in [
                format!("scripted:{name}"),
                format!("scripted:{}", path.display()),
            ] {
                let errors = policy.resolve(&request(&spec)).unwrap_err();
                assert_eq!(pointers(&errors), ["/model"], "{spec}");
                let given = &spec[SCRIPTED_PREFIX.len()..];
                let message = errors[0].message.replace(&format!("`{given}`"), "`NAME`");
                messages.push(message);
            }
        }
        messages.sort();
        messages.dedup();
        assert_eq!(messages.len(), 1, "{messages:?}");
    }

    #[test]
    fn path_settings_are_the_operators() {
        let policy = ServicePolicy::default().with_operator_only_environment(["audit_log"]);
        let mut bad = request("oracle");
        bad.environment.insert("audit_log".into(), "/tmp/x".into());
        bad.environment.insert("events".into(), 5.into());
        let errors = policy.resolve(&bad).unwrap_err();
        assert_eq!(pointers(&errors), ["/environment/audit_log"]);
        assert!(errors[0].message.contains("skill.toml"));
    }
}
