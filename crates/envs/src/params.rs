//! The parameters an environment takes in the `[environment]` table of skill.toml (and that a
//! create request may override), declared once per kind as a table of [`ParamSpec`]s: the
//! reader ([`Params`]) checks values against it, the service asks it which settings name a file
//! on the host ([`ParamKind::Path`], operator-only), and the property tests enumerate every
//! documented range from it.

use serde_json::{Map, Value};
use skillstate_tools::EnvironmentError;

/// What values a parameter takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A whole number in `min..=max`.
    Whole { default: u64, min: u64, max: u64 },
    /// One of `allowed`.
    OneOf {
        default: &'static str,
        allowed: &'static [&'static str],
    },
    /// Free text the caller chooses (a timestamp, a request); `examples` are valid values.
    Text { examples: &'static [&'static str] },
    /// A file on the host. Only the operator may set it (skill.toml); a create request that
    /// names one is refused by the service.
    Path,
}

/// One documented parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    pub key: &'static str,
    pub kind: ParamKind,
}

impl ParamSpec {
    pub const fn whole(key: &'static str, default: u64, min: u64, max: u64) -> Self {
        Self {
            key,
            kind: ParamKind::Whole { default, min, max },
        }
    }

    pub const fn one_of(
        key: &'static str,
        default: &'static str,
        allowed: &'static [&'static str],
    ) -> Self {
        Self {
            key,
            kind: ParamKind::OneOf { default, allowed },
        }
    }

    pub const fn text(key: &'static str, examples: &'static [&'static str]) -> Self {
        Self {
            key,
            kind: ParamKind::Text { examples },
        }
    }

    pub const fn path(key: &'static str) -> Self {
        Self {
            key,
            kind: ParamKind::Path,
        }
    }
}

pub struct Params<'a> {
    kind: &'a str,
    map: &'a Map<String, Value>,
    table: &'static [ParamSpec],
}

impl<'a> Params<'a> {
    pub fn new(kind: &'a str, table: &'static [ParamSpec], map: &'a Map<String, Value>) -> Self {
        Self { kind, map, table }
    }

    fn error(&self, message: String) -> EnvironmentError {
        EnvironmentError::Config {
            kind: self.kind.to_owned(),
            message,
        }
    }

    fn spec(&self, key: &str) -> Result<&'static ParamSpec, EnvironmentError> {
        self.table
            .iter()
            .find(|spec| spec.key == key)
            .ok_or_else(|| self.error(format!("parameter `{key}` is not declared")))
    }

    /// A whole number, with its declared default.
    pub fn u64(&self, key: &'static str) -> Result<u64, EnvironmentError> {
        let spec = self.spec(key)?;
        match spec.kind {
            ParamKind::Whole { default, .. } => self.u64_or(key, default),
            _ => Err(self.error(format!("parameter `{key}` is not a whole number"))),
        }
    }

    /// A whole number whose default depends on other parameters.
    pub fn u64_or(&self, key: &'static str, default: u64) -> Result<u64, EnvironmentError> {
        let spec = self.spec(key)?;
        let ParamKind::Whole { min, max, .. } = spec.kind else {
            return Err(self.error(format!("parameter `{key}` is not a whole number")));
        };
        match self.map.get(key) {
            None => Ok(default),
            Some(value) => match value.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(self.error(format!(
                    "[environment] {key} = {value} is out of range; use a whole number from {min} to {max}"
                ))),
            },
        }
    }

    /// An optional free-form string (text or a path).
    pub fn optional_text(&self, key: &'static str) -> Result<Option<String>, EnvironmentError> {
        self.spec(key)?;
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(other) => Err(self.error(format!(
                "[environment] {key} = {other} must be a non-empty string"
            ))),
        }
    }

    /// One of the declared names.
    pub fn string(&self, key: &'static str) -> Result<String, EnvironmentError> {
        let spec = self.spec(key)?;
        let ParamKind::OneOf { default, allowed } = spec.kind else {
            return Err(self.error(format!("parameter `{key}` is not a choice")));
        };
        match self.map.get(key) {
            None => Ok(default.to_owned()),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(s.clone()),
            Some(other) => Err(self.error(format!(
                "[environment] {key} = {other} is not one of: {}",
                allowed.join(", ")
            ))),
        }
    }

    /// Fails on keys the table does not declare, so typos do not pass silently.
    pub fn finish(self) -> Result<(), EnvironmentError> {
        for key in self.map.keys() {
            if !self.table.iter().any(|spec| spec.key == key) {
                let known: Vec<&str> = self.table.iter().map(|spec| spec.key).collect();
                return Err(self.error(format!(
                    "unknown parameter `{key}` in [environment]; known: {}",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}
