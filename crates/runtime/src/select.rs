//! Which of the environment's tools a skill may use (`[tools] allow` in skill.toml).

use std::sync::Arc;

use skillstate_core::skill::ToolSelection;
use skillstate_tools::Tool;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "skill.toml [tools] allow lists {unknown:?}, which no available tool provides; available tools: {available}"
)]
pub struct SelectError {
    pub unknown: Vec<String>,
    pub available: String,
}

/// The tools `selection` allows, in the environment's order. Every entry of the allow list
/// must match something, so a typo is an error instead of a silently missing tool.
pub fn select_tools(
    available: &[Arc<dyn Tool>],
    selection: &ToolSelection,
) -> Result<Vec<Arc<dyn Tool>>, SelectError> {
    let unknown: Vec<String> = selection
        .allow
        .iter()
        .filter(|entry| {
            !available
                .iter()
                .any(|t| &t.spec().name == *entry || &t.spec().source == *entry)
        })
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let names: Vec<String> = available
            .iter()
            .map(|t| format!("{} (from {})", t.spec().name, t.spec().source))
            .collect();
        return Err(SelectError {
            unknown,
            available: if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
        });
    }
    Ok(available
        .iter()
        .filter(|t| selection.allows(&t.spec().name, &t.spec().source))
        .cloned()
        .collect())
}
