//! `skill_version` pinning in a batch's inputs, through the real binary on SQLite files (and
//! the main case on PostgreSQL): a line pinned to the skill directory's version, lines pinned
//! (by skill.toml version and by hash prefix) to an older version the database keeps,
//! `--skill-version` for lines without a pin, and pins that match nothing refused by file, line
//! and field with nothing stored.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use batch_support::*;
use serde_json::{Value, json};

const EVENTS: u32 = 2;

/// A database with one batch of two tasks on version 1.0.0 of the warehouse skill (one line
/// pinned to it, one not), and a directory with version 2.0.0 (one more sentence of procedure).
struct Versions {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    db: String,
    v2: PathBuf,
}

fn with_version(dir: &Path, version: &str) {
    let settings = std::fs::read_to_string(dir.join("skill.toml")).unwrap();
    std::fs::write(
        dir.join("skill.toml"),
        format!("version = \"{version}\"\n{settings}"),
    )
    .unwrap();
}

fn write_lines(path: &Path, lines: &[Value]) {
    let body: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(path, body.join("\n") + "\n").unwrap();
}

fn batch_file(root: &Path, name: &str, skill: &Path, inputs: &str) -> String {
    let file = format!("{name}.yaml");
    std::fs::write(
        root.join(&file),
        format!(
            "skill: {}\nmodel: oracle\ninputs: {inputs}\n",
            skill.display()
        ),
    )
    .unwrap();
    file
}

fn versions() -> Versions {
    versions_in(None)
}

/// [`versions`] in the database `db` (default: a SQLite file in the test's directory).
fn versions_in(db: Option<&str>) -> Versions {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let (v1, _) = common::warehouse_copy(&root, 1, EVENTS);
    with_version(&v1, "1.0.0");
    let v2 = root.join("v2").join("warehouse");
    std::fs::create_dir_all(&v2).unwrap();
    for entry in std::fs::read_dir(&v1).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), v2.join(entry.file_name())).unwrap();
    }
    let settings = std::fs::read_to_string(v2.join("skill.toml")).unwrap();
    std::fs::write(
        v2.join("skill.toml"),
        settings.replace("version = \"1.0.0\"", "version = \"2.0.0\""),
    )
    .unwrap();
    let procedure = std::fs::read_to_string(v2.join("SKILL.md")).unwrap();
    std::fs::write(
        v2.join("SKILL.md"),
        format!("{procedure}\nDouble-check the shelf before every move.\n"),
    )
    .unwrap();
    let config = root.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    let db = db.map_or_else(|| root.join("b.db").display().to_string(), str::to_owned);
    write_lines(
        &root.join("v1.jsonl"),
        &[
            json!({"environment": {"seed": 1}, "skill_version": "1.0.0"}),
            json!({"environment": {"seed": 2}}),
        ],
    );
    let file = batch_file(&root, "v1", &v1, "v1.jsonl");
    let submit = cli(&root, &config, &["--db", &db, "batch", "submit", &file]);
    expect_exit(&submit, 0, "batch submit of version 1.0.0");
    Versions {
        _tmp: tmp,
        root,
        config,
        db,
        v2,
    }
}

/// `skillstate skills`: version → (hash prefix, tasks on it).
fn skills(v: &Versions) -> HashMap<String, (String, u64)> {
    let listed = cli(&v.root, &v.config, &["--db", &v.db, "skills"]);
    expect_exit(&listed, 0, "skills");
    text(&listed.stdout)
        .lines()
        .skip(1)
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells[0], "warehouse", "{line}");
            (
                cells[1].to_owned(),
                (cells[2].to_owned(), cells[3].parse().unwrap()),
            )
        })
        .collect()
}

/// The skill.toml version of each task of `batch`, by its line.
async fn versions_by_line(db: &str, batch: &str) -> HashMap<u64, String> {
    let store = skillstate_store::open_existing(db, &Default::default())
        .await
        .unwrap();
    let mut by_line = HashMap::new();
    for summary in store.batch_tasks(batch).await.unwrap() {
        let task = store.task(&summary.id).await.unwrap();
        let line = task.labels["line"].as_u64().unwrap();
        let version = task.skill.settings.version.unwrap().to_string();
        by_line.insert(line, version);
    }
    store.release().await;
    by_line
}

async fn stored_counts(db: &str) -> (usize, usize) {
    let store = skillstate_store::open_existing(db, &Default::default())
        .await
        .unwrap();
    let counts = (
        store.list_batches().await.unwrap().len(),
        store.list_tasks().await.unwrap().len(),
    );
    store.release().await;
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_pinned_to_an_older_stored_version_run_it() {
    pinned_lines_run_their_version(versions()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_pinned_to_an_older_stored_version_run_it_on_postgres() {
    let Some(url) = postgres_url() else {
        return;
    };
    let schema = format!("batch_skill_version_{}", std::process::id());
    let db = fresh_schema(&url, &schema).await;
    pinned_lines_run_their_version(versions_in(Some(&db))).await;
    drop_schema(&url, &schema).await;
}

async fn pinned_lines_run_their_version(v: Versions) {
    let listed = skills(&v);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (v1_hash, v1_tasks) = listed["1.0.0"].clone();
    assert_eq!(v1_tasks, 2, "the pinned line and the unpinned one");

    // The 2.0.0 directory: lines pinned to 1.0.0 by version and by hash prefix, one not pinned.
    write_lines(
        &v.root.join("v2.jsonl"),
        &[
            json!({"environment": {"seed": 3}, "skill_version": "1.0.0"}),
            json!({"environment": {"seed": 4}}),
            json!({"environment": {"seed": 5}, "skill_version": &v1_hash[..8]}),
            json!({"environment": {"seed": 6}, "skill_version": "2.0.0"}),
        ],
    );
    let file = batch_file(&v.root, "v2", &v.v2, "v2.jsonl");
    let submit = cli(
        &v.root,
        &v.config,
        &["--db", &v.db, "batch", "submit", &file],
    );
    expect_exit(&submit, 0, "batch submit with pinned lines");
    let batch = text(&submit.stdout).trim().to_owned();

    let listed = skills(&v);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        listed["1.0.0"],
        (v1_hash.clone(), 4),
        "two more tasks on the stored 1.0.0, no new version"
    );
    assert_eq!(listed["2.0.0"].1, 2);
    let by_line = versions_by_line(&v.db, &batch).await;
    assert_eq!(by_line[&1], "1.0.0");
    assert_eq!(by_line[&2], "2.0.0");
    assert_eq!(by_line[&3], "1.0.0");
    assert_eq!(by_line[&4], "2.0.0");

    // The pinned tasks run 1.0.0's procedure to the end.
    let log = v.root.join("worker.log");
    let mut worker = spawn_worker(
        &v.root,
        &v.config,
        &v.db,
        &["--until-idle", "--batch", &batch],
        &[],
        &log,
    );
    let status = wait_exit(&mut worker, Duration::from_secs(120), "worker");
    assert!(
        status.success(),
        "worker: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let store = skillstate_store::open_existing(&v.db, &Default::default())
        .await
        .unwrap();
    for summary in store.batch_tasks(&batch).await.unwrap() {
        let task = store.task(&summary.id).await.unwrap();
        assert_eq!(task.status.as_str(), "completed", "{}", summary.id);
        let on_v1 = task.skill.settings.version.unwrap().to_string() == "1.0.0";
        assert_eq!(
            !task.skill.procedure.contains("Double-check the shelf"),
            on_v1,
            "{}",
            summary.id
        );
        assert_eq!(store.task_versions(&summary.id).await.unwrap().len(), 1);
    }
    store.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skill_version_flag_pins_the_lines_without_a_pin() {
    let v = versions();
    write_lines(
        &v.root.join("v2.jsonl"),
        &[
            json!({"environment": {"seed": 3}}),
            json!({"environment": {"seed": 4}, "skill_version": "2.0.0"}),
            json!({"environment": {"seed": 5}}),
        ],
    );
    let file = batch_file(&v.root, "v2", &v.v2, "v2.jsonl");
    let submit = cli(
        &v.root,
        &v.config,
        &[
            "--db",
            &v.db,
            "batch",
            "submit",
            &file,
            "--skill-version",
            "1.0.0",
        ],
    );
    expect_exit(&submit, 0, "batch submit --skill-version 1.0.0");
    let batch = text(&submit.stdout).trim().to_owned();
    let by_line = versions_by_line(&v.db, &batch).await;
    assert_eq!(by_line[&1], "1.0.0");
    assert_eq!(by_line[&2], "2.0.0", "a line's own pin wins");
    assert_eq!(by_line[&3], "1.0.0");
    let listed = skills(&v);
    assert_eq!(listed["1.0.0"].1, 4);
    assert_eq!(listed["2.0.0"].1, 1);

    // A flag that matches nothing names itself, with the line it failed on.
    let refused = cli(
        &v.root,
        &v.config,
        &[
            "--db",
            &v.db,
            "batch",
            "submit",
            &file,
            "--skill-version",
            "9.9.9",
        ],
    );
    expect_exit(&refused, 1, "batch submit --skill-version 9.9.9");
    let error = text(&refused.stderr);
    assert!(
        error.contains(
            "v2.jsonl:1: skill_version (--skill-version): no version of skill `warehouse` is `9.9.9`"
        ),
        "{error}"
    );
    let refused = cli(
        &v.root,
        &v.config,
        &[
            "--db",
            &v.db,
            "batch",
            "submit",
            &file,
            "--skill-version",
            "1.2",
        ],
    );
    expect_exit(&refused, 1, "batch submit --skill-version 1.2");
    assert!(
        text(&refused.stderr).contains("--skill-version: `1.2` is not a semantic version"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(stored_counts(&v.db).await, (2, 5), "nothing more stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_that_matches_nothing_is_refused_and_nothing_is_stored() {
    let v = versions();
    let v1_hash = skills(&v)["1.0.0"].0.clone();
    let file = batch_file(&v.root, "v2", &v.v2, "v2.jsonl");
    let submit_refused = |lines: &[Value], db: &str| {
        write_lines(&v.root.join("v2.jsonl"), lines);
        let refused = cli(&v.root, &v.config, &["--db", db, "batch", "submit", &file]);
        expect_exit(&refused, 1, "batch submit with a bad pin");
        text(&refused.stderr)
    };

    // A version neither the directory nor the database has: the line, the field, what exists.
    let error = submit_refused(
        &[
            json!({"environment": {"seed": 3}, "skill_version": "1.0.0"}),
            json!({"environment": {"seed": 4}, "skill_version": "3.0.0"}),
        ],
        &v.db,
    );
    let v2_line = "v2.jsonl:2: skill_version: no version of skill `warehouse` is `3.0.0`: the skill directory ";
    assert!(error.contains(v2_line), "{error}");
    assert!(error.contains("holds 2.0.0 ("), "{error}");
    assert!(
        error.contains(&format!("b.db keeps 1.0.0 ({v1_hash})")),
        "{error}"
    );
    assert!(
        error.contains("pin one of these") && error.contains("a directory that holds it"),
        "{error}"
    );
    assert_eq!(
        stored_counts(&v.db).await,
        (1, 2),
        "the first, good line was not stored either"
    );

    // A hash prefix of no version, and one too short to be a prefix.
    let error = submit_refused(&[json!({"skill_version": "fedcba9876"})], &v.db);
    assert!(
        error
            .contains("v2.jsonl:1: skill_version: no version of skill `warehouse` is `fedcba9876`"),
        "{error}"
    );
    let error = submit_refused(&[json!({"skill_version": &v1_hash[..4]})], &v.db);
    assert!(
        error.contains("v2.jsonl:1: skill_version: ")
            && error.contains("too short for a hash prefix"),
        "{error}"
    );
    let error = submit_refused(&[json!({"skill_version": 1})], &v.db);
    assert!(
        error.contains("v2.jsonl:1: skill_version: 1 is not a string"),
        "{error}"
    );
    assert_eq!(stored_counts(&v.db).await, (1, 2));

    // A database that does not exist keeps no version, and is not created by the refusal.
    let fresh = v.root.join("fresh.db");
    let error = submit_refused(
        &[json!({"skill_version": "1.0.0"})],
        fresh.to_str().unwrap(),
    );
    assert!(
        error.contains("v2.jsonl:1: skill_version: no version of skill `warehouse` is `1.0.0`")
            && error.contains("fresh.db does not exist yet"),
        "{error}"
    );
    assert!(!fresh.exists(), "a refused batch creates no database");
}

/// A copy of the triage fixture (no built-in environment: its tasks share a tool box) with
/// skill.toml `version`, under `root/<label>/triage`.
fn triage(root: &Path, label: &str, version: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/batch/triage");
    let dir = root.join(label).join("triage");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    with_version(&dir, version);
    let procedure = std::fs::read_to_string(dir.join("SKILL.md")).unwrap();
    std::fs::write(dir.join("SKILL.md"), format!("{procedure}\n{label}\n")).unwrap();
    dir
}

/// A skill without an environment, inputs as a directory (one task per file): the tasks of
/// `--skill-version` get the stored version with the tools its tool box presents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_with_a_tool_box_and_a_directory_of_inputs_is_pinned_by_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let v1 = triage(root, "v1", "1.0.0");
    let v2 = triage(root, "v2", "2.0.0");
    std::fs::create_dir(root.join("inputs")).unwrap();
    std::fs::write(root.join("inputs/a.txt"), "I want a refund").unwrap();
    std::fs::write(root.join("inputs/b.txt"), "Where is my parcel?").unwrap();
    let config = root.join("skillstate.toml");
    std::fs::write(&config, "[model]\nbase_url = \"http://127.0.0.1:9/v1\"\n").unwrap();
    let db = root.join("t.db").display().to_string();
    for (name, skill) in [("v1", &v1), ("v2", &v2)] {
        std::fs::write(
            root.join(format!("{name}.yaml")),
            format!(
                "skill: {}\nmodel: openai:fake-model\ninputs: inputs\n",
                skill.display()
            ),
        )
        .unwrap();
    }
    let submit = cli(root, &config, &["--db", &db, "batch", "submit", "v1.yaml"]);
    expect_exit(&submit, 0, "batch submit of triage 1.0.0");
    let submit = cli(
        root,
        &config,
        &[
            "--db",
            &db,
            "batch",
            "submit",
            "v2.yaml",
            "--skill-version",
            "1.0.0",
        ],
    );
    expect_exit(&submit, 0, "batch submit of triage 2.0.0 pinned to 1.0.0");
    let batch = text(&submit.stdout).trim().to_owned();
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    let versions = store.skill_versions().await.unwrap();
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0].version.as_deref(), Some("1.0.0"));
    assert_eq!(versions[0].tasks, 4);
    for summary in store.batch_tasks(&batch).await.unwrap() {
        let task = store.task(&summary.id).await.unwrap();
        assert!(
            task.skill.procedure.trim_end().ends_with("v1"),
            "{}",
            summary.id
        );
    }
    store.release().await;

    let refused = cli(
        root,
        &config,
        &[
            "--db",
            &db,
            "batch",
            "submit",
            "v2.yaml",
            "--skill-version",
            "3.0.0",
        ],
    );
    expect_exit(&refused, 1, "batch submit --skill-version 3.0.0");
    assert!(
        text(&refused.stderr).contains(
            "inputs/a.txt: skill_version (--skill-version): no version of skill `triage` is `3.0.0`"
        ),
        "{}",
        text(&refused.stderr)
    );
}
