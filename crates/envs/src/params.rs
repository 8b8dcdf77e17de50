//! Reading an environment's parameters from the `[environment]` table of skill.toml.

use serde_json::{Map, Value};
use skillstate_tools::EnvironmentError;

pub struct Params<'a> {
    kind: &'a str,
    map: &'a Map<String, Value>,
    known: Vec<&'static str>,
}

impl<'a> Params<'a> {
    pub fn new(kind: &'a str, map: &'a Map<String, Value>) -> Self {
        Self {
            kind,
            map,
            known: Vec::new(),
        }
    }

    fn error(&self, message: String) -> EnvironmentError {
        EnvironmentError::Config {
            kind: self.kind.to_owned(),
            message,
        }
    }

    pub fn u64(
        &mut self,
        key: &'static str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, EnvironmentError> {
        self.known.push(key);
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

    /// An optional free-form string (a path, a name).
    pub fn optional_text(&mut self, key: &'static str) -> Result<Option<String>, EnvironmentError> {
        self.known.push(key);
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(other) => Err(self.error(format!(
                "[environment] {key} = {other} must be a non-empty string"
            ))),
        }
    }

    pub fn string(
        &mut self,
        key: &'static str,
        default: &str,
        allowed: &[&str],
    ) -> Result<String, EnvironmentError> {
        self.known.push(key);
        match self.map.get(key) {
            None => Ok(default.to_owned()),
            Some(Value::String(s)) if allowed.contains(&s.as_str()) => Ok(s.clone()),
            Some(other) => Err(self.error(format!(
                "[environment] {key} = {other} is not one of: {}",
                allowed.join(", ")
            ))),
        }
    }

    /// Fails on keys no reader asked for, so typos do not pass silently.
    pub fn finish(self) -> Result<(), EnvironmentError> {
        for key in self.map.keys() {
            if !self.known.contains(&key.as_str()) {
                return Err(self.error(format!(
                    "unknown parameter `{key}` in [environment]; known: {}",
                    self.known.join(", ")
                )));
            }
        }
        Ok(())
    }
}
