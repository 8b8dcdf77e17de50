//! The CLI as a user sees it: the README's commands run against the shipped demo, with their
//! output pinned by snapshots (ids, times and temp paths redacted).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn redactions(tmp: &Path) -> Vec<(String, &'static str)> {
    vec![
        (regex_escape(&tmp.display().to_string()), "[TMP]"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}".into(),
            "[TASK]",
        ),
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z".into(), "[TIME]"),
        // Latencies vary run to run, and their width moves the columns after them.
        (r" {2,}".into(), "  "),
        (r"(?m)^(\s*\d+  \d+  \d+  -  )\d+".into(), "${1}[MS]"),
    ]
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .map(|c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

macro_rules! snapshot {
    ($tmp:expr, $name:expr, $value:expr) => {{
        let filters = redactions($tmp);
        let filters: Vec<(&str, &str)> = filters.iter().map(|(a, b)| (a.as_str(), *b)).collect();
        insta::with_settings!({filters => filters}, { insta::assert_snapshot!($name, $value); });
    }};
}

#[test]
fn validate_reports_ok_for_the_example_and_every_problem_for_a_broken_skill() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("unused.db");
    let ok = skillstate(&db, &["validate", "skills/warehouse"]);
    assert!(ok.status.success());
    snapshot!(tmp.path(), "validate_ok", text(&ok.stdout));

    let (broken, _) = warehouse_copy(tmp.path(), 7, 10);
    std::fs::write(
        broken.join("state.init.json"),
        r#"{"shelf_count": 500, "inventory": {"shelf_1": 1, "bin_7": "item_2"}}"#,
    )
    .unwrap();
    std::fs::write(
        broken.join("skill.toml"),
        "[tools]\nallow = [\"warehouse\"]\n[run]\nmax_step = 3\n",
    )
    .unwrap();
    let bad = skillstate(&db, &["validate", broken.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1));
    snapshot!(tmp.path(), "validate_broken", text(&bad.stdout));
}

#[test]
fn run_tasks_and_show_the_demo() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let run = skillstate(
        &db,
        &[
            "run",
            "skills/warehouse",
            "--model",
            "scripted:skills/warehouse/examples/demo.jsonl",
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    snapshot!(tmp.path(), "run_demo_stdout", text(&run.stdout));
    snapshot!(tmp.path(), "run_demo_progress", text(&run.stderr));

    let tasks = skillstate(&db, &["tasks"]);
    assert!(tasks.status.success());
    snapshot!(tmp.path(), "tasks", text(&tasks.stdout));
    let id = text(&tasks.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();

    let show = skillstate(&db, &["show", &id[..8]]);
    assert!(show.status.success(), "{}", text(&show.stderr));
    snapshot!(tmp.path(), "show_demo", text(&show.stdout));

    let at7 = skillstate(&db, &["show", &id, "--step", "7"]);
    assert!(at7.status.success());
    let state: serde_json::Value = serde_json::from_slice(&at7.stdout).unwrap();
    assert_eq!(
        state,
        serde_json::json!({"shelf_count": 500, "inventory": {}})
    );
    assert!(text(&at7.stderr).contains("matches the hash recorded"));

    let prompt = skillstate(&db, &["show", &id, "--step", "7", "--prompt"]);
    assert!(prompt.status.success(), "{}", text(&prompt.stderr));
    let prompt_text = text(&prompt.stdout);
    assert!(prompt_text.ends_with("# Latest observation\nSuccess: Shipped item_6241 from shelf_330.\nCustomer ordered item_4298.\n"));
    assert!(
        prompt_text.contains("{\"shelf_count\":500,\"inventory\":{\"shelf_206\":\"item_4298\"}}")
    );
    assert!(text(&prompt.stderr).contains("byte-identical"));
}

#[test]
fn user_errors_are_clear_and_exit_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let missing = skillstate(&db, &["show", "0123abcd"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("no task matches `0123abcd`"),
        "{}",
        text(&missing.stderr)
    );

    let no_script = skillstate(
        &db,
        &["run", "skills/warehouse", "--model", "scripted:nope.jsonl"],
    );
    assert_eq!(no_script.status.code(), Some(1));
    assert!(
        text(&no_script.stderr).contains("nope.jsonl: cannot read the script"),
        "{}",
        text(&no_script.stderr)
    );

    let unknown_model = skillstate(&db, &["run", "skills/warehouse", "--model", "gpt"]);
    assert!(
        text(&unknown_model.stderr).contains("model spec `gpt` is not understood"),
        "{}",
        text(&unknown_model.stderr)
    );

    let bad_dir = skillstate(&tmp.path().join("no/such/dir/x.db"), &["tasks"]);
    assert!(
        text(&bad_dir.stderr).contains("does not exist"),
        "{}",
        text(&bad_dir.stderr)
    );

    // A script that runs out before the episode ends fails the task with the reason stored.
    let (skill, script) = warehouse_copy(tmp.path(), 7, 10);
    let short: Vec<String> = std::fs::read_to_string(&script)
        .unwrap()
        .lines()
        .take(3)
        .map(str::to_owned)
        .collect();
    std::fs::write(&script, short.join("\n")).unwrap();
    let model = format!("scripted:{}", script.display());
    let run = skillstate(
        &db,
        &["run", skill.to_str().unwrap(), "--model", &model, "--quiet"],
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(
        text(&run.stdout).contains("failed after 3 step(s)"),
        "{}",
        text(&run.stdout)
    );
    assert!(
        text(&run.stdout).contains("exhausted after 3 output(s)"),
        "{}",
        text(&run.stdout)
    );
}

#[test]
fn bench_prints_the_table_and_writes_its_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench-out");
    let bench = skillstate(
        &tmp.path().join("unused.db"),
        &[
            "bench",
            "warehouse",
            "--horizons",
            "10",
            "--seeds",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(bench.status.success(), "{}", text(&bench.stderr));
    snapshot!(tmp.path(), "bench_small", text(&bench.stdout));
    for file in ["results.json", "report.md", "prompt_tokens.svg"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let unknown = skillstate(&tmp.path().join("unused.db"), &["bench", "factory"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("no skill for environment `factory`"),
        "{}",
        text(&unknown.stderr)
    );
}
