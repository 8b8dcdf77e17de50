use serde_json::{Value, json};
use skillstate_tools::{CallContext, Environment, ToolOutput, find_tool};

use super::codebase::{Codebase, TEMPLATES};
use super::coder::Coder;
use super::reviewer::Reviewer;
use super::*;

const BOARD_INIT: &str = include_str!("../../../../boards/bugfix/state.init.json");

async fn call(env: &dyn Environment, tool: &str, args: Value) -> ToolOutput {
    let tools = env.tools();
    find_tool(&tools, tool)
        .unwrap()
        .call(&args, &CallContext::new("t", 1))
        .await
        .unwrap()
}

#[test]
fn the_repository_is_drawn_from_the_seed() {
    let a = Codebase::generate(&BugfixConfig::new(4, 3));
    assert_eq!(a, Codebase::generate(&BugfixConfig::new(4, 3)));
    assert_ne!(
        (0..8)
            .map(|s| Codebase::generate(&BugfixConfig::new(s, 3)))
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count(),
        0
    );
    assert_eq!(a.modules.len(), 6);
    assert_eq!(a.failing().len(), 3);
    for module in &a.modules {
        match module.bug {
            Some(b) => {
                assert_eq!(module.text, TEMPLATES[b].buggy);
                assert!(module.failure().is_some());
            }
            None => assert!(module.passes()),
        }
    }
}

#[test]
fn parameters_are_checked() {
    let params = |v: Value| v.as_object().unwrap().clone();
    let config =
        BugfixConfig::from_params(coder::KIND, &params(json!({"seed": 3, "bugs": 2}))).unwrap();
    assert_eq!(config, BugfixConfig::new(3, 2));
    let error = BugfixConfig::from_params(coder::KIND, &params(json!({"bugs": 9}))).unwrap_err();
    assert!(error.to_string().contains("bugs"), "{error}");
    let error = BugfixConfig::from_params(coder::KIND, &params(json!({"bugs": 4, "tests": 2})))
        .unwrap_err();
    assert!(error.to_string().contains("tests >= bugs"), "{error}");
    let error = BugfixConfig::from_params(reviewer::KIND, &params(json!({"sed": 1}))).unwrap_err();
    assert!(
        error.to_string().contains("unknown parameter `sed`"),
        "{error}"
    );
}

#[tokio::test]
async fn the_coder_fixes_a_test_in_its_working_copy() {
    let config = BugfixConfig::new(7, 2);
    let code = Codebase::generate(&config);
    let mut env = Coder::new(config);
    let opening = env.opening_observation();
    let failing = code.failing();
    assert_eq!(
        opening,
        format!(
            "CI on main is red: 2 of 5 tests fail: {}.",
            failing.join(", ")
        )
    );
    let module = code.by_test(&failing[0]).unwrap();
    let shown = call(&env, "inspect", json!({"test": failing[0]})).await;
    assert!(
        shown.text.starts_with(&format!(
            "{} failed at {}:{}\nline {}: `{}`",
            failing[0],
            module.file(),
            module.line,
            module.line,
            module.text
        )),
        "{}",
        shown.text
    );
    let wrong = call(
        &env,
        "edit",
        json!({"file": module.file(), "line": module.line, "before": "    nope", "after": module.fixed}),
    )
    .await;
    assert!(
        !wrong.ok && wrong.text.contains("nothing changed"),
        "{}",
        wrong.text
    );
    let red = call(&env, "run_test", json!({"test": failing[0]})).await;
    assert!(red.text.contains("still fails"), "{}", red.text);
    let edited = call(
        &env,
        "edit",
        json!({"file": module.file(), "line": module.line, "before": module.text, "after": module.fixed}),
    )
    .await;
    assert!(edited.ok, "{}", edited.text);
    let green = call(&env, "run_test", json!({"test": failing[0]})).await;
    assert_eq!(green.text, format!("{} passed.", failing[0]));
    assert_eq!(env.outcome()["failing"], json!([failing[1]]));
    let mut copy = Coder::new(BugfixConfig::new(0, 1));
    copy.restore(&env.checkpoint()).unwrap();
    assert_eq!(copy.outcome(), env.outcome());
}

#[tokio::test]
async fn the_reviewer_keeps_good_changes_and_reverts_bad_ones() {
    let config = BugfixConfig::new(11, 2);
    let code = Codebase::generate(&config);
    let env = Reviewer::new(config);
    let failing = code.failing();
    let bug = code.by_test(&failing[0]).unwrap();
    let clean = code.modules.iter().find(|m| m.passes()).unwrap();

    // Fixes nothing: the failing test still fails.
    let args = |change: u64, m: &codebase::Module, after: &str| json!({"change": change, "file": m.file(), "line": m.line, "before": m.text, "after": after});
    let refused = call(&env, "apply_and_test", args(1, bug, "    let x = 0;")).await;
    assert!(!refused.ok);
    assert!(
        refused
            .text
            .starts_with("Change #1 refused and reverted: it makes no failing test pass."),
        "{}",
        refused.text
    );
    // Breaks a passing test.
    let broken = call(&env, "apply_and_test", args(2, clean, "    todo!();")).await;
    assert!(
        broken
            .text
            .contains(&format!("and breaks {}", clean.test())),
        "{}",
        broken.text
    );
    // The fix, kept.
    let applied = call(&env, "apply_and_test", args(3, bug, &bug.fixed)).await;
    assert!(applied.ok, "{}", applied.text);
    assert!(
        applied.text.starts_with(&format!(
            "Change #3 applied: {} passes now; no regressions; 4 of 5 tests pass; still failing: {}.",
            failing[0], failing[1]
        )),
        "{}",
        applied.text
    );
    // The same change again: its line no longer reads as `before`.
    let stale = call(&env, "apply_and_test", args(4, bug, &bug.fixed)).await;
    assert!(
        !stale.ok && stale.text.starts_with("Change #4 does not apply:"),
        "{}",
        stale.text
    );
    let early = call(&env, "release", json!({"version": "1.4.1"})).await;
    assert!(
        !early.ok && early.text.contains("1 tests still fail"),
        "{}",
        early.text
    );
    let other = code.by_test(&failing[1]).unwrap();
    assert!(
        call(&env, "apply_and_test", args(5, other, &other.fixed))
            .await
            .ok
    );
    let released = call(&env, "release", json!({"version": "1.4.1"})).await;
    assert_eq!(
        released.text,
        format!(
            "Released v1.4.1: 5 of 5 tests pass; 2 fixes: {}, {}.",
            failing[0], failing[1]
        )
    );
    assert!(!call(&env, "release", json!({"version": "1.4.2"})).await.ok);
    assert_eq!(
        env.outcome(),
        json!({"applied": 2, "refused": 3, "released": "1.4.1", "failing": []})
    );
}

/// RFC 7396, enough for the oracles' patches.
fn merge(target: &mut Value, patch: &Value) {
    let Some(members) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().unwrap();
    for (key, value) in members {
        if value.is_null() {
            object.remove(key);
        } else {
            merge(object.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// One agent as the runtime drives it: private state, the board's parts it reads, and the
/// observation its last action produced.
struct Agent {
    kind: &'static str,
    env: Box<dyn Environment>,
    state: Value,
    reads: &'static [&'static str],
    observation: String,
    done: bool,
    steps: u32,
}

impl Agent {
    fn prompt(&self, board: &Value) -> String {
        let mut shown = self.state.clone();
        let mut projected = json!({});
        for part in self.reads {
            projected[part] = board[part].clone();
        }
        shown["board"] = projected;
        format!(
            "# Current state\n{shown}\n\n# Latest observation\n{}\n",
            self.observation
        )
    }

    /// One step: the oracle's answer, its board part merged into `board` (only where the
    /// agent may write), its action run.
    async fn step(&mut self, board: &mut Value, writes: &[&str]) {
        let answer: Value =
            serde_json::from_str(&crate::oracle::answer(self.kind, &self.prompt(board)).unwrap())
                .unwrap();
        let mut patch = answer["state_patch"].clone();
        if let Some(part) = patch.as_object_mut().unwrap().remove("board") {
            for key in part.as_object().unwrap().keys() {
                assert!(writes.contains(&key.as_str()), "{} wrote /{key}", self.kind);
            }
            merge(board, &part);
        }
        merge(&mut self.state, &patch);
        self.steps += 1;
        let tool = answer["action"]["tool"].as_str().unwrap();
        self.observation = match tool {
            "finish" => {
                self.done = true;
                String::new()
            }
            // Sleeping adds nothing to what the oracles see.
            "wait" => "Waited 0 s.".into(),
            _ => {
                call(self.env.as_ref(), tool, answer["action"]["args"].clone())
                    .await
                    .text
            }
        };
    }
}

/// The whole protocol on the oracles alone, interleaved in several ways: every bug of every
/// seed is fixed, reviewed and released, and only the board carries the changes across.
#[tokio::test]
async fn the_oracles_fix_every_bug_through_the_board() {
    for bugs in 1..=5 {
        for seed in 0..6 {
            for reviewer_every in [1, 2, 5] {
                let config = BugfixConfig::new(seed, bugs);
                let mut board: Value = serde_json::from_str(BOARD_INIT).unwrap();
                let mut coder_env: Box<dyn Environment> = Box::new(Coder::new(config.clone()));
                let mut reviewer_env: Box<dyn Environment> = Box::new(Reviewer::new(config));
                let mut coder = Agent {
                    kind: coder::KIND,
                    observation: coder_env.opening_observation(),
                    env: coder_env,
                    state: json!({"failing": [], "fixed": 0, "idle": 0}),
                    reads: &["goal", "change", "review"],
                    done: false,
                    steps: 0,
                };
                let mut reviewer = Agent {
                    kind: reviewer::KIND,
                    observation: reviewer_env.opening_observation(),
                    env: reviewer_env,
                    state: json!({"reviewed": 0, "idle": 0}),
                    reads: &["change", "review", "release"],
                    done: false,
                    steps: 0,
                };
                for round in 0..500 {
                    if !coder.done {
                        coder.step(&mut board, &["change"]).await;
                    }
                    if !reviewer.done && round % reviewer_every == 0 {
                        reviewer.step(&mut board, &["review", "release"]).await;
                    }
                }
                let label = format!("bugs {bugs} seed {seed} every {reviewer_every}");
                assert!(coder.done && reviewer.done, "{label}: {board}");
                assert_eq!(board["change"]["status"], "done", "{label}");
                assert_eq!(board["change"]["id"], bugs, "{label}");
                assert_eq!(board["review"]["verdict"], "approved", "{label}");
                assert_eq!(board["release"]["version"], "1.4.1", "{label}");
                assert_eq!(board["release"]["fixes"], bugs, "{label}");
                assert_eq!(coder.env.outcome()["failing"], json!([]), "{label}");
                let outcome = reviewer.env.outcome();
                assert_eq!(outcome["applied"], bugs, "{label}");
                assert_eq!(outcome["refused"], 0, "{label}");
                assert_eq!(outcome["released"], "1.4.1", "{label}");
                // inspect, edit, run_test, propose+wait, then the verdict read: ≥ 4 steps per bug.
                assert!(coder.steps >= 4 * bugs, "{label}: {}", coder.steps);
            }
        }
    }
}
