//! Recall and provenance from the command line: `skillstate search` and `skillstate show --why`
//! run as the real binary on a real SQLite file, after a scripted warehouse run. Hits come
//! newest first with their step numbers, pages join up through `--after`, a write-only value is
//! never printed, and a fork searches its parent's history up to the fork point only. The
//! rendered output is pinned by snapshots (ids, times and temp paths redacted).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{binary, repo_root, warehouse_copy};
use serde_json::{Value, json};

const DEMO: &str = "scripted:skills/warehouse/examples/demo.jsonl";
const SECRET: &str = "door-code-Vb4Qx9Lm";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The binary on `db`, with its data directory in the test's temp dir.
fn skillstate(db: &Path, args: &[&str]) -> Output {
    skillstate_on(
        db.to_str().unwrap(),
        &db.parent().unwrap().join("data"),
        args,
    )
}

/// The binary on a database location (a SQLite path or a postgres:// URL).
fn skillstate_on(location: &str, data_dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", location)
        .env("SKILLSTATE_DATA_DIR", data_dir)
        .args(args)
        .output()
        .expect("the skillstate binary runs")
}

#[track_caller]
fn ok(db: &Path, args: &[&str]) -> String {
    let out = skillstate(db, args);
    assert!(
        out.status.success(),
        "skillstate {args:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs the demo warehouse script (10 events) to the end and returns the task's id.
fn run_demo(db: &Path) -> String {
    run_skill(db, "skills/warehouse", DEMO)
}

fn run_skill(db: &Path, skill: &str, model: &str) -> String {
    ok(db, &["run", skill, "--model", model]);
    let tasks = ok(db, &["tasks"]);
    tasks
        .lines()
        .nth(1)
        .and_then(|line| line.split_whitespace().next())
        .unwrap()
        .to_owned()
}

fn search_json(db: &Path, args: &[&str]) -> Value {
    let mut all = vec!["search"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&ok(db, &all)).unwrap()
}

/// The (step, kind) of each row of a `search` table.
fn rows(table: &str) -> Vec<(u64, String)> {
    table
        .lines()
        .skip_while(|line| !line.starts_with("STEP"))
        .skip(1)
        .filter_map(|line| {
            let mut cells = line.split_whitespace();
            let step = cells.next()?.parse().ok()?;
            Some((step, cells.next()?.to_owned()))
        })
        .collect()
}

fn redactions(tmp: &Path) -> Vec<(String, &'static str)> {
    vec![
        (regex_escape(&tmp.display().to_string()), "[TMP]"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}".into(),
            "[TASK]",
        ),
        (r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z".into(), "[TIME]"),
        (r"--after \d+:\d+".into(), "--after [CURSOR]"),
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
fn search_lists_matches_newest_first_with_their_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let id = run_demo(&db);

    // By a unique prefix, as other commands take a task.
    let found = ok(&db, &["search", &id[..8], "item_4298"]);
    snapshot!(tmp.path(), "search_item", &found);
    let hits = rows(&found);
    let steps: Vec<u64> = hits.iter().map(|(s, _)| *s).collect();
    assert!(steps.windows(2).all(|w| w[0] >= w[1]), "{found}");
    for step in [1, 3, 7] {
        assert!(steps.contains(&step), "step {step} missing:\n{found}");
    }
    for kind in ["observation", "reasoning", "action", "state"] {
        assert!(hits.iter().any(|(_, k)| k == kind), "no {kind}:\n{found}");
    }
    let oldest = ok(&db, &["search", &id, "item_4298", "--oldest-first"]);
    let steps: Vec<u64> = rows(&oldest).iter().map(|(s, _)| *s).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{oldest}");
    assert_eq!(steps.len(), hits.len());

    // A location: its writes only, the removal first.
    let at = ok(&db, &["search", &id, "--pointer", "/inventory/shelf_122"]);
    snapshot!(tmp.path(), "search_pointer", &at);
    assert_eq!(
        rows(&at),
        vec![(3, "state".to_owned()), (1, "state".to_owned())]
    );

    // Kinds and a step range.
    let observed = ok(
        &db,
        &[
            "search",
            &id,
            "item_4298",
            "--kind",
            "observation",
            "--from-step",
            "2",
            "--to-step",
            "7",
        ],
    );
    let observed = rows(&observed);
    assert!(!observed.is_empty());
    assert!(
        observed
            .iter()
            .all(|(s, k)| k == "observation" && (2..=7).contains(s)),
        "{observed:?}"
    );

    // Pages join up: every page after the cursor the previous one gave equals one big page.
    let whole = search_json(&db, &[&id, "item", "--limit", "500"]);
    assert_eq!(whole["next"], Value::Null);
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let mut args = vec![id.as_str(), "item", "--limit", "4"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = search_json(&db, &args);
        let hits = page["hits"].as_array().unwrap();
        assert!(hits.len() <= 4);
        paged.extend(hits.iter().cloned());
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(paged.len() > 8, "{paged:?}");
    assert_eq!(Value::Array(paged), whole["hits"]);
    let first = ok(&db, &["search", &id, "item", "--limit", "4"]);
    assert!(
        first.contains("more matches exist: run the same command with --after "),
        "{first}"
    );

    let none = ok(&db, &["search", &id, "item_999999"]);
    assert_eq!(
        none.trim(),
        format!("no matches for \"item_999999\" in task {id}")
    );
}

#[test]
fn a_bad_search_names_the_flag_and_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let id = run_demo(&db);
    for (args, says) in [
        (
            vec!["search", id.as_str()],
            "WORDS: give words to search for",
        ),
        (
            vec!["search", id.as_str(), "--", "---"],
            "WORDS: has no word",
        ),
        (
            vec!["search", id.as_str(), "--pointer", "inventory"],
            "--pointer: must be a JSON pointer",
        ),
        (
            vec![
                "search",
                id.as_str(),
                "--pointer",
                "/inventory",
                "--kind",
                "reasoning",
            ],
            "--kind: --pointer finds state writes only",
        ),
        (
            vec![
                "search",
                id.as_str(),
                "x",
                "--from-step",
                "5",
                "--to-step",
                "2",
            ],
            "--from-step: is after --to-step (5 > 2)",
        ),
        (
            vec!["search", id.as_str(), "x", "--limit", "0"],
            "--limit: must be 1 to 500",
        ),
        (
            vec!["search", id.as_str(), "x", "--after", "zz"],
            "--after: `zz` is not a cursor",
        ),
        (
            vec!["search", id.as_str(), "x", "--kind", "dreams"],
            "invalid value 'dreams'",
        ),
    ] {
        let out = skillstate(&db, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let unknown = skillstate(&db, &["search", "ffffffff", "x"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("no task matches `ffffffff`"),
        "{}",
        text(&unknown.stderr)
    );
}

#[test]
fn show_why_names_the_step_the_observation_and_the_author() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let id = run_demo(&db);

    let all = ok(
        &db,
        &["show", &id[..8], "--why", "/inventory/shelf_122", "--all"],
    );
    snapshot!(tmp.path(), "why_all", &all);
    assert!(all.contains("now      nothing (no value there)"), "{all}");
    let step1 = all.split("\nstep 1 ").nth(1).expect("step 1 is listed");
    assert!(
        step1.contains("by the model (scripted:skills/warehouse/examples/demo.jsonl)")
            && step1.contains("value        \"item_4298\"")
            && step1.contains(
                "observation  Shipment arrived containing item_4298. Store it on shelf_122."
            ),
        "{all}"
    );
    assert!(all.find("\nstep 3 ").unwrap() < all.find("\nstep 1 ").unwrap());

    // Without --all: only the write that set today's value (the removal at step 3).
    let current = ok(&db, &["show", &id, "--why", "/inventory/shelf_122"]);
    assert!(
        current.contains("\nstep 3 ") && !current.contains("\nstep 1 "),
        "{current}"
    );
    assert!(
        current.contains("--all lists every past value"),
        "{current}"
    );

    let held = ok(&db, &["show", &id, "--why", "/inventory/shelf_129"]);
    snapshot!(tmp.path(), "why_current", &held);
    assert!(held.contains("now      \"item_601\""), "{held}");

    let initial = ok(&db, &["show", &id, "--why", "/shelf_count"]);
    assert!(
        initial.contains("now      500") && initial.contains("the skill's initial state (step 0)"),
        "{initial}"
    );

    let never = skillstate(&db, &["show", &id, "--why", "/inventory/shelf_999"]);
    assert_eq!(never.status.code(), Some(1));
    assert!(
        text(&never.stderr)
            .contains("has no value at /inventory/shelf_999, and no step ever wrote it"),
        "{}",
        text(&never.stderr)
    );
    let bad = skillstate(&db, &["show", &id, "--why", "inventory~2"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("--why: \"inventory~2\" is not a JSON pointer"),
        "{}",
        text(&bad.stderr)
    );
    let clash = skillstate(&db, &["show", &id, "--why", "/inventory", "--step", "2"]);
    assert_eq!(clash.status.code(), Some(2));
}

/// The warehouse with a write-only `access_code` the first answer sets (and its reasoning
/// repeats); returns (skill dir, model spec).
fn warehouse_with_secret(root: &Path) -> (String, String) {
    let (skill, _) = warehouse_copy(root, 7, 10);
    let schema_path = skill.join("state.schema.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    schema["properties"]["access_code"] = json!({"type": "string", "writeOnly": true});
    std::fs::write(&schema_path, schema.to_string()).unwrap();
    let demo =
        std::fs::read_to_string(repo_root().join("skills/warehouse/examples/demo.jsonl")).unwrap();
    let mut lines: Vec<String> = demo.lines().map(str::to_owned).collect();
    let mut first: Value = serde_json::from_str(&lines[0]).unwrap();
    first["reasoning"] = json!(format!(
        "item_4298 arrived for shelf_122; the door code is {SECRET}, noted."
    ));
    first["state_patch"]["access_code"] = json!(SECRET);
    lines[0] = first.to_string();
    let script = root.join("secret.jsonl");
    std::fs::write(&script, lines.join("\n")).unwrap();
    (
        skill.display().to_string(),
        format!("scripted:{}", script.display()),
    )
}

#[test]
fn a_write_only_value_is_never_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let (skill, model) = warehouse_with_secret(tmp.path());
    let id = run_skill(&db, &skill, &model);

    // Searching for the value finds nothing at all, not even that it exists.
    for args in [
        vec!["search", id.as_str(), SECRET],
        vec!["search", id.as_str(), "Vb4Qx9Lm"],
        vec!["search", id.as_str(), "--pointer", "/access_code"],
    ] {
        let out = ok(&db, &args);
        assert!(out.starts_with("no matches for "), "{args:?}: {out}");
    }
    let hidden = search_json(&db, &[&id, "--pointer", "/access_code"]);
    assert_eq!(hidden["hits"], json!([]));
    // What matches otherwise is shown without it.
    let door = ok(&db, &["search", &id, "door", "code"]);
    assert!(
        door.contains(
            "1  reasoning  item_4298 arrived for shelf_122; the door code is [redacted], noted."
        ),
        "{door}"
    );
    for args in [
        vec!["search", id.as_str(), "--pointer", ""],
        vec!["search", id.as_str(), "shelf_122", "--json"],
        vec!["show", id.as_str(), "--why", "/access_code", "--all"],
        vec![
            "show",
            id.as_str(),
            "--why",
            "/inventory/shelf_122",
            "--all",
        ],
        vec!["show", id.as_str(), "--why", "", "--all"],
    ] {
        let out = skillstate(&db, &args);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{args:?}: {all}");
        assert!(
            !all.contains("Vb4Qx9Lm"),
            "{args:?} prints the secret:\n{all}"
        );
    }
    let why = ok(&db, &["show", &id, "--why", "/access_code"]);
    assert!(
        why.contains("now      \"[redacted]\"") && why.contains("\nstep 1 "),
        "{why}"
    );
}

#[test]
fn a_fork_searches_its_parents_history_up_to_the_fork_point_only() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let parent = run_demo(&db);
    let fork = ok(&db, &["fork", &parent, "--step", "3"]).trim().to_owned();
    assert_ne!(fork, parent);

    // item_6241 arrives at step 5 of the parent: the fork never saw it.
    assert!(
        !search_json(&db, &[&parent, "item_6241"])["hits"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(search_json(&db, &[&fork, "item_6241"])["hits"], json!([]));
    // What it has is the parent's, to the fork point: its steps 1-3 and the observation its
    // step 4 will answer.
    let forked = search_json(&db, &[&fork, "item", "--limit", "500"]);
    let parents = search_json(&db, &[&parent, "item", "--limit", "500", "--to-step", "4"]);
    // (Within one step the fork may list its entries in another order: compare them sorted.)
    let sorted = |hits: Vec<&Value>| {
        let mut hits: Vec<String> = hits.iter().map(|h| h.to_string()).collect();
        hits.sort();
        hits
    };
    let fork_hits: Vec<&Value> = forked["hits"].as_array().unwrap().iter().collect();
    assert!(fork_hits.len() > 5, "{forked}");
    assert!(
        fork_hits.iter().all(|h| {
            let step = h["step"].as_u64().unwrap();
            step <= 3 || (step == 4 && h["kind"] == "observation")
        }),
        "{forked}"
    );
    let kept: Vec<&Value> = parents["hits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["step"].as_u64().unwrap() <= 3 || h["kind"] == "observation")
        .collect();
    assert_eq!(sorted(kept), sorted(fork_hits));
    let steps: Vec<u64> = forked["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["step"].as_u64().unwrap())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] >= w[1]), "{forked}");

    // Its provenance is the parent's too, up to the fork point.
    let why = ok(&db, &["show", &fork, "--why", "/inventory/shelf_206"]);
    assert!(
        why.contains("now      \"item_4298\"")
            && why.contains("\nstep 3 ")
            && !why.contains("\nstep 7 "),
        "{why}"
    );
}

/// A state write made through the runtime as the service's PATCH makes it, by an API key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_why_names_the_api_key_of_a_state_write() {
    use std::sync::Arc;

    use skillstate_runtime::{StateWrite, write_state};
    use skillstate_store::{SqliteStore, Store, Synchronous};

    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let id = run_demo(&db);
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap(),
    );
    let patch = json!({"inventory": {"shelf_480": "item_77"}});
    let written = write_state(
        &store,
        &StateWrite {
            task: &id,
            if_match: 10,
            patch: &patch,
            author: "key-id-4f2a",
            checked: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(written.version, 11);
    drop(store);

    let why = ok(&db, &["show", &id, "--why", "/inventory/shelf_480"]);
    assert!(
        why.contains("now      \"item_77\"")
            && why.contains("\nstep 11 ")
            && why.contains("by API key key-id-4f2a (a state PATCH through the service)"),
        "{why}"
    );
    let found = ok(&db, &["search", &id, "item_77"]);
    assert_eq!(rows(&found), vec![(11, "state".to_owned())], "{found}");
}

/// The same run on PostgreSQL (its full-text index) prints what SQLite prints.
#[tokio::test]
async fn postgres_searches_and_explains_as_sqlite_does() {
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
    let schema = format!("recall_cli_{}", std::process::id());
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut connection)
        .await
        .unwrap();
    let location = format!("{url}?options=-c%20search_path%3D{schema}");
    let tmp = tempfile::tempdir().unwrap();
    let sqlite = tmp.path().join("skillstate.db");
    let lite = run_demo(&sqlite);
    let data = tmp.path().join("data");
    let pg = |args: &[&str]| {
        let out = skillstate_on(&location, &data, args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    pg(&["run", "skills/warehouse", "--model", DEMO]);
    let id = pg(&["tasks"])
        .lines()
        .nth(1)
        .and_then(|line| line.split_whitespace().next())
        .unwrap()
        .to_owned();
    let same = |text: String, id: &str| {
        let cursor = without_cursor(&text);
        cursor.replace(id, "[TASK]")
    };
    for args in [
        vec!["search", "{id}", "item_4298"],
        vec!["search", "{id}", "--pointer", "/inventory", "--limit", "5"],
        vec![
            "search",
            "{id}",
            "shelf",
            "--kind",
            "reasoning",
            "--oldest-first",
        ],
        vec!["show", "{id}", "--why", "/inventory/shelf_122", "--all"],
    ] {
        let with = |task: &str| -> Vec<String> {
            args.iter()
                .map(|a| a.replace("{id}", task))
                .collect::<Vec<_>>()
        };
        let on_pg = with(&id);
        let on_lite = with(&lite);
        let on_pg: Vec<&str> = on_pg.iter().map(String::as_str).collect();
        let on_lite: Vec<&str> = on_lite.iter().map(String::as_str).collect();
        let expected = same(ok(&sqlite, &on_lite), &lite);
        let found = same(pg(&on_pg), &id);
        assert!(found.lines().count() > 3, "{args:?}: {found}");
        // Times differ between the two runs: `step N  <time>  by …`.
        let times = |t: String| {
            t.lines()
                .map(|l| {
                    let parts: Vec<&str> = l.splitn(3, "  ").collect();
                    match parts.as_slice() {
                        [step, _, by] if step.starts_with("step ") => {
                            format!("{step}  [TIME]  {by}")
                        }
                        _ => l.to_owned(),
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(times(found), times(expected), "{args:?}");
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut connection)
        .await
        .unwrap();
}

/// `text` with the next-page cursor (entry ids differ between databases) left out.
fn without_cursor(text: &str) -> String {
    text.lines()
        .map(|line| match line.split_once("--after ") {
            Some((head, _)) => format!("{head}--after [CURSOR]"),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
