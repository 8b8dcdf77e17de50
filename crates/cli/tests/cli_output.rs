//! The CLI as a user sees it: the guide's commands run against the shipped demo, with their
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

/// `show --step N --prompt` writes the prompt's exact bytes to stdout and its footer to stderr;
/// with both streams in one file (a terminal, `2>&1`) the footer must stand on a line of its own,
/// apart from the prompt's last line.
#[test]
fn show_prompt_footer_stands_apart_from_the_prompt() {
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
    let tasks = text(&skillstate(&db, &["tasks"]).stdout);
    let id = tasks
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();

    let merged_path = tmp.path().join("merged.txt");
    let merged_file = std::fs::File::create(&merged_path).unwrap();
    let status = std::process::Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", &db)
        .args(["show", id, "--step", "7", "--prompt"])
        .stdout(merged_file.try_clone().unwrap())
        .stderr(merged_file)
        .status()
        .unwrap();
    assert!(status.success());
    let merged = std::fs::read_to_string(&merged_path).unwrap();
    let (prompt, footer) = merged
        .split_once("\n\nprompt of step 7 attempt 1: ")
        .unwrap_or_else(|| panic!("the footer is not separated by a blank line:\n{merged}"));
    assert!(prompt.ends_with("Customer ordered item_4298."), "{prompt}");
    assert!(footer.ends_with("(byte-identical to the prompt the model received)\n"));
    assert_eq!(footer.lines().count(), 1, "{footer}");

    // stdout alone is still the prompt, byte for byte: its hash is the one the footer names.
    let alone = skillstate(&db, &["show", id, "--step", "7", "--prompt"]);
    let hash = skillstate_core::json::text_hash(&text(&alone.stdout));
    assert!(
        text(&alone.stderr).contains(&format!("sha256 {hash} ")),
        "{}",
        text(&alone.stderr)
    );
    assert_eq!(format!("{prompt}\n"), text(&alone.stdout));
}

#[test]
fn user_errors_are_clear_and_exit_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");

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

    // The database exists now (the failed task is in it); an unknown id is named.
    let missing = skillstate(&db, &["show", "0123abcd"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("no task matches `0123abcd`"),
        "{}",
        text(&missing.stderr)
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
    // Runs that fail show in the table and in the exit status.
    let garbage = tmp.path().join("garbage.jsonl");
    std::fs::write(&garbage, "\"not an answer\"\n").unwrap();
    let model = format!("scripted:{}", garbage.display());
    let failing = skillstate(
        &tmp.path().join("unused.db"),
        &[
            "bench",
            "warehouse",
            "--model",
            &model,
            "--horizons",
            "10",
            "--seeds",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(failing.status.code(), Some(1), "{}", text(&failing.stderr));
    assert!(
        text(&failing.stderr).contains("5 of 5 runs did not complete"),
        "{}",
        text(&failing.stderr)
    );
    let unknown = skillstate(&tmp.path().join("unused.db"), &["bench", "factory"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("no skill for environment `factory`"),
        "{}",
        text(&unknown.stderr)
    );
}

/// Overflow class: an age longer than any task can be old (here 10^16 s, whose milliseconds
/// used to wrap to a negative number) selects nothing, in the dry run and for real; an age that
/// does not even fit in 64 bits saturates the same way.
#[test]
fn gc_with_an_age_beyond_any_task_deletes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    for _ in 0..2 {
        let run = skillstate(
            &db,
            &[
                "run",
                "skills/warehouse",
                "--model",
                "scripted:skills/warehouse/examples/demo.jsonl",
                "--quiet",
            ],
        );
        assert!(run.status.success(), "{}", text(&run.stderr));
    }
    let task_lines = |db: &Path| {
        text(&skillstate(db, &["tasks"]).stdout)
            .lines()
            .filter(|l| l.contains("completed"))
            .count()
    };
    assert_eq!(task_lines(&db), 2);
    for age in ["10000000000000000s", "99999999999999999999999d"] {
        for dry_run in [true, false] {
            let mut args = vec!["gc", "--older-than", age];
            if dry_run {
                args.push("--dry-run");
            }
            let gc = skillstate(&db, &args);
            assert!(gc.status.success(), "{}", text(&gc.stderr));
            let verb = if dry_run { "would" } else { "did" };
            assert_eq!(
                text(&gc.stdout),
                format!("{verb} delete 0 task(s) and compact 0 journal(s)\n"),
                "gc {args:?}"
            );
            assert_eq!(task_lines(&db), 2, "gc {args:?} deleted tasks");
        }
    }
    // The same command with an age the finished tasks do exceed still deletes them.
    let gc = skillstate(&db, &["gc", "--older-than", "0s"]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        text(&gc.stdout).ends_with("did delete 2 task(s) and compact 0 journal(s)\n"),
        "{}",
        text(&gc.stdout)
    );
    assert_eq!(task_lines(&db), 0);

    // Keeping no step at all is refused by name, not turned into an empty step range.
    let zero = skillstate(&db, &["gc", "--keep-last", "0"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(
        text(&zero.stderr).contains("'--keep-last <KEEP_LAST>'"),
        "{}",
        text(&zero.stderr)
    );
}

/// Overflow class, settings: `max_retries = 4294967295` used to wrap `max_retries + 1` to zero
/// attempts. Every number in skill.toml and skillstate.toml has a range, checked when the file
/// is read, and the error names the file, line, key and range.
#[test]
fn settings_out_of_range_are_refused_with_file_line_key_and_range() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let (skill, script) = warehouse_copy(tmp.path(), 7, 10);
    let settings = std::fs::read_to_string(skill.join("skill.toml"))
        .unwrap()
        .replace("max_retries = 2", "max_retries = 4294967295");
    std::fs::write(skill.join("skill.toml"), &settings).unwrap();
    let line = settings
        .lines()
        .position(|l| l.starts_with("max_retries"))
        .unwrap()
        + 1;
    let validate = skillstate(&db, &["validate", skill.to_str().unwrap()]);
    assert_eq!(validate.status.code(), Some(1));
    assert!(
        text(&validate.stdout).contains(&format!(
            "skill.toml:{line}:15: invalid skill.toml: [run] max_retries = 4294967295 is out of range: the rejected answers allowed per step must be a whole number from 0 to 100"
        )),
        "{}",
        text(&validate.stdout)
    );
    let model = format!("scripted:{}", script.display());
    let run = skillstate(&db, &["run", skill.to_str().unwrap(), "--model", &model]);
    assert_eq!(run.status.code(), Some(1));
    assert!(text(&run.stderr).contains("max_retries = 4294967295 is out of range"));

    let config = tmp.path().join("skillstate.toml");
    std::fs::write(
        &config,
        "[model]\ntimeout_secs = 0\nmax_retries = 99999999999999999999\n",
    )
    .unwrap();
    let run = skillstate(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "skills/warehouse",
            "--model",
            "scripted:skills/warehouse/examples/demo.jsonl",
        ],
    );
    assert_eq!(run.status.code(), Some(1));
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("skillstate.toml:2:16: [model] timeout_secs = 0 is out of range")
            && stderr.contains(
                "skillstate.toml:3:15: [model] max_retries = 99999999999999999999 is out of range"
            )
            && stderr.contains("from 0 to 20"),
        "{stderr}"
    );
    let budget = skillstate(
        &db,
        &[
            "run",
            "skills/warehouse",
            "--model",
            "oracle",
            "--budget",
            "18446744073709551615",
        ],
    );
    assert_eq!(budget.status.code(), Some(2));
    assert!(
        text(&budget.stderr).contains("'--budget <BUDGET>'"),
        "{}",
        text(&budget.stderr)
    );
}
