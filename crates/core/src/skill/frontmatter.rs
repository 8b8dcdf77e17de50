//! SKILL.md: YAML frontmatter (Agent Skills layout) and the Markdown body that is the procedure.

use serde_json::{Map, Value};

/// Keys the Agent Skills layout defines; anything else is tolerated with a warning.
const KNOWN_KEYS: [&str; 5] = [
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
];
const ALSO_KNOWN: [&str; 1] = ["allowed-tools"];

pub struct Frontmatter {
    pub fields: Map<String, Value>,
    /// 1-based line in SKILL.md where the frontmatter's first key line is.
    pub first_line: usize,
    pub yaml: String,
    pub body: String,
}

/// A problem located by 1-based line (and column when known).
pub struct FrontmatterProblem {
    pub line: usize,
    pub column: Option<usize>,
    pub message: String,
    pub warning: bool,
}

pub fn split(text: &str) -> Result<Frontmatter, FrontmatterProblem> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err(FrontmatterProblem {
            line: 1,
            column: None,
            message: "SKILL.md must start with YAML frontmatter: a line `---`, the keys `name` and `description`, then a closing `---`".into(),
            warning: false,
        });
    }
    let mut yaml = String::new();
    let mut consumed = first.len();
    for line in lines {
        consumed += line.len();
        if line.trim_end() == "---" {
            let fields = parse_yaml(&yaml)?;
            return Ok(Frontmatter {
                fields,
                first_line: 2,
                yaml,
                body: text[consumed..].to_owned(),
            });
        }
        yaml.push_str(line);
    }
    Err(FrontmatterProblem {
        line: 1,
        column: None,
        message: "the frontmatter opened with `---` on line 1 is never closed; add a line `---` after the last key".into(),
        warning: false,
    })
}

fn parse_yaml(yaml: &str) -> Result<Map<String, Value>, FrontmatterProblem> {
    match yaml_serde::from_str::<Value>(yaml) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(Value::Null) => Ok(Map::new()),
        Ok(_) => Err(FrontmatterProblem {
            line: 2,
            column: None,
            message: "the frontmatter must be a YAML mapping of keys (name: ..., description: ...)"
                .into(),
            warning: false,
        }),
        Err(error) => {
            let (line, column) = error
                .location()
                .map(|l| (l.line() + 1, Some(l.column())))
                .unwrap_or((2, None));
            Err(FrontmatterProblem {
                line,
                column,
                message: format!("invalid YAML in the frontmatter: {error}"),
                warning: false,
            })
        }
    }
}

impl Frontmatter {
    /// Line of `key:` in SKILL.md, or the first frontmatter line when the key is absent.
    pub fn line_of(&self, key: &str) -> usize {
        self.yaml
            .lines()
            .position(|l| l.starts_with(&format!("{key}:")))
            .map(|i| self.first_line + i)
            .unwrap_or(self.first_line)
    }

    /// Checks the Agent Skills rules; `dir_name` is the directory that holds SKILL.md.
    pub fn check(&self, dir_name: &str) -> Vec<FrontmatterProblem> {
        let mut problems = Vec::new();
        let error = |key: &str, message: String| FrontmatterProblem {
            line: self.line_of(key),
            column: None,
            message,
            warning: false,
        };
        match self.fields.get("name") {
            None => problems.push(error("name", "missing `name`: 1–64 lowercase letters, digits and hyphens, equal to the directory name".into())),
            Some(Value::String(name)) => {
                if let Some(why) = name_problem(name) {
                    problems.push(error("name", format!("`name: {name}` is not a valid skill name: {why}")));
                } else if name != dir_name {
                    problems.push(error(
                        "name",
                        format!("`name: {name}` must equal the directory name `{dir_name}`; rename one of them"),
                    ));
                }
            }
            Some(other) => problems.push(error("name", format!("`name` must be a string, found {other}"))),
        }
        match self.fields.get("description") {
            None => problems.push(error("description", "missing `description`: 1–1024 characters saying what the skill does and when to use it".into())),
            Some(Value::String(d)) if d.trim().is_empty() => {
                problems.push(error("description", "`description` is empty; say what the skill does (1–1024 characters)".into()))
            }
            Some(Value::String(d)) if d.chars().count() > 1024 => problems.push(error(
                "description",
                format!("`description` is {} characters; the limit is 1024", d.chars().count()),
            )),
            Some(Value::String(_)) => {}
            Some(other) => problems.push(error("description", format!("`description` must be a string, found {other}"))),
        }
        if let Some(metadata) = self.fields.get("metadata")
            && !metadata.is_object()
        {
            problems.push(error(
                "metadata",
                "`metadata` must be a mapping of keys to values".into(),
            ));
        }
        for key in self.fields.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) && !ALSO_KNOWN.contains(&key.as_str()) {
                problems.push(FrontmatterProblem {
                    line: self.line_of(key),
                    column: None,
                    message: format!(
                        "unknown frontmatter key `{key}` is ignored; runtime settings belong in skill.toml, other data under `metadata`"
                    ),
                    warning: true,
                });
            }
        }
        problems
    }
}

/// Why `name` breaks the Agent Skills naming rule, if it does.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.chars().count() > 64 {
        return Some("it must be 1–64 characters long");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Some("only lowercase letters, digits and hyphens are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Some("hyphens may not start or end it, nor come in pairs");
    }
    None
}
