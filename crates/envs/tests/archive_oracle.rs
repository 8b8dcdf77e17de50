//! The warehouse-archive oracle on the shipped skill, step by step through the real prompt
//! renderer and the real validation pipeline, with the environment answering its actions. The
//! `recall` tool is played here by a stand-in that searches the run's own actions and answers
//! in the recall tool's documented format (the runtime's real tool is exercised by the bench
//! tests in crates/bench): this checks what the oracle can do with what a prompt shows.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use skillstate_core::prompt::{PromptInput, render};
use skillstate_core::{
    Action, ContextStrategy, SideEffect, Skill, StepRules, ToolCatalog, ToolSpec, count_tokens,
    validate_step,
};
use skillstate_envs::warehouse_archive::{ArchiveConfig, KIND, WarehouseArchive};
use skillstate_tools::{CallContext, Environment, find_tool};

fn skill_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse-archive")
}

fn recall_spec() -> ToolSpec {
    ToolSpec {
        name: "recall".into(),
        description: "Search this task's journal, newest first.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "kinds": {"type": "array", "items": {"enum": ["observation", "reasoning", "action", "state"]}},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
        side_effect: SideEffect::ReadOnly,
        source: "recall".into(),
        needs_approval: false,
    }
}

/// Lowercase words, `_` and punctuation splitting them, as the recall index splits text.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The recall tool's answer over `actions` (step, indexed text), actions only: every word
/// of the query as a phrase, newest first.
fn stand_in_recall(actions: &[(u64, String)], args: &Value) -> String {
    let query = args["query"].as_str().unwrap();
    let limit = args["limit"].as_u64().unwrap_or(5) as usize;
    let phrase = words(query);
    let matches: Vec<&(u64, String)> = actions
        .iter()
        .rev()
        .filter(|(_, text)| words(text).windows(phrase.len()).any(|w| w == phrase))
        .collect();
    if matches.is_empty() {
        return format!("Recall: no matches for \"{query}\".");
    }
    let shown = matches.len().min(limit);
    let mut out = format!(
        "Recall: {shown} of {} matches for \"{query}\", newest first.",
        matches.len()
    );
    for (step, text) in &matches[..shown] {
        out.push_str(&format!("\n[step {step} action] {text}"));
    }
    out
}

/// An action as the journal's index writes it: `<tool> <args, keys sorted, compact>`.
fn indexed(name: &str, args: &Value) -> String {
    let sorted: BTreeMap<&String, &Value> = args.as_object().unwrap().iter().collect();
    format!("{name} {}", serde_json::to_string(&sorted).unwrap())
}

struct Played {
    outcome: Value,
    steps: u64,
    recalls: u64,
    state: Value,
    max_prompt: usize,
}

async fn play(seed: u64, events: u32, with_recall: bool) -> Played {
    let skill = Skill::load(&skill_dir()).unwrap().skill;
    let mut env = WarehouseArchive::new(ArchiveConfig::new(seed, events));
    let env_tools = env.tools();
    let mut specs: Vec<ToolSpec> = env_tools.iter().map(|t| t.spec().clone()).collect();
    if with_recall {
        specs.push(recall_spec());
    }
    let catalog = ToolCatalog::new(specs).unwrap();
    let specs = catalog.specs().to_vec();
    let budget = skill.settings().budgets.clone();
    let rules = StepRules {
        schema: &skill.schema,
        catalog: &catalog,
        state_token_budget: budget.state_tokens,
    };
    let mut state = skill.definition.initial_state.clone();
    let mut observation = env.opening_observation();
    let mut actions: Vec<(u64, String)> = Vec::new();
    let (mut steps, mut recalls, mut max_prompt) = (0, 0, 0);
    while !env.episode_over() {
        steps += 1;
        assert!(steps <= 3 * u64::from(events), "the run does not end");
        let prompt = render(
            ContextStrategy::State,
            &PromptInput {
                skill: &skill.definition,
                tools: &specs,
                read_only: &[],
                state: &state,
                observation: &observation,
                observation_budget: budget.observation_tokens,
                retry: &[],
                turns: &[],
                context_budget: None,
            },
        )
        .text();
        max_prompt = max_prompt.max(count_tokens(&prompt));
        let answer = skillstate_envs::oracle::answer(KIND, &prompt).unwrap();
        let accepted = validate_step(&rules, &state, &answer)
            .unwrap_or_else(|rejected| panic!("step {steps}: {answer}\n{rejected:?}"));
        state = accepted.new_state;
        let Action::Tool { name, args } = accepted.action else {
            panic!("step {steps}: not a tool call: {answer}");
        };
        let output = if name == "recall" {
            recalls += 1;
            stand_in_recall(&actions, &args)
        } else {
            let tool = find_tool(&env_tools, &name).unwrap();
            tool.call(&args, &CallContext::new("t", steps))
                .await
                .unwrap()
                .text
        };
        actions.push((steps, indexed(&name, &args)));
        observation = match env.after_action() {
            Some(event) => format!("{output}\n{event}"),
            None => output,
        };
    }
    Played {
        outcome: env.outcome(),
        steps,
        recalls,
        state,
        max_prompt,
    }
}

#[tokio::test]
async fn with_recall_the_oracle_handles_every_event_of_a_long_run() {
    let played = play(3, 1_500, true).await;
    assert_eq!(played.outcome["score"], 1.0, "{}", played.outcome);
    let counters = &played.state["counters"];
    assert_eq!(counters["events"], 1_500);
    assert_eq!(counters["unresolved"], 0, "{}", played.state);
    assert_eq!(counters["recalls"], played.recalls);
    // Many orders and maintenance alerts needed a recall, each exactly one step more.
    assert_eq!(played.steps, 1_500 + played.recalls);
    assert!(played.recalls > 300, "{} recalls", played.recalls);
    assert_eq!(played.outcome["other_actions"], played.recalls);
    // The index stayed bounded, nothing is left pending.
    assert_eq!(played.state["recent"].as_object().unwrap().len(), 16);
    assert!(played.state.get("pending").is_none(), "{}", played.state);
    assert!(played.max_prompt < 4_000, "{} tokens", played.max_prompt);
}

#[tokio::test]
async fn without_recall_the_bounded_state_forgets_most_of_the_inventory() {
    let played = play(3, 1_500, false).await;
    let score = played.outcome["score"].as_f64().unwrap();
    assert!((0.3..0.8).contains(&score), "{}", played.outcome);
    assert_eq!(played.recalls, 0);
    assert_eq!(played.steps, 1_500);
    let unresolved = played.state["counters"]["unresolved"].as_u64().unwrap();
    assert!(unresolved > 300, "{}", played.state);
}
