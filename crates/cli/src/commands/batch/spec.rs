//! `batch.yaml`: what a batch runs (skill, model, inputs), where its results go, and how its
//! tasks are run (concurrency, retries, errors, a shared rate limit). Unknown keys and values
//! out of range are errors naming the file, the line and the key; relative paths are resolved
//! against the batch file's directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_core::ContextStrategy;
use skillstate_store::{OnError, RateLimit};

/// Tasks one process runs at once when the file does not say.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The most tasks one process runs at once.
pub const MAX_CONCURRENCY: u64 = 4096;

/// `value` of setting `key` when it lies in `min..=max`; otherwise the message says the range.
pub fn in_range(key: &str, value: i128, min: u64, max: u64) -> Result<u64, String> {
    if value < i128::from(min) || value > i128::from(max) {
        return Err(format!(
            "{key}: {value} is out of range; use a whole number from {min} to {max}"
        ));
    }
    Ok(value as u64)
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    skill: PathBuf,
    model: String,
    inputs: PathBuf,
    #[serde(default)]
    output_dir: Option<PathBuf>,
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    concurrency: Option<i128>,
    #[serde(default)]
    max_retry: Option<i128>,
    #[serde(default)]
    on_error: Option<OnError>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    budget: Option<i128>,
    #[serde(default)]
    work_roots: Vec<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    requests_per_minute: Option<i128>,
    #[serde(default)]
    tokens_per_minute: Option<i128>,
}

/// A parsed batch file, paths made absolute. Stored with the batch (as JSON), so that status,
/// reports and `batch resume` know it without the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSpec {
    /// The batch file, absolute.
    pub file: PathBuf,
    pub skill: PathBuf,
    /// The model spec; a `scripted:` path is absolute.
    pub model: String,
    pub inputs: PathBuf,
    pub output_dir: Option<PathBuf>,
    /// The database named by `store:`, a path made absolute or a URL as written.
    pub store: Option<String>,
    pub concurrency: usize,
    pub max_retry: u32,
    pub on_error: OnError,
    pub rate_limit: RateLimit,
    pub context: ContextStrategy,
    pub budget: Option<usize>,
    /// Directories under which the skill's absolute `[tools] work_dir` may lie (the batch
    /// file is the operator's, as skillstate.toml is), made absolute.
    #[serde(default)]
    pub work_roots: Vec<PathBuf>,
}

impl BatchSpec {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the batch file {}", path.display()))?;
        let file = std::path::absolute(path)
            .with_context(|| format!("cannot resolve {}", path.display()))?;
        Self::parse(&text, &file)
    }

    /// Parses batch file text; `file` (absolute) names it in errors and anchors relative paths.
    pub fn parse(text: &str, file: &Path) -> Result<Self> {
        let shown = file.display();
        let raw: RawSpec = yaml_serde::from_str(text).map_err(|e| located(&shown, &e))?;
        let base = file.parent().unwrap_or(Path::new("/"));
        let resolve = |path: &Path| clean(&base.join(path));
        let context = match &raw.context {
            None => ContextStrategy::default(),
            Some(name) => ContextStrategy::parse(name).with_context(|| {
                format!(
                    "{shown}:{}: context: unknown strategy `{name}`; use one of: {}",
                    line_of(text, &["context"]),
                    ContextStrategy::NAMES.join(", ")
                )
            })?,
        };
        if raw.model.trim().is_empty() {
            bail!(
                "{shown}:{}: model: give a model spec (oracle, scripted:<file.jsonl>, openai:<model>, anthropic:<model>)",
                line_of(text, &["model"])
            );
        }
        let model = match raw.model.strip_prefix("scripted:") {
            Some(script) => format!("scripted:{}", resolve(Path::new(script)).display()),
            None => raw.model.clone(),
        };
        let store = raw.store.as_deref().map(|store| {
            if is_url(store) {
                store.to_owned()
            } else {
                resolve(Path::new(store)).display().to_string()
            }
        });
        let ranged = |path: &[&str], value: Option<i128>, min: u64, max: u64| {
            value
                .map(|v| in_range(&path.join("."), v, min, max))
                .transpose()
                .map_err(|message| anyhow::anyhow!("{shown}:{}: {message}", line_of(text, path)))
        };
        let concurrency = ranged(&["concurrency"], raw.concurrency, 1, MAX_CONCURRENCY)?;
        let max_retry = ranged(&["max_retry"], raw.max_retry, 0, 100)?;
        let budget = ranged(&["budget"], raw.budget, 1, 10_000_000)?;
        let (rpm, tpm) = match &raw.rate_limit {
            Some(r) => (
                ranged(
                    &["rate_limit", "requests_per_minute"],
                    r.requests_per_minute,
                    1,
                    10_000_000,
                )?,
                ranged(
                    &["rate_limit", "tokens_per_minute"],
                    r.tokens_per_minute,
                    1,
                    1_000_000_000_000,
                )?,
            ),
            None => (None, None),
        };
        let rate_limit = RateLimit {
            requests_per_minute: rpm.map(|n| n as u32),
            tokens_per_minute: tpm,
        };
        Ok(Self {
            file: file.to_path_buf(),
            skill: resolve(&raw.skill),
            model,
            inputs: resolve(&raw.inputs),
            output_dir: raw.output_dir.as_deref().map(resolve),
            store,
            concurrency: concurrency
                .map(|n| n as usize)
                .unwrap_or(DEFAULT_CONCURRENCY),
            max_retry: max_retry.map(|n| n as u32).unwrap_or(0),
            on_error: raw.on_error.unwrap_or_default(),
            rate_limit,
            context,
            budget: budget.map(|n| n as usize),
            work_roots: raw.work_roots.iter().map(|p| resolve(p)).collect(),
        })
    }

    /// The batch's name for people: the file's name.
    pub fn name(&self) -> String {
        self.file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.file.display().to_string())
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The spec stored with a batch; `None` for a batch submitted some other way.
    pub fn from_value(value: &Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }
}

/// `path` without `.` components and with each `dir/..` pair removed (lexically).
fn clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `postgres://…`, `sqlite:…`: locations that are not plain file paths.
fn is_url(location: &str) -> bool {
    location.starts_with("postgres://")
        || location.starts_with("postgresql://")
        || location.starts_with("sqlite:")
}

/// `file:line: message` from a YAML error (the parser's own "at line L column C" dropped).
fn located(file: &impl std::fmt::Display, error: &yaml_serde::Error) -> anyhow::Error {
    let message = error.to_string();
    match error.location() {
        Some(location) => {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            let message = message.strip_suffix(&suffix).unwrap_or(&message);
            anyhow::anyhow!("{file}:{}: {message}", location.line())
        }
        None => anyhow::anyhow!("{file}: {message}"),
    }
}

/// The 1-based line of `key:` at `path` (top-level key, then the first later line naming the
/// nested one, which also finds flow mappings such as `rate_limit: {requests_per_minute: 5}`);
/// 1 when not found.
fn line_of(text: &str, path: &[&str]) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let names = |line: &str, key: &str| {
        line.match_indices(key).any(|(at, _)| {
            let before = line[..at].chars().last();
            before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                && line[at + key.len()..].trim_start().starts_with(':')
        })
    };
    let mut from = 0;
    for (depth, key) in path.iter().enumerate() {
        let found = lines.iter().enumerate().skip(from).find(|(_, line)| {
            if depth == 0 {
                line.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with(':'))
            } else {
                names(line, key)
            }
        });
        match found {
            Some((index, _)) => from = index,
            None => return from + 1,
        }
    }
    from + 1
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(text: &str) -> Result<BatchSpec> {
        BatchSpec::parse(text, Path::new("/data/jobs/batch.yaml"))
    }

    #[test]
    fn every_key_parses_and_paths_resolve_against_the_file() {
        let spec = parse(
            "skill: ../skills/warehouse\nmodel: scripted:answers.jsonl\ninputs: ./in\noutput_dir: out\n\
             store: batch.db\nconcurrency: 32\nmax_retry: 2\non_error: stop\n\
             rate_limit: {requests_per_minute: 500, tokens_per_minute: 200000}\ncontext: window\nbudget: 2000\n",
        )
        .unwrap();
        assert_eq!(spec.skill, Path::new("/data/skills/warehouse"));
        assert_eq!(spec.model, "scripted:/data/jobs/answers.jsonl");
        assert_eq!(spec.inputs, Path::new("/data/jobs/in"));
        assert_eq!(
            spec.output_dir.as_deref(),
            Some(Path::new("/data/jobs/out"))
        );
        assert_eq!(spec.store.as_deref(), Some("/data/jobs/batch.db"));
        assert_eq!(spec.concurrency, 32);
        assert_eq!(spec.max_retry, 2);
        assert_eq!(spec.on_error, OnError::Stop);
        assert_eq!(spec.rate_limit.requests_per_minute, Some(500));
        assert_eq!(spec.rate_limit.tokens_per_minute, Some(200_000));
        assert_eq!(spec.context, ContextStrategy::Window);
        assert_eq!(spec.budget, Some(2000));
        assert_eq!(BatchSpec::from_value(&spec.to_value()), Some(spec));
    }

    #[test]
    fn defaults_and_urls() {
        let spec =
            parse("skill: s\nmodel: oracle\ninputs: in.jsonl\nstore: postgres://u@h/db\n").unwrap();
        assert_eq!(spec.store.as_deref(), Some("postgres://u@h/db"));
        assert_eq!(spec.concurrency, DEFAULT_CONCURRENCY);
        assert_eq!(spec.max_retry, 0);
        assert_eq!(spec.on_error, OnError::SkipAndLog);
        assert!(spec.rate_limit.is_unlimited());
        assert_eq!(spec.output_dir, None);
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let error = parse("skill: s\nmodel: oracle\ninputs: in\nconcurency: 3\n")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("/data/jobs/batch.yaml:4: "), "{error}");
        assert!(error.contains("unknown field `concurency`"), "{error}");
        let error = parse("skill: s\nmodel: oracle\ninputs: in\nconcurrency: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("/data/jobs/batch.yaml:4: concurrency: 0 is out of range"),
            "{error}"
        );
        let error =
            parse("skill: s\nmodel: oracle\ninputs: in\nrate_limit:\n  requests_per_minute: -5\n")
                .unwrap_err()
                .to_string();
        assert!(
            error.starts_with(
                "/data/jobs/batch.yaml:5: rate_limit.requests_per_minute: -5 is out of range"
            ),
            "{error}"
        );
        let error = parse("skill: s\nmodel: oracle\ninputs: in\non_error: retry\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("/data/jobs/batch.yaml:4: on_error: unknown variant `retry`"),
            "{error}"
        );
        let error = parse("skill: s\ninputs: in\n").unwrap_err().to_string();
        assert!(error.contains("missing field `model`"), "{error}");
        let error = parse("skill: s\nmodel: oracle\ninputs: in\ncontext: everything\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("/data/jobs/batch.yaml:4: context: unknown strategy"),
            "{error}"
        );
    }
}
