//! Joining and forking a board on the real binary: a `run --board` whose skill cannot join is
//! refused and stores nothing (no task, no membership); a fork of a member is a member of the
//! same board and says so; `validate --board` reports the `[board]` pointers that name nothing
//! in the board's schema, and skill.toml refuses overlapping writes, each with its line.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{repo_root, skillstate};
use serde_json::{Value, json};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A copy of `skills/release-frontend` under `root/release-frontend`.
fn frontend_copy(root: &Path) -> PathBuf {
    let dir = root.join("release-frontend");
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    let source = repo_root().join("skills/release-frontend");
    for file in [
        "SKILL.md",
        "skill.toml",
        "state.schema.json",
        "state.init.json",
        "examples/demo.jsonl",
    ] {
        if source.join(file).exists() {
            std::fs::copy(source.join(file), dir.join(file)).unwrap();
        }
    }
    dir
}

fn board_json(db: &Path) -> Value {
    let out = skillstate(db, &["board", "show", "release-42", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn create_board(db: &Path) {
    let out = skillstate(
        db,
        &[
            "board",
            "create",
            "release-42",
            "--schema",
            "boards/release/state.schema.json",
            "--init",
            "boards/release/state.init.json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_refused_join_stores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    create_board(&db);
    // The skill's own state has a top-level `board` member, where the board is shown.
    let skill = frontend_copy(tmp.path());
    let schema_path = skill.join("state.schema.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    schema["properties"]["board"] = json!({"type": "string"});
    std::fs::write(&schema_path, schema.to_string()).unwrap();
    let out = skillstate(
        &db,
        &[
            "run",
            skill.to_str().unwrap(),
            "--board",
            "release-42",
            "--model",
            "scripted:skills/release-frontend/examples/demo.jsonl",
            "--input",
            "Build the login release",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let error = text(&out.stderr);
    assert!(
        error.contains("cannot join board `release-42`") && error.contains("top-level `board`"),
        "{error}"
    );
    // Nothing stored: no task, no member.
    let tasks = skillstate(&db, &["tasks"]);
    assert!(tasks.status.success());
    assert!(
        !text(&tasks.stdout).contains("release-frontend"),
        "{}",
        text(&tasks.stdout)
    );
    assert_eq!(board_json(&db)["members"], json!([]));
}

#[test]
fn a_fork_of_a_member_is_a_member_of_its_board() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    create_board(&db);
    let out = skillstate(
        &db,
        &[
            "run",
            "skills/release-frontend",
            "--board",
            "release-42",
            "--model",
            "scripted:skills/release-frontend/examples/demo.jsonl",
            "--input",
            "Build the login release",
            "-q",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let task = text(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    let fork = skillstate(&db, &["fork", &task, "--step", "1"]);
    assert!(fork.status.success(), "{}", text(&fork.stderr));
    let fork_id = text(&fork.stdout).trim().to_owned();
    let said = text(&fork.stderr);
    assert!(
        said.contains("the fork is a member of board release-42"),
        "{said}"
    );
    assert_eq!(board_json(&db)["members"], json!([task, fork_id]));
}

#[test]
fn validate_reports_board_pointers_that_name_nothing_and_overlapping_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let skill = frontend_copy(tmp.path());
    let toml_path = skill.join("skill.toml");
    let original = std::fs::read_to_string(&toml_path).unwrap();
    let line_of =
        |text: &str, needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;

    // Pointers checked against a schema file, and against a board of the database.
    let typo = original.replace(
        "reads = [\"/plan\", \"/api\", \"/frontend\"]",
        "reads = [\"/plan\", \"/apii\", \"/frontend\", \"/plan/goal/x\"]",
    );
    assert_ne!(typo, original);
    std::fs::write(&toml_path, &typo).unwrap();
    let line = line_of(&typo, "reads = ");
    let skill_arg = skill.to_str().unwrap();
    for board in ["boards/release/state.schema.json", "release-42"] {
        if board == "release-42" {
            create_board(&db);
        }
        let out = skillstate(&db, &["validate", skill_arg, "--board", board]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let said = text(&out.stdout);
        assert!(
            said.contains(&format!("skill.toml:{line}:"))
                && said.contains("board.reads[1]: \"/apii\" names nothing"),
            "{said}"
        );
        assert!(said.contains("board.reads[3]: \"/plan/goal/x\""), "{said}");
        assert!(said.contains("2 error(s)"), "{said}");
    }
    std::fs::write(&toml_path, &original).unwrap();
    let out = skillstate(
        &db,
        &[
            "validate",
            skill_arg,
            "--board",
            "boards/release/state.schema.json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("every [board] pointer names a part of"));

    // Overlapping writes are refused where skill.toml is read.
    let overlapping = original.replace(
        "writes = [\"/frontend\"]",
        "writes = [\"/frontend\", \"/frontend/pages\"]",
    );
    assert_ne!(overlapping, original);
    std::fs::write(&toml_path, &overlapping).unwrap();
    let out = skillstate(&db, &["validate", skill_arg]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    let line = line_of(&overlapping, "writes = ");
    assert!(
        said.contains(&format!("skill.toml:{line}:"))
            && said.contains("board.writes[1]: \"/frontend/pages\" lies within \"/frontend\""),
        "{said}"
    );
}
