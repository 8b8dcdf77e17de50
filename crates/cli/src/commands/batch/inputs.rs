//! A batch's inputs: a directory (one task per file; the file's text is the task's input) or a
//! `.jsonl` file (one task per line: input, initial state, labels, environment parameters,
//! limits, the skill version to create it on). Errors name the file and line.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::pin::Pin;
use super::spec::in_range;

/// Where a task came from: a file of the input directory, or a line of the `.jsonl` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(String),
    Line(usize),
}

/// One task to create.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInput {
    pub source: Source,
    /// `path` or `path:line`, for errors.
    pub at: String,
    /// The request that opens the task (skills without a built-in environment).
    pub input: Option<String>,
    /// Replaces the skill's `state.init.json`.
    pub state: Option<Value>,
    /// Shown in reports; includes `file` or `line`.
    pub labels: Map<String, Value>,
    /// Overrides of the skill's `[environment]` parameters (`seed`, `events`, ...).
    pub environment: Map<String, Value>,
    pub max_steps: Option<u32>,
    pub max_retries: Option<u32>,
    /// The skill version to create the task on (`skill_version`); `None`: the skill
    /// directory's (or `--skill-version`).
    pub skill_version: Option<Pin>,
}

/// One line of an inputs `.jsonl` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    state: Option<Value>,
    #[serde(default)]
    labels: Option<Map<String, Value>>,
    #[serde(default)]
    environment: Option<Map<String, Value>>,
    #[serde(default)]
    limits: Option<Limits>,
    /// Read as any JSON value so that a wrong type is refused naming the key.
    #[serde(default)]
    skill_version: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limits {
    #[serde(default)]
    max_steps: Option<i128>,
    #[serde(default)]
    max_retries: Option<i128>,
}

/// Reads every task of `path` at once (see [`stream_inputs`]).
#[cfg(test)]
pub fn read_inputs(path: &Path) -> Result<Vec<TaskInput>> {
    stream_inputs(path)?.collect()
}

/// The tasks of `path`, one at a time: a `.jsonl` file is read line by line and an input
/// directory file by file, so a batch of any size is read in bounded memory. An input with no
/// task at all ends with an error naming it.
pub fn stream_inputs(path: &Path) -> Result<Inputs> {
    let source = if path.is_dir() {
        Feed::Directory(list_directory(path)?.into_iter())
    } else if path.extension().is_some_and(|e| e == "jsonl") {
        let file = std::fs::File::open(path)
            .with_context(|| format!("inputs: cannot read {}", path.display()))?;
        Feed::Jsonl {
            lines: std::io::BufReader::new(file).lines(),
            number: 0,
        }
    } else if !path.exists() {
        bail!(
            "inputs: {} does not exist; give a directory (one task per file) or a .jsonl file (one task per line)",
            path.display()
        );
    } else {
        bail!(
            "inputs: {} is neither a directory (one task per file) nor a .jsonl file (one task per line)",
            path.display()
        );
    };
    Ok(Inputs {
        path: path.to_owned(),
        feed: source,
        seen: 0,
        done: false,
    })
}

/// The tasks of an input, in order (see [`stream_inputs`]).
pub struct Inputs {
    path: PathBuf,
    feed: Feed,
    seen: usize,
    done: bool,
}

enum Feed {
    Directory(std::vec::IntoIter<(String, PathBuf)>),
    Jsonl {
        lines: std::io::Lines<std::io::BufReader<std::fs::File>>,
        number: usize,
    },
}

impl Iterator for Inputs {
    type Item = Result<TaskInput>;

    fn next(&mut self) -> Option<Result<TaskInput>> {
        if self.done {
            return None;
        }
        let next = match &mut self.feed {
            Feed::Directory(files) => files.next().map(|(name, path)| read_file(name, &path)),
            Feed::Jsonl { lines, number } => loop {
                let Some(raw) = lines.next() else {
                    break None;
                };
                *number += 1;
                let raw = match raw {
                    Ok(raw) => raw,
                    Err(error) => {
                        break Some(Err(anyhow::anyhow!(
                            "inputs: cannot read {} at line {number}: {error}",
                            self.path.display()
                        )));
                    }
                };
                if raw.trim().is_empty() {
                    continue;
                }
                break Some(parse_line(&self.path, *number, &raw));
            },
        };
        match next {
            Some(Ok(input)) => {
                self.seen += 1;
                Some(Ok(input))
            }
            Some(Err(error)) => {
                self.done = true;
                Some(Err(error))
            }
            None => {
                self.done = true;
                (self.seen == 0).then(|| {
                    Err(anyhow::anyhow!(
                        "inputs: {} holds no tasks",
                        self.path.display()
                    ))
                })
            }
        }
    }
}

/// Regular files in name order; hidden files (`.name`) are skipped.
fn list_directory(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("inputs: cannot list {}", dir.display()))?
    {
        let entry = entry.with_context(|| format!("inputs: cannot list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !entry.path().is_file() {
            continue;
        }
        files.push((name, entry.path()));
    }
    files.sort();
    Ok(files)
}

/// One file of an input directory: its text is the task's input.
fn read_file(name: String, path: &Path) -> Result<TaskInput> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "inputs: cannot read {} as UTF-8 text (each file's text is one task's input)",
            path.display()
        )
    })?;
    let mut labels = Map::new();
    labels.insert("file".into(), Value::String(name.clone()));
    Ok(TaskInput {
        source: Source::File(name),
        at: path.display().to_string(),
        input: Some(text),
        state: None,
        labels,
        environment: Map::new(),
        max_steps: None,
        max_retries: None,
        skill_version: None,
    })
}

/// Line `number` (`raw`, not blank) of the `.jsonl` file at `path`.
fn parse_line(path: &Path, number: usize, raw: &str) -> Result<TaskInput> {
    let at = format!("{}:{number}", path.display());
    let line: Line = serde_json::from_str(raw).map_err(|e| {
        let message = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        anyhow::anyhow!(
            "{at}: {} (each line is one JSON object with any of: input, state, labels, environment, limits, skill_version)",
            message.strip_suffix(&suffix).unwrap_or(&message)
        )
    })?;
    let mut labels = Map::new();
    labels.insert("line".into(), Value::from(number));
    for (key, value) in line.labels.unwrap_or_default() {
        if key == "line" {
            bail!("{at}: labels.line is set by skillstate (the line number); use another name");
        }
        labels.insert(key, value);
    }
    if let Some(state) = &line.state
        && !state.is_object()
    {
        bail!("{at}: state must be a JSON object (the task's initial state)");
    }
    let limits = line.limits.unwrap_or(Limits {
        max_steps: None,
        max_retries: None,
    });
    let ranged = |key: &str, value: Option<i128>, min: u64, max: u64| {
        value
            .map(|v| in_range(key, v, min, max).map(|n| n as u32))
            .transpose()
            .map_err(|message| anyhow::anyhow!("{at}: {message}"))
    };
    let max_steps = ranged("limits.max_steps", limits.max_steps, 1, 100_000_000)?;
    let max_retries = ranged("limits.max_retries", limits.max_retries, 0, 100)?;
    let skill_version = match &line.skill_version {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(
            Pin::parse(text)
                .map_err(|message| anyhow::anyhow!("{at}: skill_version: {message}"))?,
        ),
        Some(other) => bail!(
            "{at}: skill_version: {other} is not a string; give a skill.toml version such as \"1.2.0\", or a hash prefix from `skillstate skills` (at least 6 hex characters), in quotes"
        ),
    };
    Ok(TaskInput {
        source: Source::Line(number),
        at,
        input: line.input,
        state: line.state,
        labels,
        environment: line.environment.unwrap_or_default(),
        max_steps,
        max_retries,
        skill_version,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn directories_give_one_task_per_file_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "second").unwrap();
        std::fs::write(dir.path().join("a.txt"), "first").unwrap();
        std::fs::write(dir.path().join(".hidden"), "skipped").unwrap();
        let inputs = read_inputs(dir.path()).unwrap();
        assert_eq!(inputs.len(), 2);
        assert_eq!(inputs[0].source, Source::File("a.txt".into()));
        assert_eq!(inputs[0].input.as_deref(), Some("first"));
        assert_eq!(inputs[1].labels["file"], "b.txt");
    }

    #[test]
    fn jsonl_lines_carry_everything_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"environment\": {\"seed\": 4}, \"labels\": {\"kind\": \"a\"}, \"limits\": {\"max_steps\": 3}}\n\n{\"input\": \"hi\", \"state\": {\"x\": 1}}\n",
        )
        .unwrap();
        let inputs = read_inputs(&path).unwrap();
        assert_eq!(inputs.len(), 2);
        assert_eq!(inputs[0].environment["seed"], 4);
        assert_eq!(inputs[0].labels["kind"], "a");
        assert_eq!(inputs[0].labels["line"], 1);
        assert_eq!(inputs[0].max_steps, Some(3));
        assert_eq!(inputs[1].source, Source::Line(3));
        assert_eq!(inputs[1].input.as_deref(), Some("hi"));

        std::fs::write(&path, "{\"input\": \"a\"}\n{\"inptu\": \"b\"}\n").unwrap();
        let error = read_inputs(&path).unwrap_err().to_string();
        assert!(
            error.contains("in.jsonl:2: unknown field `inptu`"),
            "{error}"
        );
        std::fs::write(&path, "{\"limits\": {\"max_steps\": 0}}\n").unwrap();
        let error = read_inputs(&path).unwrap_err().to_string();
        assert!(
            error.contains("in.jsonl:1: limits.max_steps: 0 is out of range"),
            "{error}"
        );
        std::fs::write(&path, "{\"input\": \"a\"\n").unwrap();
        let error = read_inputs(&path).unwrap_err().to_string();
        assert!(error.contains("in.jsonl:1: "), "{error}");
        std::fs::write(&path, "\n").unwrap();
        let error = read_inputs(&path).unwrap_err().to_string();
        assert!(error.contains("holds no tasks"), "{error}");
    }

    #[test]
    fn a_line_pins_its_skill_version_by_name_or_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"skill_version\": \"1.2.0\"}\n{\"skill_version\": \"0F1E2D3C\"}\n{}\n",
        )
        .unwrap();
        let inputs = read_inputs(&path).unwrap();
        assert_eq!(inputs[0].skill_version, Some(Pin::Version("1.2.0".into())));
        assert_eq!(inputs[1].skill_version, Some(Pin::Hash("0f1e2d3c".into())));
        assert_eq!(inputs[2].skill_version, None);
        for (line, expected) in [
            (
                "{\"skill_version\": 1}",
                "in.jsonl:2: skill_version: 1 is not a string",
            ),
            (
                "{\"skill_version\": \"1.2\"}",
                "in.jsonl:2: skill_version: `1.2` is not a semantic version",
            ),
            (
                "{\"skill_version\": \"abc\"}",
                "in.jsonl:2: skill_version: `abc` is too short for a hash prefix",
            ),
        ] {
            std::fs::write(&path, format!("{{}}\n{line}\n")).unwrap();
            let error = read_inputs(&path).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }
}
