//! A skill's state migrations: `migrations/<version>.json` in the skill directory, each a JSON
//! Patch (array) or a merge patch (object). `X.json` reads the state of version X and of every
//! later version before the next migration (they share one shape: the shape changes where a
//! migration starts), and writes the state the next migration reads — or, for the newest, the
//! state this version expects. A task on version `v` runs the migration whose range holds `v`
//! and every newer one, in version order (all of them for a task whose skill had no version,
//! or that is older than the oldest), so a chain of versions composes: 1.0.0.json then
//! 1.5.0.json take a 1.0.0 or 1.2.0 task to this version, and a 1.5.0 or 1.7.0 task runs the
//! second only.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Location, SkillProblem, SkillVersion};
use crate::patch::StatePatch;

/// The directory of a skill's migrations.
pub const MIGRATIONS_DIR: &str = "migrations";

/// One migration: the version it starts from and its patch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Migration {
    pub from: SkillVersion,
    /// An RFC 6902 JSON Patch (array) or an RFC 7396 merge patch (object).
    pub patch: Value,
}

impl Migration {
    /// The file it was loaded from, as a message names it.
    pub fn file_name(&self) -> String {
        format!("{MIGRATIONS_DIR}/{}.json", self.from)
    }
}

/// Reads `dir/migrations/`, reporting every bad file in `problems`; sorted by version. None
/// (empty) without the directory. `version` is the skill's own (`skill.toml`): migrations need
/// one, and each starts from an older version.
pub(super) fn load(
    dir: &Path,
    version: Option<&SkillVersion>,
    problems: &mut Vec<SkillProblem>,
) -> Vec<Migration> {
    let root = dir.join(MIGRATIONS_DIR);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            problems.push(SkillProblem::error(
                root,
                None,
                format!("cannot read the directory: {e}"),
            ));
            return Vec::new();
        }
    };
    let mut names: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut migrations = Vec::new();
    for name in names {
        let path = root.join(&name);
        let Some(stem) = name.strip_suffix(".json") else {
            problems.push(SkillProblem::error(
                path,
                None,
                "only migrations belong here: name each by the version it starts from, such as 1.2.0.json",
            ));
            continue;
        };
        let from = match SkillVersion::parse(stem) {
            Ok(from) => from,
            Err(message) => {
                problems.push(SkillProblem::error(
                    path,
                    None,
                    format!(
                        "a migration is named by the version it starts from, such as 1.2.0.json: {message}"
                    ),
                ));
                continue;
            }
        };
        match version {
            None => {
                problems.push(SkillProblem::error(
                    path,
                    None,
                    "a skill with migrations needs its own `version` in skill.toml (say version = \"2.0.0\"), newer than every migration",
                ));
                continue;
            }
            Some(version) if from >= *version => {
                problems.push(SkillProblem::error(
                    path,
                    None,
                    format!(
                        "this migration starts from {from}, which is not older than the skill's version {version} (skill.toml): a migration leads from an older version to this one"
                    ),
                ));
                continue;
            }
            Some(_) => {}
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                problems.push(SkillProblem::error(
                    path,
                    None,
                    format!("cannot read the file: {e}"),
                ));
                continue;
            }
        };
        let patch = match crate::strict_json::parse_strict(&text) {
            Ok(patch) => patch,
            Err(e) => {
                problems.push(SkillProblem::error(
                    path,
                    None,
                    format!("invalid JSON: {e}"),
                ));
                continue;
            }
        };
        if let Err(problem) = StatePatch::from_value(&patch) {
            problems.push(SkillProblem::error(
                path,
                Some(Location::Pointer(problem.pointer)),
                format!(
                    "{} (a migration is a JSON Patch array or a merge patch object)",
                    problem.message
                ),
            ));
            continue;
        }
        migrations.push(Migration { from, patch });
    }
    migrations.sort_by(|a, b| a.from.cmp(&b.from));
    migrations
}
