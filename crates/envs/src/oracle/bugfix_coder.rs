//! The coder's oracle (`bugfix_coder`): from the state block (its private `failing`,
//! `current`, `fixed`, `idle`, and the board under `board`) and the latest observation, it
//! takes one failing test at a time: inspect → edit → run the test → propose the change on
//! the board → wait for the reviewer's verdict there → next test. When the last change is
//! approved it marks the board's change `done` and finishes.

use serde_json::{Map, Value, json};

use super::view::{read_prompt, relevant_lines};

/// The change the coder works on, as its private state records it.
#[derive(Debug, Clone, PartialEq)]
struct Current {
    test: String,
    file: String,
    line: u64,
    before: String,
    after: String,
    /// The board change number once proposed (0 before).
    change: u64,
}

impl Current {
    fn from_state(v: &Value) -> Option<Self> {
        Some(Self {
            test: v.get("test")?.as_str()?.to_owned(),
            file: v.get("file")?.as_str()?.to_owned(),
            line: v.get("line")?.as_u64()?,
            before: v.get("before")?.as_str()?.to_owned(),
            after: v.get("after")?.as_str()?.to_owned(),
            change: v.get("change").and_then(Value::as_u64).unwrap_or(0),
        })
    }

    fn to_json(&self) -> Value {
        json!({"test": self.test, "file": self.file, "line": self.line, "before": self.before, "after": self.after, "change": self.change})
    }
}

struct Mind {
    failing: Vec<String>,
    current: Option<Current>,
    fixed: u64,
    idle: u64,
    board: Map<String, Value>,
}

/// How long to wait after `idle` waits in a row: 20 ms doubling up to 1 s.
pub(super) fn backoff(idle: u64) -> f64 {
    (0.02 * f64::from(1u32 << idle.min(6))).min(1.0)
}

pub fn answer(prompt: &str) -> String {
    let view = read_prompt(prompt);
    let state = view.state.unwrap_or_else(|| json!({}));
    let board = state.get("board").cloned().unwrap_or_else(|| json!({}));
    let mut mind = Mind {
        failing: state["failing"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        current: state.get("current").and_then(Current::from_state),
        fixed: state["fixed"].as_u64().unwrap_or(0),
        idle: state["idle"].as_u64().unwrap_or(0),
        board: Map::new(),
    };
    let lines = relevant_lines(view.latest);
    let (reasoning, tool, args) = decide(&mut mind, &board, &lines);
    let mut patch = json!({
        "failing": mind.failing,
        "current": mind.current.as_ref().map(Current::to_json).unwrap_or(Value::Null),
        "fixed": mind.fixed,
        "idle": mind.idle,
    });
    if !mind.board.is_empty() {
        patch["board"] = Value::Object(mind.board);
    }
    json!({
        "reasoning": reasoning,
        "state_patch": patch,
        "action": {"tool": tool, "args": args},
    })
    .to_string()
}

fn decide(mind: &mut Mind, board: &Value, lines: &[&str]) -> (String, &'static str, Value) {
    // The opening observation lists what is red.
    for line in lines {
        if let Some(list) = line
            .strip_prefix("CI on main is red: ")
            .and_then(|rest| rest.split_once(" fail: "))
            .map(|(_, list)| list.trim_end_matches('.'))
            && mind.failing.is_empty()
            && mind.fixed == 0
        {
            mind.failing = list.split(", ").map(str::to_owned).collect();
        }
    }
    let review = &board["review"];
    // A proposal waits for its verdict on the board.
    if let Some(current) = mind.current.clone().filter(|c| c.change > 0) {
        if review["change"].as_u64() != Some(current.change) {
            let seconds = backoff(mind.idle);
            mind.idle += 1;
            return (
                format!(
                    "Change #{} is with the reviewer; wait for the verdict on the board.",
                    current.change
                ),
                "wait",
                json!({"seconds": seconds}),
            );
        }
        mind.idle = 0;
        if review["verdict"] == "approved" {
            mind.failing.retain(|t| *t != current.test);
            mind.fixed += 1;
            mind.current = None;
        } else {
            mind.current = None;
            return (
                format!(
                    "The reviewer asked for changes to #{}: {}",
                    current.change,
                    review["note"].as_str().unwrap_or_default()
                ),
                "inspect",
                json!({"test": current.test}),
            );
        }
    } else if let Some(step) = follow_up(mind, board, lines) {
        return step;
    }
    match mind.failing.first() {
        Some(test) => (
            format!("{test} fails; see where."),
            "inspect",
            json!({"test": test}),
        ),
        None => {
            if board["change"]["status"] != "done" {
                mind.board
                    .insert("change".into(), json!({"status": "done"}));
            }
            (
                format!(
                    "Every test I was given passes and all {} changes were approved.",
                    mind.fixed
                ),
                "finish",
                json!({"result": format!("{} fixes approved", mind.fixed)}),
            )
        }
    }
}

/// The next step on the change in the working copy, from the latest observation.
fn follow_up(
    mind: &mut Mind,
    board: &Value,
    lines: &[&str],
) -> Option<(String, &'static str, Value)> {
    let first = lines.first()?;
    if let Some(test) = first.strip_suffix(" passes; nothing to fix there.") {
        mind.failing.retain(|t| t != test);
        return None;
    }
    if let Some(found) = inspected(lines) {
        let Some(after) = fix(found.before, found.note) else {
            return Some((
                format!("No fix I know of for {}: {}", found.test, found.note),
                "finish",
                json!({"result": format!("could not fix {}", found.test)}),
            ));
        };
        let current = Current {
            test: found.test.to_owned(),
            file: found.file.to_owned(),
            line: found.line,
            before: found.before.to_owned(),
            after,
            change: 0,
        };
        let args = json!({"file": current.file, "line": current.line, "before": current.before, "after": current.after});
        mind.current = Some(current);
        return Some((format!("{}: {}", found.test, found.note), "edit", args));
    }
    let current = mind.current.clone()?;
    if first.starts_with("Edited ") {
        return Some((
            "Edited; run the test.".into(),
            "run_test",
            json!({"test": current.test}),
        ));
    }
    if *first == format!("{} passed.", current.test) {
        let id = board["change"]["id"].as_u64().unwrap_or(0) + 1;
        mind.board.insert(
            "change".into(),
            json!({
                "id": id,
                "status": "proposed",
                "test": current.test,
                "file": current.file,
                "line": current.line,
                "before": current.before,
                "after": current.after,
            }),
        );
        mind.current = Some(Current {
            change: id,
            ..current
        });
        mind.idle = 0;
        return Some((
            format!("The test passes in my copy; propose it as change #{id}."),
            "wait",
            json!({"seconds": backoff(0)}),
        ));
    }
    // The edit did not apply or did not fix the test: look again.
    mind.current = None;
    Some((
        format!("{first}; inspect {} again.", current.test),
        "inspect",
        json!({"test": current.test}),
    ))
}

struct Inspected<'a> {
    test: &'a str,
    file: &'a str,
    line: u64,
    before: &'a str,
    note: &'a str,
}

/// `tests::t failed at src/f.rs:L` / ``line L: `code` `` / `assertion failed: …; note: …`.
fn inspected<'a>(lines: &[&'a str]) -> Option<Inspected<'a>> {
    let (test, place) = lines.first()?.split_once(" failed at ")?;
    let (file, line) = place.rsplit_once(':')?;
    let code = lines.get(1)?;
    let before = &code[code.find('`')? + 1..code.rfind('`')?];
    let note = lines.get(2)?.split_once("note: ")?.1;
    Some(Inspected {
        test,
        file,
        line: line.parse().ok()?,
        before,
        note,
    })
}

/// The line as it should read, from what the failing test's note says is wrong with it.
fn fix(line: &str, note: &str) -> Option<String> {
    let swap = |from: &str, to: &str| line.find(from).map(|_| line.replacen(from, to, 1));
    if note.contains("should include its end") {
        return line
            .find("..")
            .filter(|&at| !line[at + 2..].starts_with('='))
            .map(|at| format!("{}..={}", &line[..at], &line[at + 2..]));
    }
    if note.contains("one too large") {
        return swap(" + 1", "");
    }
    if note.contains("condition is inverted") {
        return swap("if !", "if ").or_else(|| swap("if ", "if !"));
    }
    if note.contains("should include equality") {
        return swap(" > ", " >= ").or_else(|| swap(" < ", " <= "));
    }
    if note.contains("sign is wrong") {
        return swap(" - ", " + ").or_else(|| swap(" + ", " - "));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bugfix::codebase::TEMPLATES;

    #[test]
    fn every_template_is_fixed_from_its_note() {
        for t in TEMPLATES {
            assert_eq!(fix(t.buggy, t.note).as_deref(), Some(t.fixed), "{t:?}");
        }
        assert_eq!(fix("    let x = 1;", "something else"), None);
    }

    #[test]
    fn reads_an_inspection() {
        let lines = [
            "tests::pagination failed at src/pagination.rs:17",
            "line 17: `    for page in 1..last {`",
            "assertion failed: expected 5 pages, got 4; note: the range stops one element early; it should include its end",
        ];
        let found = inspected(&lines).unwrap();
        assert_eq!(found.test, "tests::pagination");
        assert_eq!(found.file, "src/pagination.rs");
        assert_eq!(found.line, 17);
        assert_eq!(found.before, "    for page in 1..last {");
        assert!(found.note.ends_with("include its end"));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), 0.02);
        assert_eq!(backoff(1), 0.04);
        assert_eq!(backoff(40), 1.0);
    }
}
