//! `skillstate board upgrade` on the real binary, with a member attached (release-frontend,
//! reading /plan, /api, /frontend and writing /frontend): a rename with its migration is a dry
//! run first, then applied as a write of its own — the state migrated, earlier versions still
//! read with the schema they were written under; a schema that drops a pointer the member's
//! skill names is refused naming the task and the pointer; a migration that breaks the new
//! schema is refused with its pointers; an upgrade planned against an older version is stale.
//! Nothing changes on a refusal.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::skillstate;
use serde_json::{Value, json};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(db: &Path, args: &[&str]) -> String {
    let out = skillstate(db, args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs `args` expecting a refusal; returns standard error.
fn refused(db: &Path, args: &[&str]) -> String {
    let out = skillstate(db, args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

fn shown(db: &Path, version: Option<&str>) -> Value {
    let mut args = vec!["board", "show", "release-42", "--json"];
    if let Some(version) = version {
        args.extend(["--version", version]);
    }
    serde_json::from_str(&ok(db, &args)).unwrap()
}

fn release_schema() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("boards/release/state.schema.json"))
            .unwrap(),
    )
    .unwrap()
}

fn write(dir: &Path, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_board_schema_changes_by_a_write_of_its_own_and_members_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    ok(
        &db,
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
    let out = ok(
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
    let task = out.split_whitespace().nth(1).unwrap().to_owned();
    let before = shown(&db, None);
    let at = before["version"].as_u64().unwrap();
    assert_eq!(at, 1, "{before}");
    assert_eq!(before["members"], json!([task]));

    // The guide's example (docs/boards.md): the plan's `goal` becomes `objective`.
    let renamed: Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo_root().join("boards/release/v2/state.schema.json"))
            .unwrap(),
    )
    .unwrap();
    let renamed_path = "boards/release/v2/state.schema.json".to_owned();
    let migration = "boards/release/v2/migration.json".to_owned();

    // Without the migration the state breaks the new schema: every problem with its pointer.
    let said = refused(
        &db,
        &["board", "upgrade", "release-42", "--schema", &renamed_path],
    );
    assert!(said.contains("nothing was changed"), "{said}");
    assert!(
        said.contains("the migrated board at /plan") && said.contains("objective"),
        "{said}"
    );

    // A dry run: the diff, the member checked, nothing written.
    let dry = ok(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            &renamed_path,
            "--migration",
            &migration,
        ],
    );
    assert!(
        dry.contains("/plan/objective") && dry.contains("dry run"),
        "{dry}"
    );
    assert!(dry.contains(&format!("task {task}")), "{dry}");
    assert_eq!(shown(&db, None), before);

    // Applied against the version it was planned at: version 2, the state migrated.
    let applied = ok(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            &renamed_path,
            "--migration",
            &migration,
            "--at",
            "1",
            "--apply",
            "--json",
        ],
    );
    let applied: Value = serde_json::from_str(&applied).unwrap();
    assert_eq!(applied["outcome"], "upgraded", "{applied}");
    assert_eq!(applied["upgrade"]["version"], 2);
    let now = shown(&db, None);
    assert_eq!(now["version"], 2);
    assert_eq!(now["schema"], renamed);
    assert_eq!(now["schema_changes"], json!([2]));
    assert_eq!(
        now["state"]["plan"]["objective"],
        before["state"]["plan"]["goal"]
    );
    assert!(now["state"]["plan"].get("goal").is_none(), "{now}");
    assert_eq!(now["state"]["frontend"], before["state"]["frontend"]);
    assert_eq!(now["writes"][1]["author"], json!({"kind": "cli"}));
    // Earlier versions read with the schema they were written under.
    for version in ["0", "1"] {
        let old = shown(&db, Some(version));
        assert_eq!(old["schema"], release_schema(), "version {version}");
        assert!(old["state"]["plan"].get("goal").is_some(), "{old}");
    }
    let text_view = ok(&db, &["board", "show", "release-42"]);
    assert!(text_view.contains("(new schema)"), "{text_view}");

    // A schema without /frontend: the member's skill reads and writes it — refused, naming the
    // task and the pointer, and nothing changes.
    let mut without_frontend = renamed.clone();
    without_frontend["properties"]
        .as_object_mut()
        .unwrap()
        .remove("frontend");
    without_frontend["required"] = json!(["plan", "api", "backend"]);
    let without_path = write(tmp.path(), "no-frontend.schema.json", &without_frontend);
    let drop_frontend = write(tmp.path(), "drop-frontend.json", &json!({"frontend": null}));
    let said = refused(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            &without_path,
            "--migration",
            &drop_frontend,
            "--apply",
        ],
    );
    assert!(
        said.contains(&format!(
            "task {task}: its reads pointer \"/frontend\" names nothing in the new schema"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "task {task}: its writes pointer \"/frontend\" names nothing"
        )),
        "{said}"
    );
    assert_eq!(shown(&db, None), now);

    // A migration that breaks the new schema: refused with its pointer.
    let breaking = write(
        tmp.path(),
        "breaking.json",
        &json!({"frontend": {"status": "blocked"}}),
    );
    let said = refused(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            &renamed_path,
            "--migration",
            &breaking,
            "--apply",
        ],
    );
    assert!(
        said.contains("the migrated board at /frontend/status"),
        "{said}"
    );
    // And one that does not apply names the migration file's operation.
    let missing = write(
        tmp.path(),
        "missing.json",
        &json!([{"op": "remove", "path": "/plan/goal"}]),
    );
    let said = refused(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            &renamed_path,
            "--migration",
            &missing,
            "--apply",
        ],
    );
    assert!(said.contains("the migration does not apply"), "{said}");
    assert_eq!(shown(&db, None), now);

    // Planned against version 1, but the board is at 2: stale.
    let said = refused(
        &db,
        &[
            "board",
            "upgrade",
            "release-42",
            "--schema",
            "boards/release/state.schema.json",
            "--at",
            "1",
            "--apply",
        ],
    );
    assert!(said.contains("moved on to version 2"), "{said}");
    assert_eq!(shown(&db, None), now);
}

#[test]
fn write_only_values_stay_hidden_in_show_and_in_the_diff() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let secret = "tok-4f9a-never-shown";
    let schema = write(
        tmp.path(),
        "vault.schema.json",
        &json!({"type": "object", "properties": {"token": {"type": "string", "writeOnly": true}}}),
    );
    let init = write(tmp.path(), "vault.init.json", &json!({"token": secret}));
    ok(
        &db,
        &[
            "board", "create", "vault", "--schema", &schema, "--init", &init,
        ],
    );
    let shown = ok(&db, &["board", "show", "vault", "--json"]);
    assert!(
        !shown.contains(secret) && shown.contains("[redacted]"),
        "{shown}"
    );
    let moved = write(
        tmp.path(),
        "moved.schema.json",
        &json!({"type": "object", "properties": {"shown": {"type": "string"}}}),
    );
    let migration = write(
        tmp.path(),
        "move.json",
        &json!([{"op": "move", "from": "/token", "path": "/shown"}]),
    );
    for json_flag in [false, true] {
        let mut args = vec![
            "board",
            "upgrade",
            "vault",
            "--schema",
            &moved,
            "--migration",
            &migration,
        ];
        if json_flag {
            args.push("--json");
        }
        let dry = ok(&db, &args);
        assert!(!dry.contains(secret) && dry.contains("[redacted]"), "{dry}");
    }
}
