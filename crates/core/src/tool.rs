//! What the model may call: tool descriptions, side-effect classes, and the built-in control
//! actions. Executing tools is not the core's business; describing and checking calls is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How much harm running a tool twice can do. Decides what resume may re-run (the crash rules
/// of docs/concepts.md, "How a step works").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideEffect {
    /// Observes only; safe to run any number of times.
    ReadOnly,
    /// Changes the world, but a repeat with the same idempotency key changes nothing more.
    Idempotent,
    /// Changes the world; never re-run without knowing the first run's outcome.
    Effectful,
}

impl SideEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::ReadOnly => "read_only",
            SideEffect::Idempotent => "idempotent",
            SideEffect::Effectful => "effectful",
        }
    }
}

/// A tool as the model and the validator see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub side_effect: SideEffect,
    /// Which tool set or server provides it (`warehouse`, `fs`, an MCP server name, ...).
    pub source: String,
    /// A human must approve each call before it runs (the approval policy said so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_approval: bool,
}

/// Control actions every skill has; they are handled by the runtime, not by a tool.
pub const FINISH: &str = "finish";
pub const ASK_USER: &str = "ask_user";

pub fn control_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: FINISH.into(),
            description: "End the task. Use only when the procedure says the task is complete."
                .into(),
            input_schema: json!({"type": "object", "properties": {"result": {}}, "additionalProperties": false}),
            side_effect: SideEffect::ReadOnly,
            source: "runtime".into(),
            needs_approval: false,
        },
        ToolSpec {
            name: ASK_USER.into(),
            description:
                "Pause and ask the user a question; the answer arrives as the next observation."
                    .into(),
            input_schema: json!({
                "type": "object",
                "properties": {"question": {"type": "string", "minLength": 1}},
                "required": ["question"],
                "additionalProperties": false
            }),
            side_effect: SideEffect::ReadOnly,
            source: "runtime".into(),
            needs_approval: false,
        },
    ]
}

/// The tools offered to the model in one task, with compiled argument validators.
pub struct ToolCatalog {
    specs: Vec<ToolSpec>,
    validators: BTreeMap<String, jsonschema::Validator>,
}

/// Why a catalog cannot be built from a list of tool specs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("tool `{0}` is defined twice; tool names must be unique within a task")]
    Duplicate(String),
    #[error(
        "tool `{0}` clashes with the built-in control action of the same name; rename the tool"
    )]
    Reserved(String),
    #[error("tool `{name}` has an input schema that is not valid JSON Schema: {message}")]
    BadSchema { name: String, message: String },
}

/// A checked argument problem, located by JSON pointer into the args object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgProblem {
    pub pointer: String,
    pub message: String,
}

impl ToolCatalog {
    /// Builds a catalog of `tools` plus the control actions.
    pub fn new(tools: Vec<ToolSpec>) -> Result<Self, CatalogError> {
        let mut specs = Vec::with_capacity(tools.len() + 2);
        let mut validators = BTreeMap::new();
        for spec in tools.into_iter().chain(control_specs()) {
            if validators.contains_key(&spec.name) {
                return Err(if spec.source == "runtime" {
                    CatalogError::Reserved(spec.name)
                } else {
                    CatalogError::Duplicate(spec.name)
                });
            }
            let validator = jsonschema::draft202012::new(&spec.input_schema).map_err(|e| {
                CatalogError::BadSchema {
                    name: spec.name.clone(),
                    message: e.to_string(),
                }
            })?;
            validators.insert(spec.name.clone(), validator);
            specs.push(spec);
        }
        Ok(Self { specs, validators })
    }

    /// Tools in presentation order: the skill's tools first, control actions last.
    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// Validates `args` for tool `name`. `None` means no such tool.
    pub fn check_args(&self, name: &str, args: &Value) -> Option<Vec<ArgProblem>> {
        let validator = self.validators.get(name)?;
        Some(
            validator
                .iter_errors(args)
                .map(|e| ArgProblem {
                    pointer: e.instance_path().to_string(),
                    message: e.to_string(),
                })
                .collect(),
        )
    }

    pub fn names(&self) -> Vec<&str> {
        self.specs.iter().map(|s| s.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ship() -> ToolSpec {
        ToolSpec {
            name: "ship".into(),
            description: "Ship an item".into(),
            input_schema: json!({"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}),
            side_effect: SideEffect::Effectful,
            source: "warehouse".into(),
            needs_approval: false,
        }
    }

    #[test]
    fn catalog_checks_args_and_names() {
        let catalog = ToolCatalog::new(vec![ship()]).unwrap();
        assert_eq!(catalog.names(), vec!["ship", "finish", "ask_user"]);
        assert!(
            catalog
                .check_args("ship", &json!({"item": "item_1"}))
                .unwrap()
                .is_empty()
        );
        let problems = catalog.check_args("ship", &json!({"item": 3})).unwrap();
        assert_eq!(problems[0].pointer, "/item");
        assert!(catalog.check_args("teleport", &json!({})).is_none());
    }

    #[test]
    fn catalog_refuses_duplicates_and_reserved_names() {
        assert_eq!(
            ToolCatalog::new(vec![ship(), ship()]).err(),
            Some(CatalogError::Duplicate("ship".into()))
        );
        let mut finish = ship();
        finish.name = FINISH.into();
        assert_eq!(
            ToolCatalog::new(vec![finish]).err(),
            Some(CatalogError::Reserved("finish".into()))
        );
    }
}
