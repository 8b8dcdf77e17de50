//! Prompt rendering. Every strategy shares the stable prefix (skill, procedure, tools, schema,
//! answer format) so provider prompt caching works, and differs only in the context it keeps
//! after it (DESIGN.md §4).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::skill::SkillDefinition;
use crate::tokens::truncate_to_tokens;
use crate::tool::ToolSpec;
use crate::validate::Rejection;

/// Which context a prompt keeps besides the stable prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ContextStrategy {
    /// SKILL.state: the current state and the latest observation only.
    #[default]
    State,
}

impl ContextStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextStrategy::State => "state",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "state" => Some(ContextStrategy::State),
            _ => None,
        }
    }

    pub const NAMES: &'static [&'static str] = &["state"];
}

/// A rendered prompt. `prefix` is identical for every step of a task; `body` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub prefix: String,
    pub body: String,
}

impl Prompt {
    pub fn text(&self) -> String {
        format!("{}{}", self.prefix, self.body)
    }
}

/// Everything a prompt may draw on at one step.
pub struct PromptInput<'a> {
    pub skill: &'a SkillDefinition,
    /// The tools in presentation order, control actions included.
    pub tools: &'a [ToolSpec],
    /// Pointers the model must never patch.
    pub read_only: &'a [String],
    pub state: &'a Value,
    pub observation: &'a str,
    /// Observation budget in tokens; longer observations are cut with a marker.
    pub observation_budget: usize,
    /// Errors from rejected attempts at this step, newest attempt only.
    pub retry: &'a [Rejection],
}

pub fn render(strategy: ContextStrategy, input: &PromptInput<'_>) -> Prompt {
    let prefix = stable_prefix(input);
    let mut body = String::new();
    match strategy {
        ContextStrategy::State => {
            body.push_str("# Current state\n");
            body.push_str(&serde_json::to_string(input.state).unwrap_or_default());
            body.push_str("\n\n");
            push_observation(&mut body, input);
        }
    }
    push_retry(&mut body, input.retry);
    Prompt { prefix, body }
}

fn stable_prefix(input: &PromptInput<'_>) -> String {
    let skill = input.skill;
    let mut out = String::new();
    out.push_str(&format!(
        "You are executing the skill \"{}\": {}\n\n# Procedure\n{}\n\n",
        skill.name,
        skill.description.trim(),
        skill.procedure.trim()
    ));
    out.push_str(
        "# Tools\nEach step calls exactly one of these as {\"tool\": NAME, \"args\": {...}}.\n",
    );
    for tool in input.tools {
        out.push_str(&format!(
            "- {}: {}\n  args schema: {}\n",
            tool.name,
            tool.description.trim(),
            serde_json::to_string(&tool.input_schema).unwrap_or_default()
        ));
    }
    out.push_str(
        "\n# State\nThe state is a JSON document that must always satisfy this JSON Schema:\n",
    );
    out.push_str(&serde_json::to_string(&skill.schema).unwrap_or_default());
    out.push('\n');
    if !input.read_only.is_empty() {
        out.push_str(&format!(
            "Read-only, never change: {}\n",
            input.read_only.join(", ")
        ));
    }
    out.push_str(ANSWER_FORMAT);
    out
}

const ANSWER_FORMAT: &str = "\n# Answer format\nReply with exactly one JSON object and nothing else:\n{\"reasoning\": \"<brief>\", \"state_patch\": {...}, \"action\": {\"tool\": \"<name>\", \"args\": {...}}}\n- state_patch is a JSON Merge Patch (RFC 7396) on the current state: objects merge, null deletes a key, {} changes nothing. A JSON array of RFC 6902 operations is also accepted.\n- Patch the state so that it records everything the procedure needs to know from now on, including the effect of this step's action.\n- action calls one tool from the list above.\n\n";

fn push_observation(body: &mut String, input: &PromptInput<'_>) {
    body.push_str("# Latest observation\n");
    body.push_str(&fit_observation(
        input.observation,
        input.observation_budget,
    ));
    body.push('\n');
}

fn push_retry(body: &mut String, retry: &[Rejection]) {
    if retry.is_empty() {
        return;
    }
    body.push_str("\n# Your previous answer was rejected\nThe state was not changed. Fix these problems and answer again:\n");
    for rejection in retry {
        body.push_str(&format!("- {rejection}\n"));
    }
}

/// Cuts an observation to `budget` tokens, with a visible marker when anything was removed.
pub fn fit_observation(observation: &str, budget: usize) -> String {
    let (kept, total) = truncate_to_tokens(observation, budget);
    if kept.len() == observation.len() {
        return kept;
    }
    format!(
        "{kept}\n[observation truncated: first {budget} of {total} tokens shown; the full text is kept in the journal]"
    )
}
