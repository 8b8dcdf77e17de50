//! The reviewer's oracle (`bugfix_reviewer`): from the state block (its private `reviewed`
//! and `idle`, and the board under `board`) and the latest observation. A change proposed on
//! the board and not reviewed yet is applied to its own copy with `apply_and_test`; the
//! result becomes the verdict on the board. Once the coder marks its change `done` and every
//! change is reviewed, it releases the next patch version, writes the release on the board
//! and finishes. Otherwise it waits, longer each time nothing changed.

use serde_json::{Map, Value, json};

use super::bugfix_coder::backoff;
use super::view::{read_prompt, relevant_lines};

pub fn answer(prompt: &str) -> String {
    let view = read_prompt(prompt);
    let state = view.state.unwrap_or_else(|| json!({}));
    let board = state.get("board").cloned().unwrap_or_else(|| json!({}));
    let mut reviewed = state["reviewed"].as_u64().unwrap_or(0);
    let mut idle = state["idle"].as_u64().unwrap_or(0);
    let mut writes = Map::new();
    let lines = relevant_lines(view.latest);
    let first = lines.first().copied().unwrap_or_default();

    // What the last action found becomes the board's verdict or release.
    if let Some((change, verdict)) = verdict_of(first) {
        reviewed = reviewed.max(change);
        writes.insert(
            "review".into(),
            json!({"change": change, "verdict": verdict, "note": note(first)}),
        );
        if verdict == "approved" {
            let fixes = board["release"]["fixes"].as_u64().unwrap_or(0) + 1;
            writes.insert("release".into(), json!({"fixes": fixes}));
        }
    }
    let released = first
        .strip_prefix("Released v")
        .and_then(|rest| rest.split_once(": "));
    let (reasoning, tool, args) = if let Some((version, _)) = released {
        writes.insert(
            "release".into(),
            json!({"version": version, "notes": note(first)}),
        );
        (
            format!("v{version} is out; the board shows it."),
            "finish",
            json!({"result": format!("released v{version}")}),
        )
    } else {
        let change = &board["change"];
        let id = change["id"].as_u64().unwrap_or(0);
        match change["status"].as_str() {
            Some("proposed") if id > reviewed => {
                idle = 0;
                (
                    format!("Change #{id} is proposed; apply it to my copy and run the suite."),
                    "apply_and_test",
                    json!({
                        "change": id,
                        "file": change["file"],
                        "line": change["line"],
                        "before": change["before"],
                        "after": change["after"],
                    }),
                )
            }
            Some("done") if id <= reviewed => {
                let version = next_patch(board["release"]["version"].as_str().unwrap_or("0.0.0"));
                (
                    "The coder is done and every change is reviewed; release.".into(),
                    "release",
                    json!({"version": version}),
                )
            }
            _ => {
                let seconds = backoff(idle);
                idle += 1;
                (
                    "Nothing new to review on the board; wait.".into(),
                    "wait",
                    json!({"seconds": seconds}),
                )
            }
        }
    };
    let mut patch = json!({"reviewed": reviewed, "idle": idle});
    if !writes.is_empty() {
        patch["board"] = Value::Object(writes);
    }
    json!({
        "reasoning": reasoning,
        "state_patch": patch,
        "action": {"tool": tool, "args": args},
    })
    .to_string()
}

/// `(change, verdict)` from an `apply_and_test` result line.
fn verdict_of(line: &str) -> Option<(u64, &'static str)> {
    let rest = line.strip_prefix("Change #")?;
    let (number, rest) = rest.split_once(' ')?;
    let change = number.trim_end_matches(':').parse().ok()?;
    let verdict = if rest.starts_with("applied:") {
        "approved"
    } else {
        "changes_requested"
    };
    Some((change, verdict))
}

/// The line as a board note (the board keeps notes under 300 characters). The line comes from
/// a rendered prompt, which holds only redacted text.
fn note(line: &str) -> String {
    line.chars().take(300).collect()
}

/// `1.4.0` → `1.4.1`.
fn next_patch(version: &str) -> String {
    let mut parts: Vec<u64> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    parts[2] += 1;
    format!("{}.{}.{}", parts[0], parts[1], parts[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_verdicts() {
        assert_eq!(
            verdict_of(
                "Change #2 applied: tests::a passes now; no regressions; 5 of 6 tests pass; still failing: tests::b."
            ),
            Some((2, "approved"))
        );
        assert_eq!(
            verdict_of(
                "Change #3 refused and reverted: it makes no failing test pass. tests::a: …"
            ),
            Some((3, "changes_requested"))
        );
        assert_eq!(
            verdict_of("Change #4 does not apply: src/a.rs:9 reads `x`; nothing changed."),
            Some((4, "changes_requested"))
        );
        assert_eq!(verdict_of("Waited 0.02 s."), None);
    }

    #[test]
    fn bumps_the_patch_version() {
        assert_eq!(next_patch("1.4.0"), "1.4.1");
        assert_eq!(next_patch("2.0.9"), "2.0.10");
    }
}
