//! The repository oracle: rebuilds what it knows about each branch (file, CI status, PR number,
//! open review) from the prompt text alone, then takes the most useful next step.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::view::{PromptView, history_lines, read_prompt, relevant_lines};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Branch {
    file: String,
    ci: String,
    pr: Option<u64>,
    review: bool,
}

type Belief = BTreeMap<String, Branch>;

pub fn answer(prompt: &str) -> String {
    let view = read_prompt(prompt);
    let base = starting_belief(&view);
    let mut belief = base.clone();
    for line in relevant_lines(view.latest) {
        apply_fact(line, &mut belief);
    }
    let (reasoning, tool, args) = decide(&mut belief);
    json!({
        "reasoning": reasoning,
        "state_patch": {"branches": diff(&base, &belief)},
        "action": {"tool": tool, "args": args},
    })
    .to_string()
}

fn starting_belief(view: &PromptView<'_>) -> Belief {
    if let Some(state) = &view.state {
        return state
            .get("branches")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(name, b)| {
                        (
                            name.clone(),
                            Branch {
                                file: b["file"].as_str().unwrap_or_default().to_owned(),
                                ci: b["ci"].as_str().unwrap_or("none").to_owned(),
                                pr: b["pr"].as_u64(),
                                review: b["review"].as_bool().unwrap_or(false),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
    }
    let mut belief = Belief::new();
    for line in history_lines(view) {
        apply_fact(line, &mut belief);
    }
    belief
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map(|w| w.trim_end_matches(['.', ',', ';', ':']))
        .collect()
}

fn pr_number(word: &str) -> Option<u64> {
    word.strip_prefix('#')?.parse().ok()
}

fn apply_fact(line: &str, belief: &mut Belief) {
    let w = words(line);
    let set_ci = |belief: &mut Belief, branch: &str, ci: &str| {
        if let Some(b) = belief.get_mut(branch) {
            b.ci = ci.to_owned();
        }
    };
    match w.as_slice() {
        [
            "Issue",
            _,
            "assigned",
            "to",
            "you",
            ..,
            "Work",
            "on",
            "branch",
            branch,
            "file",
            file,
        ] => {
            belief.entry((*branch).to_owned()).or_insert(Branch {
                file: (*file).to_owned(),
                ci: "none".into(),
                pr: None,
                review: false,
            });
        }
        ["Success", "committed", _file, "to", branch, "CI", "started"] => {
            set_ci(belief, branch, "pending");
            if let Some(b) = belief.get_mut(*branch) {
                b.review = false;
            }
        }
        ["Success", "pushed", "a", "CI", "fix", "to", branch, ..] => {
            set_ci(belief, branch, "pending")
        }
        ["CI", "Pipeline", "Passed", "for", branch] => set_ci(belief, branch, "passed"),
        ["CI", "Pipeline", "Failed", "for", branch, ..] => set_ci(belief, branch, "failed"),
        ["Success", "opened", "PR", pr, "for", branch]
        | ["Error", branch, "already", "has", "PR", pr, ..] => {
            if let (Some(b), Some(n)) = (belief.get_mut(*branch), pr_number(pr)) {
                b.pr = Some(n);
            }
        }
        ["Review", "on", "PR", pr, ..] => {
            let n = pr_number(pr);
            if let Some(b) = belief.values_mut().find(|b| b.pr.is_some() && b.pr == n) {
                b.review = true;
            }
        }
        ["Success", "merged", "PR", pr, ..] | ["Merged", "PR", pr, ..] => {
            let n = pr_number(pr);
            belief.retain(|_, b| b.pr.is_none() || b.pr != n);
        }
        _ => {}
    }
}

/// The most useful next action on what the oracle knows, in order: merge what is ready,
/// answer reviews, fix failing CI, open PRs for green branches, start new work.
fn decide(belief: &mut Belief) -> (String, &'static str, Value) {
    let find = |belief: &Belief, pred: &dyn Fn(&Branch) -> bool| {
        belief.iter().find(|(_, b)| pred(b)).map(|(n, _)| n.clone())
    };
    if let Some(name) = find(belief, &|b| b.pr.is_some() && b.ci == "passed" && !b.review) {
        let pr = belief.get(&name).and_then(|b| b.pr).unwrap_or(0);
        belief.remove(&name);
        return (
            format!("PR #{pr} for {name} is green with no open review."),
            "merge",
            json!({"pr": pr}),
        );
    }
    if let Some(name) = find(belief, &|b| b.review) {
        let branch = belief.get_mut(&name).map(|b| {
            b.review = false;
            b.ci = "pending".into();
            b.file.clone()
        });
        let file = branch.unwrap_or_default();
        return (
            format!("Answer the review on {name}."),
            "commit",
            json!({"branch": name, "file": file}),
        );
    }
    if let Some(name) = find(belief, &|b| b.ci == "failed") {
        if let Some(b) = belief.get_mut(&name) {
            b.ci = "pending".into();
        }
        return (
            format!("CI failed on {name}."),
            "fix_ci",
            json!({"branch": name}),
        );
    }
    if let Some(name) = find(belief, &|b| b.ci == "passed" && b.pr.is_none()) {
        return (
            format!("{name} is green; open its PR."),
            "create_pr",
            json!({"branch": name}),
        );
    }
    if let Some(name) = find(belief, &|b| b.ci == "none") {
        let file = belief.get_mut(&name).map(|b| {
            b.ci = "pending".into();
            b.file.clone()
        });
        return (
            format!("Start work on {name}."),
            "commit",
            json!({"branch": name, "file": file.unwrap_or_default()}),
        );
    }
    ("Waiting for CI or new issues.".into(), "wait", json!({}))
}

fn branch_json(b: &Branch) -> Value {
    let mut object = json!({"file": b.file, "ci": b.ci, "review": b.review});
    if let Some(pr) = b.pr {
        object["pr"] = json!(pr);
    }
    object
}

fn diff(before: &Belief, after: &Belief) -> Map<String, Value> {
    let mut patch = Map::new();
    for name in before.keys().filter(|n| !after.contains_key(*n)) {
        patch.insert(name.clone(), Value::Null);
    }
    for (name, branch) in after {
        if before.get(name) != Some(branch) {
            patch.insert(name.clone(), branch_json(branch));
        }
    }
    patch
}
