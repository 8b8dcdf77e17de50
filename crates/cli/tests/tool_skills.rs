//! The tool features through the CLI: the code-investigator example over its puzzle (fs and
//! shell), the file-librarian example over the reference MCP filesystem server, approvals
//! across process restarts, and large observations.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn last_task(db: &Path) -> String {
    let tasks = skillstate(db, &["tasks"]);
    text(&tasks.stdout)
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn the_code_investigator_finds_the_flag_with_fs_and_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let validate = skillstate(&db, &["validate", "skills/code-investigator"]);
    assert!(validate.status.success(), "{}", text(&validate.stdout));
    let run = skillstate(
        &db,
        &[
            "run",
            "skills/code-investigator",
            "--model",
            "scripted:skills/code-investigator/examples/demo.jsonl",
            "--input",
            "Recover the leaked release flag.",
        ],
    );
    assert!(
        run.status.success(),
        "{}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert!(
        text(&run.stdout).contains("finished with result \"flag{state_beats_transcripts}\""),
        "{}",
        text(&run.stdout)
    );
    let id = last_task(&db);
    // The shell's real output is the observation of the last step.
    let observation = skillstate(&db, &["show", &id, "--step", "5", "--observation"]);
    assert_eq!(
        text(&observation.stdout),
        "exit code 0\n--- stdout ---\nbeats_transcripts}\n--- stderr ---\n\n"
    );
    let tools = skillstate(&db, &["tools", "skills/code-investigator"]);
    assert!(
        text(&tools.stdout).contains("shell.exec  shell   effectful"),
        "{}",
        text(&tools.stdout)
    );
}

#[test]
fn a_large_observation_is_cut_in_the_prompt_and_kept_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let script = tmp.path().join("read-log.jsonl");
    std::fs::write(
        &script,
        concat!(
            r#"{"reasoning": "read the whole log", "state_patch": {}, "action": {"tool": "fs.read", "args": {"path": "logs/app.log"}}}"#,
            "\n",
            r#"{"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "read"}}}"#,
            "\n"
        ),
    )
    .unwrap();
    let model = format!("scripted:{}", script.display());
    let run = skillstate(
        &db,
        &[
            "run",
            "skills/code-investigator",
            "--model",
            &model,
            "--input",
            "Read the log.",
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    let id = last_task(&db);
    let full = text(&skillstate(&db, &["show", &id, "--step", "2", "--observation"]).stdout);
    assert_eq!(
        full.trim_end().lines().count(),
        121,
        "the journal keeps the whole 121-line log"
    );
    let prompt = text(&skillstate(&db, &["show", &id, "--step", "2", "--prompt"]).stdout);
    assert!(
        prompt.contains("[observation truncated: first 600 of"),
        "the prompt cuts it to the budget"
    );
    assert!(
        !prompt.contains("processed batch 1119"),
        "the end of the log is not in the prompt"
    );
}

#[test]
fn approval_survives_a_restart_and_runs_the_action_once() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let config = tmp.path().join("skillstate.toml");
    std::fs::write(
        &config,
        "[tools.policy]\nrequire_approval = [\"shell.exec\"]\n",
    )
    .unwrap();
    let script = tmp.path().join("script.jsonl");
    std::fs::write(
        &script,
        [
            r#"{"reasoning": "count", "state_patch": {}, "action": {"tool": "shell.exec", "args": {"command": "echo ran >> counter.txt; wc -l < counter.txt"}}}"#,
            r#"{"reasoning": "again", "state_patch": {}, "action": {"tool": "shell.exec", "args": {"command": "echo ran >> counter.txt"}}}"#,
            r#"{"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "ok"}}}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let model = format!("scripted:{}", script.display());
    let common = ["--config", config.to_str().unwrap()];
    let args = |rest: &[&str]| -> Vec<String> {
        common
            .iter()
            .chain(rest.iter())
            .map(|s| (*s).to_owned())
            .collect()
    };
    let run_args = args(&[
        "run",
        "skills/code-investigator",
        "--model",
        &model,
        "--work-dir",
        work.to_str().unwrap(),
        "--input",
        "Count.",
    ]);
    let run = skillstate(
        &db,
        &run_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("awaiting_approval after 1 step(s)"),
        "{}",
        text(&run.stdout)
    );
    assert!(
        !work.join("counter.txt").exists(),
        "nothing runs before approval"
    );
    let id = last_task(&db);
    let pending = skillstate(&db, &["pending"]);
    assert!(
        text(&pending.stdout).contains("waiting for approval of shell.exec"),
        "{}",
        text(&pending.stdout)
    );

    // A new process approves: the command runs exactly once, then the next one waits again.
    let approve_args = args(&["approve", &id]);
    let approve = skillstate(
        &db,
        &approve_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(approve.status.success(), "{}", text(&approve.stderr));
    assert!(
        text(&approve.stdout).contains("awaiting_approval after 2 step(s)"),
        "{}",
        text(&approve.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(work.join("counter.txt")).unwrap(),
        "ran\n"
    );
    let observation = text(&skillstate(&db, &["show", &id, "--step", "2", "--observation"]).stdout);
    assert!(
        observation.starts_with("exit code 0\n--- stdout ---\n1"),
        "{observation}"
    );

    // Rejecting turns the refusal into the next observation; the command never runs.
    let reject_args = args(&["reject", &id, "--reason", "one is enough"]);
    let reject = skillstate(
        &db,
        &reject_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(reject.status.success(), "{}", text(&reject.stderr));
    assert!(
        text(&reject.stdout).contains("completed after 3 step(s)"),
        "{}",
        text(&reject.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(work.join("counter.txt")).unwrap(),
        "ran\n"
    );
    let refused = text(&skillstate(&db, &["show", &id, "--step", "3", "--observation"]).stdout);
    assert!(
        refused.contains("A human rejected `shell.exec`") && refused.contains("one is enough"),
        "{refused}"
    );
    let again = skillstate(
        &db,
        &approve_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(again.status.code(), Some(1), "nothing is waiting any more");
}

#[test]
fn the_file_librarian_uses_the_reference_mcp_filesystem_server() {
    if std::env::var("SKILLSTATE_TEST_MCP_FS").is_err() {
        common::skip::skip_test(
            "SKILLSTATE_TEST_MCP_FS is not set",
            "run scripts/test, which installs the MCP test servers and sets it",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db").join("skillstate.db");
    let run = skillstate(
        &db,
        &[
            "--config",
            "skills/file-librarian/skillstate.toml",
            "run",
            "skills/file-librarian",
            "--model",
            "scripted:skills/file-librarian/examples/demo.jsonl",
            "--input",
            "When is release 2.0 and who owns the checklist?",
        ],
    );
    assert!(
        run.status.success(),
        "{}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    assert!(
        text(&run.stdout).contains("14 March; Jonas owns"),
        "{}",
        text(&run.stdout)
    );
    let id = last_task(&db);
    let listing = text(&skillstate(&db, &["show", &id, "--step", "2", "--observation"]).stdout);
    assert!(
        listing.contains("notes-1.md") && listing.contains("recipes.md"),
        "{listing}"
    );
    let note = text(&skillstate(&db, &["show", &id, "--step", "4", "--observation"]).stdout);
    assert!(note.contains("moved to 14 March"), "{note}");
}
