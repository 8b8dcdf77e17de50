//! The store is never reachable from inside a sandbox, through the real `skillstate` binary run
//! from a project directory as a careless operator would: a shell skill that names no work
//! directory gets a fresh one of its task's own (never the current directory) and finds no
//! database file anywhere it can look; no work directory, fs root or sandbox read path may be,
//! contain or sit inside the database's directory or the configuration file; a skill may only
//! name directories the operator allowed, refused by `validate` already; and a stored skill
//! changed behind skillstate's back stops its task with a clear error.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{binary, repo_root};
use serde_json::json;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `skillstate ARGS` in `cwd` with nothing of the test's environment choosing the database or
/// the data directory.
fn in_dir(cwd: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(cwd)
        .env_remove("SKILLSTATE_DB")
        .env_remove("SKILLSTATE_DATA_DIR")
        .env_remove("SKILLSTATE_CONFIG")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `run SKILL --model MODEL --input INPUT EXTRA…` in `project`.
fn run(project: &Path, skill: &Path, model: &str, input: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        skill.to_str().unwrap(),
        "--model",
        model,
        "--input",
        input,
    ];
    args.extend_from_slice(extra);
    in_dir(project, &args)
}

/// A copy of code-investigator's procedure and state in `root/NAME/code-investigator` with
/// `skill_toml`.
fn skill(root: &Path, name: &str, skill_toml: &str) -> PathBuf {
    let dir = root.join(name).join("code-investigator");
    std::fs::create_dir_all(&dir).unwrap();
    let source = repo_root().join("skills/code-investigator");
    for file in ["SKILL.md", "state.schema.json", "state.init.json"] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("skill.toml"), skill_toml).unwrap();
    dir
}

/// A scripted model running `commands` with shell.exec, then finishing.
fn script(root: &Path, commands: &[&str]) -> String {
    let mut lines: Vec<String> = commands
        .iter()
        .map(|command| {
            json!({"reasoning": "look", "state_patch": {}, "action": {"tool": "shell.exec", "args": {"command": command}}})
                .to_string()
        })
        .collect();
    lines.push(
        json!({"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "done"}}})
            .to_string(),
    );
    let path = root.join("script.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    format!("scripted:{}", path.display())
}

fn last_task(project: &Path) -> String {
    let tasks = text(&in_dir(project, &["tasks"]).stdout);
    tasks
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The observation the command of `step` produced (what step + 1 starts from).
fn result_of(project: &Path, task: &str, step: u32) -> String {
    let step = (step + 1).to_string();
    text(&in_dir(project, &["show", task, "--step", &step, "--observation"]).stdout)
}

#[test]
fn a_shell_skill_run_from_a_project_gets_a_fresh_directory_and_no_database() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "project notes\n").unwrap();
    let skill = skill(
        tmp.path(),
        "investigator",
        "[tools]\nallow = [\"fs\", \"shell\"]\n\n[tools.shell]\ntimeout_secs = 30\n",
    );
    let model = script(
        tmp.path(),
        &[
            "pwd; ls -A; echo listed",
            "find / -name '*.db*' -not -path '/proc/*' 2>/dev/null; echo searched",
            "sqlite3 ../../db/skillstate.db 'DROP TRIGGER skill_versions_frozen' 2>&1; ls ../.. 2>&1; echo tried",
        ],
    );
    let first = run(&project, &skill, &model, "Look around.", &[]);
    let (stdout, stderr) = (text(&first.stdout), text(&first.stderr));
    assert!(first.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("completed after 4 step(s)"),
        "{stdout}{stderr}"
    );
    // The database is where the data directory keeps it, not in the project.
    let db = project.join(".skillstate/db/skillstate.db");
    assert!(db.is_file(), "{stdout}{stderr}");
    assert!(!project.join("skillstate.db").exists());
    let task = last_task(&project);

    let listed = result_of(&project, &task, 1);
    let work_parent = project.join(".skillstate/work").canonicalize().unwrap();
    assert!(
        listed.contains(&work_parent.display().to_string()) && listed.contains("listed"),
        "the command ran in a directory of the task's own: {listed}"
    );
    assert!(
        !listed.contains("notes.txt"),
        "the project is not the work directory: {listed}"
    );
    let searched = result_of(&project, &task, 2);
    assert!(searched.contains("searched"), "{searched}");
    assert!(
        !searched.contains("skillstate.db"),
        "the database is visible in the sandbox: {searched}"
    );
    let tried = result_of(&project, &task, 3);
    assert!(tried.contains("tried"), "{tried}");
    // The trigger is still there: nothing reached the file.
    let triggers = Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .output();
    if let Ok(triggers) = triggers {
        assert!(
            text(&triggers.stdout).contains("skill_versions_frozen"),
            "{}",
            text(&triggers.stdout)
        );
    }
    // Each task gets its own: a second run works in another directory.
    let again = run(&project, &skill, &model, "Look around.", &[]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let second = last_task(&project);
    assert_ne!(second, task);
    let first_dir = listed
        .lines()
        .find(|l| l.starts_with('/'))
        .unwrap()
        .to_owned();
    let second_listed = result_of(&project, &second, 1);
    assert!(
        !second_listed.contains(&first_dir),
        "{first_dir} is shared: {second_listed}"
    );
}

#[test]
fn no_work_directory_or_read_path_may_reach_the_database_or_the_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    let skill = skill(
        tmp.path(),
        "investigator",
        "[tools]\nallow = [\"fs\", \"shell\"]\n",
    );
    let model = script(tmp.path(), &["true"]);
    let run_in = |work: &str, extra: &[&str]| {
        run(
            &project,
            &skill,
            &model,
            "x",
            &[&["--work-dir", work], extra].concat(),
        )
    };
    // The project holds the data directory (and so the database's directory).
    std::fs::create_dir_all(project.join(".skillstate/db")).unwrap();
    for (work, relation) in [
        (".", "contains"),
        (".skillstate", "contains"),
        (".skillstate/db", "is"),
    ] {
        let out = run_in(work, &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{work}: {stderr}");
        assert!(
            stderr.contains(&format!(" {relation} the database directory")),
            "{work}: {stderr}"
        );
    }
    // A database named with --db: its directory is protected wherever it is.
    let elsewhere = tmp.path().join("state");
    std::fs::create_dir_all(elsewhere.join("inner")).unwrap();
    let db = elsewhere.join("app.db");
    let out = run_in(
        elsewhere.join("inner").to_str().unwrap(),
        &["--db", db.to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(" sits inside the database directory"),
        "{stderr}"
    );
    // The configuration file.
    let conf_dir = tmp.path().join("conf");
    std::fs::create_dir_all(&conf_dir).unwrap();
    let config = conf_dir.join("ops.toml");
    std::fs::write(&config, "[tools]\nsandbox_cpu_secs = 60\n").unwrap();
    let out = run_in(
        conf_dir.to_str().unwrap(),
        &["--config", config.to_str().unwrap()],
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("contains the configuration file"),
        "{stderr}"
    );
    // A refused run stores nothing: it is refused before any database is opened.
    assert!(!project.join(".skillstate/db/skillstate.db").exists());
    assert!(!db.exists());
    // A subdirectory of the project apart from both is fine.
    let out = run_in("src", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A read path of the sandbox that shows the database is refused too.
    std::fs::write(
        project.join("skillstate.toml"),
        format!(
            "[tools]\nsandbox_read_paths = [\"{}\"]\n",
            project.join(".skillstate").display()
        ),
    )
    .unwrap();
    let tools = in_dir(&project, &["tools", skill.to_str().unwrap()]);
    let stdout = text(&tools.stdout);
    assert!(
        stdout.contains("UNAVAILABLE") && stdout.contains("contains the database directory"),
        "{stdout}{}",
        text(&tools.stderr)
    );
    // `tools` keeps no work directory of its own (and the runs above named theirs).
    let kept: Vec<_> = std::fs::read_dir(project.join(".skillstate/work"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(kept.is_empty(), "{kept:?}");
}

#[test]
fn a_skill_names_only_directories_the_operator_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    let host = tmp.path().join("host/data");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    let validate = |skill: &Path, config: Option<&Path>| {
        let mut args = vec!["validate", skill.to_str().unwrap()];
        if let Some(config) = config {
            args.extend(["--config", config.to_str().unwrap()]);
        }
        in_dir(&project, &args)
    };
    // An absolute directory: only under a work root of the operator's.
    let absolute = skill(
        tmp.path(),
        "absolute",
        &format!(
            "[tools]\nallow = [\"fs\"]\nwork_dir = \"{}\"\n",
            host.display()
        ),
    );
    let out = validate(&absolute, None);
    let stdout = text(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("skill.toml")
            && stdout.contains("lies outside every work root")
            && stdout.contains("work_roots"),
        "{stdout}"
    );
    let config = tmp.path().join("ops.toml");
    std::fs::write(
        &config,
        format!(
            "[tools]\nwork_roots = [\"{}\"]\n",
            tmp.path().join("host").display()
        ),
    )
    .unwrap();
    let out = validate(&absolute, Some(&config));
    assert!(out.status.success(), "{}", text(&out.stdout));
    // The run refuses it as validate does.
    let model = script(tmp.path(), &[]);
    let out = run(&project, &absolute, &model, "x", &[]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("lies outside every work root"),
        "{}",
        text(&out.stderr)
    );

    // Relative: inside the skill only, by name and through symlinks.
    let escaping = skill(
        tmp.path(),
        "escaping",
        "[tools]\nallow = [\"shell\"]\nwork_dir = \"../../host/data\"\n",
    );
    let out = validate(&escaping, None);
    let stdout = text(&out.stdout);
    assert!(
        !out.status.success() && stdout.contains("leads outside the skill directory"),
        "{stdout}"
    );
    let linked = skill(
        tmp.path(),
        "linked",
        "[tools]\nallow = [\"shell\"]\nwork_dir = \"seed\"\n",
    );
    std::os::unix::fs::symlink(&host, linked.join("seed")).unwrap();
    let out = validate(&linked, None);
    let stdout = text(&out.stdout);
    assert!(
        !out.status.success() && stdout.contains("leads outside the skill directory"),
        "{stdout}"
    );
    // A seed inside the skill is copied into each task's own directory; the skill's copy is
    // never written.
    let seeded = skill(
        tmp.path(),
        "seeded",
        "[tools]\nallow = [\"fs\", \"shell\"]\nwork_dir = \"seed\"\n\n[tools.shell]\ntimeout_secs = 30\n",
    );
    std::fs::create_dir_all(seeded.join("seed")).unwrap();
    std::fs::write(seeded.join("seed/start.txt"), "from the seed\n").unwrap();
    let out = validate(&seeded, None);
    assert!(out.status.success(), "{}", text(&out.stdout));
    let model = script(
        tmp.path(),
        &["cat start.txt; echo changed > start.txt; touch new.txt"],
    );
    let out = run(&project, &seeded, &model, "x", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let task = last_task(&project);
    assert!(result_of(&project, &task, 1).contains("from the seed"));
    assert_eq!(
        std::fs::read_to_string(seeded.join("seed/start.txt")).unwrap(),
        "from the seed\n"
    );
    assert!(!seeded.join("seed/new.txt").exists());

    // A path the skill's own [environment] names (the warehouse's audit log, which the
    // environment writes to) is the operator's to allow too.
    let (warehouse, _) = common::warehouse_copy(&tmp.path().join("wh"), 1, 3);
    let settings = std::fs::read_to_string(warehouse.join("skill.toml")).unwrap();
    std::fs::write(
        warehouse.join("skill.toml"),
        format!(
            "{settings}audit_log = \"{}\"\n",
            host.join("audit.log").display()
        ),
    )
    .unwrap();
    let out = validate(&warehouse, None);
    let stdout = text(&out.stdout);
    assert!(
        !out.status.success()
            && stdout.contains("[environment] audit_log")
            && stdout.contains("lies outside every work root"),
        "{stdout}"
    );
    let out = validate(&warehouse, Some(&config));
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn a_stored_skill_changed_behind_skillstates_back_stops_its_task() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let dir = tmp.path().join("guarded");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: guarded\ndescription: Keeps an owner nobody may change.\n---\nAsk the user, then finish.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("state.schema.json"),
        json!({
            "type": "object",
            "properties": {"owner": {"type": "string", "readOnly": true}, "note": {"type": "string"}},
            "required": ["owner"]
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("state.init.json"), r#"{"owner": "ops"}"#).unwrap();
    std::fs::write(dir.join("skill.toml"), "[run]\nmax_steps = 5\n").unwrap();
    let lines = [
        json!({"reasoning": "ask", "state_patch": {}, "action": {"tool": "ask_user", "args": {"question": "who?"}}}),
        json!({"reasoning": "take it", "state_patch": {"owner": "attacker"}, "action": {"tool": "finish", "args": {"result": "mine"}}}),
    ];
    let script = tmp.path().join("script.jsonl");
    std::fs::write(
        &script,
        lines
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let model = format!("scripted:{}", script.display());
    let out = run(&project, &dir, &model, "x", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let task = last_task(&project);
    // What a command with write access to the file could do: drop the trigger, flip readOnly.
    let db = project.join(".skillstate/db/skillstate.db");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use sqlx::Connection;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::raw_sql("DROP TRIGGER skill_versions_frozen")
            .execute(&mut conn)
            .await
            .unwrap();
        let changed = sqlx::query(
            "UPDATE skill_versions SET skill = replace(skill, '\"readOnly\":true', '\"readOnly\":false')",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        assert_eq!(changed.rows_affected(), 1);
        conn.close().await.unwrap();
    });
    let reply = in_dir(&project, &["reply", &task, "me"]);
    let stderr = text(&reply.stderr);
    assert!(!reply.status.success(), "{stderr}");
    assert!(
        stderr.contains(&task) && stderr.contains("do not match the hash recorded"),
        "{stderr}"
    );
    // The read-only field was not rewritten, and no step was added.
    let (state, version): (String, i64) = runtime.block_on(async {
        use sqlx::Connection;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        let row = sqlx::query_as("SELECT state, version FROM tasks WHERE id = ?")
            .bind(&task)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        row
    });
    assert!(
        state.contains("\"ops\"") && !state.contains("attacker"),
        "{state}"
    );
    assert_eq!(version, 1, "only the ask_user step");
}
