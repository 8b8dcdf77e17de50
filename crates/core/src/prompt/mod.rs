//! Prompt rendering. Every strategy shares the stable prefix (skill, procedure, tools, schema,
//! answer format) so provider prompt caching works, and differs only in the context it keeps
//! after it (docs/concepts.md, "Context strategies").

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::skill::SkillDefinition;
use crate::tokens::{count_tokens, fits_in_tokens, truncate_to_tokens};
use crate::tool::ToolSpec;
use crate::validate::Rejection;

/// Which context a prompt keeps besides the stable prefix (docs/concepts.md, "Context strategies").
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "snake_case")]
pub enum ContextStrategy {
    /// SKILL.state: the current state and the latest observation only.
    #[default]
    State,
    /// ReAct: every earlier (observation, answer) pair, then the latest observation.
    History,
    /// A rolling one-line-per-step summary of older steps, the last 3 steps in full.
    Summary,
    /// LangGraph-style: the state as indented JSON plus the full transcript.
    Stateful,
    /// The most recent steps that fit the context budget.
    Window,
}

/// Steps the `summary` strategy shows in full.
pub const SUMMARY_RECENT_TURNS: usize = 3;
/// Context budget of the `window` strategy when none is given, in tokens.
pub const DEFAULT_WINDOW_BUDGET: usize = 1800;

impl ContextStrategy {
    pub const ALL: [ContextStrategy; 5] = [
        ContextStrategy::State,
        ContextStrategy::History,
        ContextStrategy::Summary,
        ContextStrategy::Stateful,
        ContextStrategy::Window,
    ];
    pub const NAMES: &'static [&'static str] =
        &["state", "history", "summary", "stateful", "window"];

    pub fn as_str(self) -> &'static str {
        match self {
            ContextStrategy::State => "state",
            ContextStrategy::History => "history",
            ContextStrategy::Summary => "summary",
            ContextStrategy::Stateful => "stateful",
            ContextStrategy::Window => "window",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether the prompt shows earlier steps (and so needs them to be rendered).
    pub fn uses_turns(self) -> bool {
        !matches!(self, ContextStrategy::State)
    }
}

/// One earlier accepted step, as transcript strategies show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub step: u64,
    /// The observation the step started from.
    pub observation: String,
    /// The model's accepted answer, verbatim.
    pub answer: String,
    /// Short form of the action (`ship(item=item_1, shelf=shelf_4)`).
    pub action: String,
    /// What the action's tool returned, when it ran.
    pub result: Option<String>,
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
    /// Earlier accepted steps, oldest first (ignored by `state`).
    pub turns: &'a [Turn],
    /// Token budget for the whole prompt: `window` keeps the recent steps that fit it (default
    /// `DEFAULT_WINDOW_BUDGET`), `summary` drops its oldest lines to fit it (uncapped if `None`).
    pub context_budget: Option<usize>,
}

pub fn render(strategy: ContextStrategy, input: &PromptInput<'_>) -> Prompt {
    let prefix = stable_prefix(input);
    let mut tail = String::new();
    push_observation(&mut tail, input);
    push_retry(&mut tail, input.retry);
    let body = match strategy {
        ContextStrategy::State => format!("# Current state\n{}\n\n{tail}", compact(input.state)),
        ContextStrategy::History => format!(
            "{}{tail}",
            transcript("# Earlier steps\n", input.turns, input)
        ),
        ContextStrategy::Stateful => format!(
            "# Current state\n{}\n\n{}{tail}",
            serde_json::to_string_pretty(input.state).unwrap_or_default(),
            transcript("# Earlier steps\n", input.turns, input)
        ),
        ContextStrategy::Summary => summary_body(&prefix, &tail, input),
        ContextStrategy::Window => window_body(&prefix, &tail, input),
    };
    Prompt { prefix, body }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn render_turn(turn: &Turn, input: &PromptInput<'_>) -> String {
    format!(
        "## Step {}\nObservation:\n{}\nAnswer:\n{}\n\n",
        turn.step,
        fit_observation(&turn.observation, input.observation_budget),
        turn.answer.trim()
    )
}

fn transcript(header: &str, turns: &[Turn], input: &PromptInput<'_>) -> String {
    if turns.is_empty() {
        return String::new();
    }
    let mut out = String::from(header);
    for turn in turns {
        out.push_str(&render_turn(turn, input));
    }
    out
}

/// The alert part of an observation: what follows the previous action's result.
fn alert_of<'t>(turn: &'t Turn, previous: Option<&Turn>) -> &'t str {
    let observation = turn.observation.as_str();
    match previous.and_then(|p| p.result.as_deref()) {
        Some(result) => observation
            .strip_prefix(result)
            .unwrap_or(observation)
            .trim_start(),
        None => observation,
    }
}

fn first_line(text: &str) -> &str {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// Longest alert text a summary line keeps.
const SUMMARY_ALERT_CHARS: usize = 400;

/// The alert's lines joined on one line, up to a `---` separator (which starts attached
/// material such as telemetry), at most `SUMMARY_ALERT_CHARS` characters. The alert is an
/// observation, already redacted (`outside::Outside` in the runtime).
fn condensed(alert: &str) -> String {
    let joined = alert
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("---"))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" / ");
    if joined.chars().count() <= SUMMARY_ALERT_CHARS {
        return joined;
    }
    let cut: String = joined.chars().take(SUMMARY_ALERT_CHARS).collect();
    format!("{cut}…")
}

/// One line per older step: its alert, the action, and the first line of the action's result.
fn summary_line(turn: &Turn, previous: Option<&Turn>) -> String {
    let result = turn
        .result
        .as_deref()
        .map(first_line)
        .unwrap_or("no result");
    format!(
        "- step {}: {} => {} -> {}\n",
        turn.step,
        condensed(alert_of(turn, previous)),
        turn.action,
        result
    )
}

fn summary_body(prefix: &str, tail: &str, input: &PromptInput<'_>) -> String {
    let turns = input.turns;
    let split = turns.len().saturating_sub(SUMMARY_RECENT_TURNS);
    let recent = transcript("# Recent steps\n", &turns[split..], input);
    let lines: Vec<String> = (0..split)
        .map(|i| summary_line(&turns[i], i.checked_sub(1).map(|p| &turns[p])))
        .collect();
    let header = "# Summary of earlier steps\n";
    let kept = match input.context_budget {
        None => lines.len(),
        Some(budget) => {
            let fixed = count_tokens(prefix)
                + count_tokens(&recent)
                + count_tokens(tail)
                + count_tokens(header)
                + 16;
            newest_that_fit(
                lines.iter().map(String::as_str),
                budget.saturating_sub(fixed),
            )
        }
    };
    let mut out = String::new();
    if !lines.is_empty() {
        out.push_str(header);
        let dropped = lines.len() - kept;
        if dropped > 0 {
            out.push_str(&format!(
                "({dropped} older steps dropped to fit the context budget)\n"
            ));
        }
        for line in &lines[dropped..] {
            out.push_str(line);
        }
        out.push('\n');
    }
    out.push_str(&recent);
    out.push_str(tail);
    out
}

fn window_body(prefix: &str, tail: &str, input: &PromptInput<'_>) -> String {
    let budget = input.context_budget.unwrap_or(DEFAULT_WINDOW_BUDGET);
    let header = "# Recent steps (older steps are not shown)\n";
    let rendered: Vec<String> = input.turns.iter().map(|t| render_turn(t, input)).collect();
    let fixed = count_tokens(prefix) + count_tokens(tail) + count_tokens(header);
    let kept = newest_that_fit(
        rendered.iter().map(String::as_str),
        budget.saturating_sub(fixed),
    );
    let mut out = String::new();
    if kept > 0 {
        out.push_str(header);
        for turn in &rendered[rendered.len() - kept..] {
            out.push_str(turn);
        }
    }
    out.push_str(tail);
    out
}

/// How many of the last `pieces` fit together in `budget` tokens, newest first.
fn newest_that_fit<'p>(pieces: impl DoubleEndedIterator<Item = &'p str>, budget: usize) -> usize {
    let mut used = 0;
    let mut kept = 0;
    for piece in pieces.rev() {
        used += count_tokens(piece);
        if used > budget {
            break;
        }
        kept += 1;
    }
    kept
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
    if fits_in_tokens(observation, budget) {
        return observation.to_owned();
    }
    let (kept, total) = truncate_to_tokens(observation, budget);
    if kept.len() == observation.len() {
        return kept;
    }
    format!(
        "{kept}\n[observation truncated: first {budget} of {total} tokens shown; the full text is kept in the journal]"
    )
}
