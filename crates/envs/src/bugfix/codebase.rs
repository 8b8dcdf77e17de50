//! The seeded repository: one module per test, each test checking one line of its module.
//! A seed picks the modules, which of them carry a bug (one of [`TEMPLATES`]) and on which
//! line. A test passes exactly when its line reads as it should; a change to any other
//! module's line breaks that module's test.

use serde::{Deserialize, Serialize};

use super::BugfixConfig;
use crate::rng::SeededRng;

/// Module names; a module `m` lives in `src/m.rs` and is checked by `tests::m`.
pub const NAMES: [&str; 12] = [
    "pagination",
    "rate_limit",
    "audit_log",
    "retry_queue",
    "csv_export",
    "search_cache",
    "thumbnails",
    "billing",
    "webhooks",
    "sessions",
    "backup_job",
    "tagging",
];

/// One kind of bug: the line as written, the line as it should be, what the failing test
/// asserts, and the note its author left on the assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    pub buggy: &'static str,
    pub fixed: &'static str,
    pub assertion: &'static str,
    pub note: &'static str,
}

pub const TEMPLATES: [Template; 5] = [
    Template {
        buggy: "    for page in 1..last {",
        fixed: "    for page in 1..=last {",
        assertion: "expected 5 pages, got 4",
        note: "the range stops one element early; it should include its end",
    },
    Template {
        buggy: "    let remaining = limit - used + 1;",
        fixed: "    let remaining = limit - used;",
        assertion: "expected 3 remaining, got 4",
        note: "the value is one too large",
    },
    Template {
        buggy: "    if !enabled {",
        fixed: "    if enabled {",
        assertion: "expected no call while disabled, got 1",
        note: "the branch runs exactly when it should not; the condition is inverted",
    },
    Template {
        buggy: "    if retries > max_retries {",
        fixed: "    if retries >= max_retries {",
        assertion: "expected to stop after 3 attempts, got 4",
        note: "the limit takes effect one attempt late; the comparison should include equality",
    },
    Template {
        buggy: "    let offset = start - len;",
        fixed: "    let offset = start + len;",
        assertion: "expected offset 12, got 4",
        note: "the value moves the wrong way; the sign is wrong",
    },
];

/// Correct lines of modules without a bug.
const CLEAN_LINES: [&str; 4] = [
    "    let total = items.iter().map(|i| i.price).sum::<u64>();",
    "    if attempts >= limit {",
    "    for chunk in rows.chunks(size) {",
    "    let key = format!(\"{prefix}:{id}\");",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    pub name: String,
    /// The line its test checks.
    pub line: u64,
    /// That line as the working copy has it now.
    pub text: String,
    /// That line as it should be.
    pub fixed: String,
    /// The bug it started with, as an index into [`TEMPLATES`].
    pub bug: Option<usize>,
}

impl Module {
    pub fn file(&self) -> String {
        format!("src/{}.rs", self.name)
    }

    pub fn test(&self) -> String {
        format!("tests::{}", self.name)
    }

    pub fn passes(&self) -> bool {
        self.text == self.fixed
    }

    /// Why its test fails (`None` when it passes).
    pub fn failure(&self) -> Option<String> {
        if self.passes() {
            return None;
        }
        Some(match self.bug.map(|b| TEMPLATES[b]) {
            Some(t) if self.text == t.buggy => {
                format!("assertion failed: {}; note: {}", t.assertion, t.note)
            }
            Some(t) => format!(
                "assertion failed: {} (line {} now reads `{}`)",
                t.assertion,
                self.line,
                self.text.trim()
            ),
            None => format!(
                "assertion failed: line {} was changed to `{}`",
                self.line,
                self.text.trim()
            ),
        })
    }
}

/// The repository as one agent's copy has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Codebase {
    pub modules: Vec<Module>,
}

/// What a change to one line did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditError {
    NoFile(String),
    /// The line is not the one the file has there.
    Mismatch {
        file: String,
        line: u64,
        actual: String,
    },
}

impl EditError {
    pub fn text(&self) -> String {
        match self {
            Self::NoFile(file) => format!("there is no file {file}"),
            Self::Mismatch { file, line, actual } => {
                format!("{file}:{line} reads `{actual}`, not the line given as before")
            }
        }
    }
}

impl Codebase {
    /// The repository of `config.seed`: `config.tests` modules, `config.bugs` of them buggy.
    pub fn generate(config: &BugfixConfig) -> Self {
        let mut rng = SeededRng::new(config.seed ^ 0xB06F_1C5E);
        let mut names: Vec<&str> = NAMES.to_vec();
        let mut templates: Vec<usize> = (0..TEMPLATES.len()).collect();
        let tests = (config.tests as usize).clamp(1, NAMES.len());
        let bugs = (config.bugs as usize).clamp(1, tests.min(TEMPLATES.len()));
        let mut modules: Vec<Module> = (0..tests)
            .map(|_| {
                let name = names.remove(rng.index(names.len())).to_owned();
                let clean = (*rng.pick(&CLEAN_LINES)).to_owned();
                Module {
                    name,
                    line: 8 + rng.below(80),
                    text: clean.clone(),
                    fixed: clean,
                    bug: None,
                }
            })
            .collect();
        let mut buggy: Vec<usize> = (0..tests).collect();
        for _ in 0..bugs {
            let at = buggy.remove(rng.index(buggy.len()));
            let template = templates.remove(rng.index(templates.len()));
            let module = &mut modules[at];
            module.text = TEMPLATES[template].buggy.to_owned();
            module.fixed = TEMPLATES[template].fixed.to_owned();
            module.bug = Some(template);
        }
        modules.sort_by(|a, b| a.name.cmp(&b.name));
        Self { modules }
    }

    pub fn failing(&self) -> Vec<String> {
        self.modules
            .iter()
            .filter(|m| !m.passes())
            .map(Module::test)
            .collect()
    }

    pub fn by_test(&self, test: &str) -> Option<&Module> {
        self.modules.iter().find(|m| m.test() == test)
    }

    /// Replaces line `line` of `file`, which must read `before`, by `after`. Lines other than
    /// the ones the tests check are not modelled: an edit elsewhere lands nowhere.
    pub fn edit(
        &mut self,
        file: &str,
        line: u64,
        before: &str,
        after: &str,
    ) -> Result<(), EditError> {
        let module = self
            .modules
            .iter_mut()
            .find(|m| m.file() == file)
            .ok_or_else(|| EditError::NoFile(file.to_owned()))?;
        if module.line != line || module.text != before {
            return Err(EditError::Mismatch {
                file: file.to_owned(),
                line,
                actual: if module.line == line {
                    module.text.clone()
                } else {
                    "(a line no test checks)".to_owned()
                },
            });
        }
        module.text = after.to_owned();
        Ok(())
    }

    /// `tests::a, tests::b` (or `none`).
    pub fn list(tests: &[String]) -> String {
        if tests.is_empty() {
            "none".to_owned()
        } else {
            tests.join(", ")
        }
    }
}
