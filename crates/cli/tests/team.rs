//! The bugfix team (`skills/bugfix-coder` and `skills/bugfix-reviewer` on a `boards/bugfix`
//! board) end to end on the real binary with the oracle: both agents run at once as separate
//! processes, each in its own copy of the seeded repository; the board ends with every change
//! approved and the release out, every write is its author's, the coder's prompts show only
//! the parts of the board it reads, and the reviewer's copy holds the coder's fixes, which
//! reached it through the board alone. On a SQLite file, and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const CODER: &str = "skills/bugfix-coder";
const REVIEWER: &str = "skills/bugfix-reviewer";
/// `bugs` in both skills' skill.toml.
const BUGS: u64 = 3;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn command(db: &str, args: &[&str]) -> Command {
    let mut command = Command::new(common::binary());
    command
        .current_dir(common::repo_root())
        .env("SKILLSTATE_DB", db)
        .args(args);
    command
}

/// Runs `skillstate args…`, requiring success; returns stdout.
fn ok(db: &str, args: &[&str]) -> String {
    let out = command(db, args).output().unwrap();
    assert!(
        out.status.success(),
        "skillstate {args:?} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The task id and step count of a finished `run`.
fn finished(out: &Output, skill: &str) -> (String, u64) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{skill} failed:\n{stdout}\n{}",
        text(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("task ") && l.contains(" completed after "))
        .unwrap_or_else(|| panic!("{skill} did not complete:\n{stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].to_owned(), words[4].parse().unwrap())
}

/// The state block of a rendered prompt.
fn shown_state(prompt: &str) -> Value {
    let block = prompt
        .split_once("\n# Current state\n")
        .unwrap()
        .1
        .lines()
        .next()
        .unwrap();
    serde_json::from_str(block).unwrap()
}

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect()
}

fn run_team(db: &str, board: &str) {
    ok(
        db,
        &[
            "board",
            "create",
            board,
            "--schema",
            "boards/bugfix/state.schema.json",
            "--init",
            "boards/bugfix/state.init.json",
        ],
    );
    // Both at once: the reviewer first, so it waits for the first proposal.
    let spawn = |skill: &str| {
        command(db, &["run", skill, "--board", board, "--model", "oracle"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let reviewer = spawn(REVIEWER);
    let coder = spawn(CODER);
    let (coder, coder_steps) = finished(&coder.wait_with_output().unwrap(), CODER);
    let (reviewer, reviewer_steps) = finished(&reviewer.wait_with_output().unwrap(), REVIEWER);

    let shown: Value = serde_json::from_str(&ok(db, &["board", "show", board, "--json"])).unwrap();
    let state = &shown["state"];
    assert_eq!(state["change"]["status"], "done", "{state}");
    assert_eq!(state["change"]["id"], BUGS);
    assert_eq!(
        state["review"],
        json!({"change": BUGS, "verdict": "approved", "note": state["review"]["note"]})
    );
    assert!(
        state["review"]["note"]
            .as_str()
            .unwrap()
            .starts_with("Change #3 applied: "),
        "{state}"
    );
    assert_eq!(state["release"]["version"], "1.4.1");
    assert_eq!(state["release"]["fixes"], BUGS);
    assert!(
        state["release"]["notes"]
            .as_str()
            .unwrap()
            .starts_with("Released v1.4.1: 6 of 6 tests pass; 3 fixes: "),
        "{state}"
    );
    let members: BTreeSet<&str> = shown["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(members, BTreeSet::from([coder.as_str(), reviewer.as_str()]));

    // Every write is its author's: the coder's touch only /change, the reviewer's only
    // /review and /release. One proposal per bug and the `done`, one verdict per bug and the
    // release.
    let writes = shown["writes"].as_array().unwrap();
    assert_eq!(writes.len() as u64, 2 * (BUGS + 1));
    assert_eq!(shown["version"], 2 * (BUGS + 1));
    let (mut by_coder, mut by_reviewer) = (0, 0);
    for write in writes {
        assert_eq!(write["author"]["kind"], "task", "{write}");
        let author = write["author"]["task"].as_str().unwrap();
        let wrote = keys(&write["patch"]);
        if author == coder {
            assert_eq!(wrote, BTreeSet::from(["change"]), "{write}");
            by_coder += 1;
        } else {
            assert_eq!(author, reviewer, "{write}");
            assert!(
                wrote.is_subset(&BTreeSet::from(["review", "release"])),
                "{write}"
            );
            by_reviewer += 1;
        }
    }
    assert_eq!((by_coder, by_reviewer), (BUGS + 1, BUGS + 1));
    // Time travel: the board as created, rebuilt from the journal.
    let first: Value = serde_json::from_str(&ok(
        db,
        &["board", "show", board, "--version", "0", "--json"],
    ))
    .unwrap();
    let init: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("boards/bugfix/state.init.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["state"], init);

    // The coder's prompts show the board through its reads only: no `release`, anywhere.
    for step in 1..=coder_steps {
        let prompt = ok(
            db,
            &["show", &coder, "--step", &step.to_string(), "--prompt"],
        );
        let board = &shown_state(&prompt)["board"];
        assert_eq!(
            keys(board),
            BTreeSet::from(["goal", "change", "review"]),
            "step {step}"
        );
        for hidden in ["\"release\"", "\"fixes\"", "1.4.0", "1.4.1"] {
            assert!(
                !prompt.contains(hidden),
                "the coder's prompt at step {step} shows {hidden}:\n{prompt}"
            );
        }
    }
    // And the reviewer's do not show the goal it does not read.
    for step in [1, reviewer_steps] {
        let prompt = ok(
            db,
            &["show", &reviewer, "--step", &step.to_string(), "--prompt"],
        );
        assert_eq!(
            keys(&shown_state(&prompt)["board"]),
            BTreeSet::from(["change", "review", "release"]),
            "step {step}"
        );
        assert!(!prompt.contains("CI on main is red: fix every failing test"));
    }

    // Each agent worked on its own copy: the coder's working copy and the reviewer's both end
    // green, and the reviewer applied exactly the changes on the board.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = skillstate_store::open(db).await.unwrap();
        let coder_task = store.task(&coder).await.unwrap();
        let reviewer_task = store.task(&reviewer).await.unwrap();
        let coder_copy = coder_task.env_checkpoint.unwrap();
        let reviewer_copy = reviewer_task.env_checkpoint.unwrap();
        assert_eq!(coder_copy["edits"], BUGS);
        assert_eq!(
            reviewer_copy["applied"].as_array().unwrap().len() as u64,
            BUGS
        );
        assert_eq!(reviewer_copy["refused"], 0);
        assert_eq!(reviewer_copy["released"], "1.4.1");
        assert_eq!(reviewer_copy["code"], coder_copy["code"]);
    });
}

#[test]
fn a_coder_and_a_reviewer_share_one_board_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("team.db");
    run_team(db.to_str().unwrap(), "bugfix-1");
}

#[test]
fn a_coder_and_a_reviewer_share_one_board_on_postgres() {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if url == "off" {
        common::skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
        );
        return;
    }
    use sqlx::Connection;
    let schema = format!("team_{}", std::process::id());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sql = |statement: String| {
        runtime.block_on(async {
            let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut connection)
                .await
                .unwrap();
        })
    };
    sql(format!("CREATE SCHEMA {schema}"));
    let db = format!("{url}?options=-c%20search_path%3D{schema}");
    let outcome = std::panic::catch_unwind(|| run_team(&db, "bugfix-1"));
    sql(format!("DROP SCHEMA {schema} CASCADE"));
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
