//! Loading a skill directory: SKILL.md, state.schema.json, state.init.json, skill.toml.
//!
//! Loading reports every problem it can find in one pass, each with its file and a line or a
//! JSON pointer, so a user fixes a skill in one round instead of one error at a time.

mod frontmatter;
mod migrations;
mod ranges;
mod settings;
mod version;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use frontmatter::name_problem;
pub use migrations::{MIGRATIONS_DIR, Migration};
pub use ranges::{Allowed, RangeProblem, SettingRange, check_ranges};
pub use settings::{
    BoardEntryPosition, Budgets, DEFAULT_MAX_RETRIES, DEFAULT_MAX_STEPS,
    DEFAULT_OBSERVATION_TOKENS, DEFAULT_STATE_TOKENS, EnvironmentSettings, RunLimits,
    ShellSettings, SkillSettings, ToolSelection, UnknownOutcome, board_entries, line_column,
};
pub use settings::{SKILL_RANGES, SettingsProblem};
pub use version::SkillVersion;

use crate::schema::StateSchema;
use crate::tokens::count_tokens;

pub const SKILL_FILE: &str = "SKILL.md";
pub const SCHEMA_FILE: &str = "state.schema.json";
pub const INIT_FILE: &str = "state.init.json";
pub const SETTINGS_FILE: &str = "skill.toml";

/// Everything a skill is, as plain data. Stored with each task so the task never depends on
/// the skill directory staying unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillDefinition {
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    pub procedure: String,
    pub schema: Value,
    pub initial_state: Value,
    pub settings: SkillSettings,
    /// State migrations from older versions (`migrations/`), oldest first; part of the
    /// version's content. Absent from what is stored without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<Migration>,
}

/// A loaded skill with its schema compiled.
pub struct Skill {
    pub definition: SkillDefinition,
    pub schema: StateSchema,
}

impl fmt::Debug for Skill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Skill")
            .field("name", &self.definition.name)
            .finish_non_exhaustive()
    }
}

/// Where in a file a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Line { line: usize, column: Option<usize> },
    Pointer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillProblem {
    pub file: PathBuf,
    pub location: Option<Location>,
    pub message: String,
    pub severity: Severity,
}

impl SkillProblem {
    fn error(file: PathBuf, location: Option<Location>, message: impl Into<String>) -> Self {
        Self {
            file,
            location,
            message: message.into(),
            severity: Severity::Error,
        }
    }
}

impl fmt::Display for SkillProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: {}", self.file.display())?;
        match &self.location {
            Some(Location::Line {
                line,
                column: Some(column),
            }) => write!(f, ":{line}:{column}")?,
            Some(Location::Line { line, column: None }) => write!(f, ":{line}")?,
            Some(Location::Pointer(pointer)) => {
                write!(f, "#{}", if pointer.is_empty() { "/" } else { pointer })?
            }
            None => {}
        }
        write!(f, ": {}", self.message)
    }
}

/// A skill that failed to load: every problem found (warnings included).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SkillErrors {
    pub problems: Vec<SkillProblem>,
}

impl fmt::Display for SkillErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errors = self
            .problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .count();
        writeln!(f, "the skill has {errors} error(s):")?;
        for problem in &self.problems {
            writeln!(f, "  {problem}")?;
        }
        Ok(())
    }
}

/// A loaded skill plus the warnings found while loading it.
pub struct LoadedSkill {
    pub skill: Skill,
    pub warnings: Vec<SkillProblem>,
}

impl Skill {
    /// Loads and checks the skill in `dir`.
    pub fn load(dir: &Path) -> Result<LoadedSkill, SkillErrors> {
        Loader::new(dir).load()
    }

    /// Rebuilds a skill from a stored definition (for example from a task in the store).
    pub fn from_definition(definition: SkillDefinition) -> Result<Skill, String> {
        let schema = StateSchema::compile(definition.schema.clone()).map_err(|d| {
            format!(
                "stored state schema is invalid at {}: {}",
                crate::json::pointer_for_humans(&d.pointer, "schema"),
                d.message
            )
        })?;
        Ok(Skill { definition, schema })
    }

    pub fn name(&self) -> &str {
        &self.definition.name
    }

    pub fn settings(&self) -> &SkillSettings {
        &self.definition.settings
    }
}

struct Loader<'a> {
    dir: &'a Path,
    problems: Vec<SkillProblem>,
}

impl<'a> Loader<'a> {
    fn new(dir: &'a Path) -> Self {
        Self {
            dir,
            problems: Vec::new(),
        }
    }

    fn error(&mut self, file: &str, location: Option<Location>, message: impl Into<String>) {
        self.problems.push(SkillProblem {
            file: self.dir.join(file),
            location,
            message: message.into(),
            severity: Severity::Error,
        });
    }

    fn read(&mut self, file: &str, required: bool) -> Option<String> {
        let path = self.dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let what = match file {
                    SKILL_FILE => {
                        "every skill needs SKILL.md (YAML frontmatter with name and description, then the procedure)"
                    }
                    SCHEMA_FILE => {
                        "every skill needs state.schema.json, a JSON Schema 2020-12 describing its state"
                    }
                    _ => "the file is required",
                };
                self.error(file, None, format!("file not found: {what}"));
                None
            }
            Err(e) => {
                self.error(file, None, format!("cannot read the file: {e}"));
                None
            }
        }
    }

    fn load(mut self) -> Result<LoadedSkill, SkillErrors> {
        if !self.dir.is_dir() {
            self.error(
                "",
                None,
                "not a directory; point at a skill directory that holds SKILL.md",
            );
            return Err(SkillErrors {
                problems: self.problems,
            });
        }
        let dir_name = std::fs::canonicalize(self.dir)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();

        let manifest = self.load_manifest(&dir_name);
        let settings = self.load_settings();
        let schema = self.load_schema();
        let initial_state = self.load_initial_state(schema.as_ref(), settings.as_ref());
        let migrations = migrations::load(
            self.dir,
            settings.as_ref().and_then(|s| s.version.as_ref()),
            &mut self.problems,
        );

        let has_errors = self.problems.iter().any(|p| p.severity == Severity::Error);
        match (manifest, settings, schema, initial_state) {
            (
                Some((name, description, metadata, procedure)),
                Some(settings),
                Some(schema),
                Some(initial_state),
            ) if !has_errors => {
                let definition = SkillDefinition {
                    name,
                    description,
                    metadata,
                    procedure,
                    schema: schema.document().clone(),
                    initial_state,
                    settings,
                    migrations,
                };
                Ok(LoadedSkill {
                    skill: Skill { definition, schema },
                    warnings: self.problems,
                })
            }
            _ => Err(SkillErrors {
                problems: self.problems,
            }),
        }
    }

    fn load_manifest(&mut self, dir_name: &str) -> Option<(String, String, Option<Value>, String)> {
        let text = self.read(SKILL_FILE, true)?;
        let front = match frontmatter::split(&text) {
            Ok(front) => front,
            Err(p) => {
                self.error(
                    SKILL_FILE,
                    Some(Location::Line {
                        line: p.line,
                        column: p.column,
                    }),
                    p.message,
                );
                return None;
            }
        };
        let mut failed = false;
        for p in front.check(dir_name) {
            failed |= !p.warning;
            self.problems.push(SkillProblem {
                file: self.dir.join(SKILL_FILE),
                location: Some(Location::Line {
                    line: p.line,
                    column: p.column,
                }),
                message: p.message,
                severity: if p.warning {
                    Severity::Warning
                } else {
                    Severity::Error
                },
            });
        }
        let procedure = front.body.trim().to_owned();
        if procedure.is_empty() {
            let line = text.lines().count().max(1);
            self.error(
                SKILL_FILE,
                Some(Location::Line { line, column: None }),
                "the body after the frontmatter is the procedure the model follows, and it is empty",
            );
            failed = true;
        }
        if failed {
            return None;
        }
        let text_field = |key: &str| {
            front
                .fields
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Some((
            text_field("name"),
            text_field("description"),
            front.fields.get("metadata").cloned(),
            procedure,
        ))
    }

    fn load_settings(&mut self) -> Option<SkillSettings> {
        let Some(text) = self.read(SETTINGS_FILE, false) else {
            return Some(SkillSettings::default());
        };
        // Ranges (SKILL_RANGES) are checked while parsing: every value out of range is reported.
        match SkillSettings::from_toml(&text) {
            Ok(settings) => Some(settings),
            Err(problems) => {
                for (position, message) in problems {
                    let location = position.map(|(line, column)| Location::Line {
                        line,
                        column: Some(column),
                    });
                    self.error(
                        SETTINGS_FILE,
                        location,
                        format!("invalid skill.toml: {message}"),
                    );
                }
                None
            }
        }
    }

    fn load_schema(&mut self) -> Option<StateSchema> {
        let text = self.read(SCHEMA_FILE, true)?;
        let document = self.parse_json(SCHEMA_FILE, &text)?;
        match StateSchema::compile_all(document) {
            Ok(schema) => Some(schema),
            Err(defects) => {
                for defect in defects {
                    self.error(
                        SCHEMA_FILE,
                        Some(Location::Pointer(defect.pointer)),
                        defect.message,
                    );
                }
                None
            }
        }
    }

    fn load_initial_state(
        &mut self,
        schema: Option<&StateSchema>,
        settings: Option<&SkillSettings>,
    ) -> Option<Value> {
        let (state, file_present) = match self.read(INIT_FILE, false) {
            Some(text) => (self.parse_json(INIT_FILE, &text)?, true),
            None => (Value::Object(Map::new()), false),
        };
        if !state.is_object() {
            self.error(
                INIT_FILE,
                Some(Location::Pointer(String::new())),
                "the initial state must be a JSON object",
            );
            return None;
        }
        let schema = schema?;
        let violations = schema.violations(&state);
        if !violations.is_empty() {
            let reader = schema.whole_view();
            for v in violations.iter().map(|v| v.render(&reader)) {
                if file_present {
                    self.error(
                        INIT_FILE,
                        Some(Location::Pointer(v.pointer)),
                        format!(
                            "the initial state does not satisfy state.schema.json: {}",
                            v.message
                        ),
                    );
                } else {
                    self.error(
                        INIT_FILE,
                        None,
                        format!(
                            "there is no state.init.json and the empty state {{}} does not satisfy state.schema.json ({}); add state.init.json with a valid starting state",
                            v.message
                        ),
                    );
                }
            }
            return None;
        }
        if let Some(settings) = settings {
            // Counted only when the bytes do not already fit (a token is at least one byte),
            // so loading a skill does not build the tokenizer.
            let compact = serde_json::to_string(&state).unwrap_or_default();
            let budget = settings.budgets.state_tokens;
            let tokens = (compact.len() > budget).then(|| count_tokens(&compact));
            if let Some(tokens) = tokens.filter(|t| *t > budget) {
                self.error(
                    INIT_FILE,
                    None,
                    format!(
                        "the initial state is {tokens} tokens, over [budgets] state_tokens = {} in skill.toml",
                        settings.budgets.state_tokens
                    ),
                );
                return None;
            }
        }
        Some(state)
    }

    fn parse_json(&mut self, file: &str, text: &str) -> Option<Value> {
        match serde_json::from_str::<Value>(text) {
            Ok(value) => Some(value),
            Err(e) => {
                self.error(
                    file,
                    Some(Location::Line {
                        line: e.line(),
                        column: Some(e.column()),
                    }),
                    format!("invalid JSON: {e}"),
                );
                None
            }
        }
    }
}
