//! Loading skills from real directories: the shipped example loads, and each way of breaking a
//! skill gives one clear error naming the file and the line or JSON pointer.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use skillstate_core::Skill;
use skillstate_core::skill::{Location, Severity, SkillProblem};

fn example_skill() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse")
}

/// Copies the warehouse skill into `<tmp>/<name>` so a test can break one file of it.
fn copy_skill(tmp: &Path, name: &str) -> PathBuf {
    let dir = tmp.join(name);
    fs::create_dir_all(&dir).unwrap();
    for file in [
        "SKILL.md",
        "state.schema.json",
        "state.init.json",
        "skill.toml",
    ] {
        fs::copy(example_skill().join(file), dir.join(file)).unwrap();
    }
    dir
}

fn errors_of(dir: &Path) -> Vec<SkillProblem> {
    let errors = Skill::load(dir)
        .err()
        .expect("the broken skill must not load");
    errors
        .problems
        .into_iter()
        .filter(|p| p.severity == Severity::Error)
        .collect()
}

fn only_error(dir: &Path) -> SkillProblem {
    let mut errors = errors_of(dir);
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one error, got {errors:#?}"
    );
    errors.remove(0)
}

#[test]
fn the_example_skill_loads() {
    let loaded = Skill::load(&example_skill()).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let skill = loaded.skill;
    assert_eq!(skill.name(), "warehouse");
    assert!(skill.definition.procedure.contains("inventory"));
    assert_eq!(skill.settings().tools.allow, vec!["warehouse"]);
    assert_eq!(
        skill.schema.declared_read_only_properties(),
        vec!["/shelf_count"]
    );
}

#[test]
fn bad_yaml_names_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(
        dir.join("SKILL.md"),
        "---\nname: warehouse\ndescription: [unclosed\n---\nDo things.\n",
    )
    .unwrap();
    let error = only_error(&dir);
    assert!(error.file.ends_with("SKILL.md"));
    assert!(error.message.contains("invalid YAML"), "{error}");
    assert!(
        matches!(error.location, Some(Location::Line { line, .. }) if line >= 3),
        "{error}"
    );
}

#[test]
fn missing_frontmatter_is_explained() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(dir.join("SKILL.md"), "# Warehouse\nJust a procedure.\n").unwrap();
    let error = only_error(&dir);
    assert!(error.to_string().contains("SKILL.md:1"), "{error}");
    assert!(
        error.message.contains("must start with YAML frontmatter"),
        "{error}"
    );
}

#[test]
fn missing_schema_is_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::remove_file(dir.join("state.schema.json")).unwrap();
    let error = only_error(&dir);
    assert!(error.file.ends_with("state.schema.json"));
    assert!(error.message.contains("file not found"), "{error}");
}

#[test]
fn schema_that_is_not_json_schema_names_the_pointer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(
        dir.join("state.schema.json"),
        r#"{"type": "object", "properties": {"inventory": {"type": "dictionary"}}}"#,
    )
    .unwrap();
    let error = only_error(&dir);
    assert!(
        error.message.contains("not a valid JSON Schema 2020-12"),
        "{error}"
    );
    assert_eq!(
        error.location,
        Some(Location::Pointer("/properties/inventory/type".into())),
        "{error}"
    );
}

#[test]
fn schema_that_is_not_json_names_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(
        dir.join("state.schema.json"),
        "{\n  \"type\": \"object\",\n  oops\n}\n",
    )
    .unwrap();
    let error = only_error(&dir);
    assert_eq!(
        error.location,
        Some(Location::Line {
            line: 3,
            column: Some(3)
        }),
        "{error}"
    );
}

#[test]
fn initial_state_violating_the_schema_names_the_pointer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(
        dir.join("state.init.json"),
        r#"{"shelf_count": 500, "inventory": {"shelf_3": 42}}"#,
    )
    .unwrap();
    let error = only_error(&dir);
    assert!(error.file.ends_with("state.init.json"));
    assert_eq!(
        error.location,
        Some(Location::Pointer("/inventory/shelf_3".into())),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("state.init.json#/inventory/shelf_3"),
        "{error}"
    );
}

#[test]
fn missing_initial_state_must_fit_the_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::remove_file(dir.join("state.init.json")).unwrap();
    let errors = errors_of(&dir);
    assert!(!errors.is_empty());
    assert!(
        errors
            .iter()
            .all(|e| e.message.contains("add state.init.json")),
        "{errors:#?}"
    );
}

#[test]
fn name_must_match_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "depot");
    let error = only_error(&dir);
    assert!(
        error
            .message
            .contains("must equal the directory name `depot`"),
        "{error}"
    );
    assert_eq!(
        error.location,
        Some(Location::Line {
            line: 2,
            column: None
        })
    );
}

#[test]
fn invalid_names_and_descriptions_are_reported_together() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    let body = fs::read_to_string(dir.join("SKILL.md")).unwrap();
    let procedure = body.splitn(3, "---\n").nth(2).unwrap().to_owned();
    fs::write(
        dir.join("SKILL.md"),
        format!("---\nname: Ware_House\ndescription: \"\"\nowner: ops\n---\n{procedure}"),
    )
    .unwrap();
    let problems = Skill::load(&dir).err().unwrap().problems;
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("SKILL.md:2") && m.contains("lowercase")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("SKILL.md:3") && m.contains("empty")),
        "{messages:#?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("warning") && m.contains("owner")),
        "{messages:#?}"
    );
}

#[test]
fn skill_toml_typos_name_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(
        dir.join("skill.toml"),
        "[run]\nmax_retries = 2\nmax_stepz = 9\n",
    )
    .unwrap();
    let error = only_error(&dir);
    assert!(error.to_string().contains("skill.toml:3"), "{error}");
    assert!(error.message.contains("max_stepz"), "{error}");
}

#[test]
fn initial_state_over_budget_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_skill(tmp.path(), "warehouse");
    fs::write(dir.join("skill.toml"), "[budgets]\nstate_tokens = 5\n").unwrap();
    let error = only_error(&dir);
    assert!(
        error.message.contains("over [budgets] state_tokens = 5"),
        "{error}"
    );
}

#[test]
fn not_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let error = only_error(&tmp.path().join("nowhere"));
    assert!(error.message.contains("not a directory"), "{error}");
}

/// Writes `skill.toml` with `version` first, and `migrations/` with `files`.
fn versioned(tmp: &Path, version: Option<&str>, files: &[(&str, &str)]) -> PathBuf {
    let dir = copy_skill(tmp, "warehouse");
    if let Some(version) = version {
        let settings = fs::read_to_string(dir.join("skill.toml")).unwrap();
        fs::write(
            dir.join("skill.toml"),
            format!("version = \"{version}\"\n{settings}"),
        )
        .unwrap();
    }
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).unwrap();
    for (name, text) in files {
        fs::write(migrations.join(name), text).unwrap();
    }
    dir
}

#[test]
fn migrations_load_in_version_order_as_part_of_the_skill() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = versioned(
        tmp.path(),
        Some("2.0.0"),
        &[
            ("1.10.0.json", r#"{"inventory": {}}"#),
            (
                "1.2.0.json",
                r#"[{"op": "add", "path": "/note", "value": 1}]"#,
            ),
        ],
    );
    let skill = Skill::load(&dir).unwrap().skill;
    assert_eq!(
        skill.settings().version.as_ref().map(ToString::to_string),
        Some("2.0.0".into())
    );
    let order: Vec<String> = skill
        .definition
        .migrations
        .iter()
        .map(|m| m.from.to_string())
        .collect();
    assert_eq!(order, ["1.2.0", "1.10.0"]);
}

#[test]
fn each_bad_migration_is_named_with_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = versioned(
        tmp.path(),
        Some("2.0.0"),
        &[
            ("notes.txt", "hello"),
            ("v1.json", "{}"),
            ("2.0.0.json", "{}"),
            ("1.0.0.json", r#"[{"op": "jump", "path": "/x"}]"#),
            ("1.1.0.json", r#"{"a": 1, "a": 2}"#),
        ],
    );
    let errors = errors_of(&dir);
    let named = |file: &str| {
        errors
            .iter()
            .find(|p| p.file.ends_with(format!("migrations/{file}")))
            .unwrap_or_else(|| panic!("no error for {file}: {errors:#?}"))
    };
    assert!(
        named("notes.txt")
            .message
            .contains("name each by the version")
    );
    assert!(named("v1.json").message.contains("not a semantic version"));
    assert!(
        named("2.0.0.json")
            .message
            .contains("not older than the skill's version 2.0.0")
    );
    let shape = named("1.0.0.json");
    assert_eq!(
        shape.location,
        Some(Location::Pointer("/0".into())),
        "{shape:?}"
    );
    assert!(shape.message.contains("jump"), "{shape:?}");
    assert!(named("1.1.0.json").message.contains("invalid JSON"));
    assert_eq!(errors.len(), 5, "{errors:#?}");

    // Migrations need the skill's own version.
    let tmp = tempfile::tempdir().unwrap();
    let dir = versioned(tmp.path(), None, &[("1.0.0.json", "{}")]);
    assert!(
        only_error(&dir)
            .message
            .contains("needs its own `version` in skill.toml")
    );
    // And a version that is not semantic is an error of skill.toml.
    let tmp = tempfile::tempdir().unwrap();
    let dir = versioned(tmp.path(), Some("two"), &[]);
    let error = only_error(&dir);
    assert!(error.file.ends_with("skill.toml"), "{error:?}");
    assert!(error.message.contains("not a semantic version"), "{error}");
}
