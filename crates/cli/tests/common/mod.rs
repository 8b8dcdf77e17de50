//! Helpers for tests that drive the real `skillstate` binary.
#![allow(dead_code, clippy::unwrap_used)]

/// Visible skips (see test-support/skip.rs): `skip::skip_test(reason, how_to_enable)`.
#[path = "../../../../test-support/skip.rs"]
pub mod skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use skillstate_envs::warehouse::{WarehouseConfig, generate_events, reference_answer};

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_skillstate")
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn skillstate(db: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(repo_root())
        .env("SKILLSTATE_DB", db)
        .args(args)
        .output()
        .expect("the skillstate binary runs")
}

/// A copy of the warehouse skill (named `warehouse`) whose environment uses `seed` and
/// `events`, plus a script of correct answers for it. Returns (skill dir, script path).
pub fn warehouse_copy(root: &Path, seed: u64, events: u32) -> (PathBuf, PathBuf) {
    let dir = root.join("warehouse");
    std::fs::create_dir_all(&dir).unwrap();
    let source = repo_root().join("skills/warehouse");
    for file in [
        "SKILL.md",
        "state.schema.json",
        "state.init.json",
        "skill.toml",
    ] {
        std::fs::copy(source.join(file), dir.join(file)).unwrap();
    }
    let settings = std::fs::read_to_string(dir.join("skill.toml")).unwrap();
    let settings = settings
        .replace("seed = 7", &format!("seed = {seed}"))
        .replace("events = 10", &format!("events = {events}"));
    std::fs::write(dir.join("skill.toml"), settings).unwrap();
    let script = root.join("answers.jsonl");
    let lines: Vec<String> = generate_events(&WarehouseConfig::new(seed, events))
        .iter()
        .map(reference_answer)
        .collect();
    std::fs::write(&script, lines.join("\n")).unwrap();
    (dir, script)
}
