//! Allowed ranges of numeric settings in a TOML file (`skill.toml`, `skillstate.toml`).
//!
//! A setting that the runtime counts with (retries + 1, a timeout turned into a deadline, a
//! budget subtracted from) must be checked where the file is read, so that a huge or zero value
//! becomes a located error instead of an overflow, a wrap to zero or a busy loop later. Each
//! file keeps one table of [`SettingRange`]s; [`check_ranges`] reads the raw TOML (so it sees
//! the value even when it would not fit the field's type) and reports every value outside its
//! range with its line and column.

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::line_column;

/// What values one setting accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Allowed {
    /// An integer in `min..=max`.
    Integer { min: i128, max: i128 },
    /// A finite number in `min..=max` (integers are accepted too).
    Number { min: f64, max: f64 },
}

/// The allowed values of one setting, by its dotted key; `*` matches any one key (a server's
/// name, a model spec).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SettingRange {
    pub key: &'static str,
    pub allowed: Allowed,
    /// What the number is (`rejected answers per step`), shown with the error.
    pub meaning: &'static str,
}

impl SettingRange {
    pub const fn integer(key: &'static str, min: i128, max: i128, meaning: &'static str) -> Self {
        Self {
            key,
            allowed: Allowed::Integer { min, max },
            meaning,
        }
    }

    pub const fn number(key: &'static str, min: f64, max: f64, meaning: &'static str) -> Self {
        Self {
            key,
            allowed: Allowed::Number { min, max },
            meaning,
        }
    }

    /// Whether this range governs the setting at `path` (its keys from the document root).
    pub fn matches(&self, path: &[&str]) -> bool {
        let pattern: Vec<&str> = self.key.split('.').collect();
        pattern.len() == path.len()
            && pattern
                .iter()
                .zip(path)
                .all(|(want, have)| *want == "*" || want == have)
    }
}

/// A value outside its range: 1-based line and column of the value, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeProblem {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Every value in `text` outside its range in `ranges`. Text that is not valid TOML gives no
/// problems here: the parser that reads the settings reports the syntax error.
pub fn check_ranges(text: &str, ranges: &[SettingRange]) -> Vec<RangeProblem> {
    let Ok(document) = DeTable::parse(text) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let mut path = Vec::new();
    walk(text, document.get_ref(), &mut path, ranges, &mut problems);
    problems.sort_by_key(|p| (p.line, p.column));
    problems
}

fn walk<'a>(
    text: &str,
    table: &'a DeTable<'_>,
    path: &mut Vec<&'a str>,
    ranges: &[SettingRange],
    problems: &mut Vec<RangeProblem>,
) {
    for (key, value) in table {
        path.push(key.get_ref().as_ref());
        match value.get_ref() {
            DeValue::Table(inner) => walk(text, inner, path, ranges, problems),
            _ => {
                if let Some(range) = ranges.iter().find(|r| r.matches(path))
                    && let Some(message) = out_of_range(value, range, path)
                {
                    let (line, column) = line_column(text, value.span().start);
                    problems.push(RangeProblem {
                        line,
                        column,
                        message,
                    });
                }
            }
        }
        path.pop();
    }
}

/// The message for `value` when it is a number outside `range`; other types are left to the
/// settings parser, which names the type it expected.
fn out_of_range(
    value: &Spanned<DeValue<'_>>,
    range: &SettingRange,
    path: &[&str],
) -> Option<String> {
    let (shown, inside) = match (value.get_ref(), range.allowed) {
        (DeValue::Integer(integer), Allowed::Integer { min, max }) => {
            let digits = integer.as_str().replace('_', "");
            let parsed = i128::from_str_radix(&digits, integer.radix()).ok();
            (
                integer.to_string(),
                parsed.is_some_and(|n| (min..=max).contains(&n)),
            )
        }
        (DeValue::Integer(integer), Allowed::Number { min, max }) => {
            let digits = integer.as_str().replace('_', "");
            let parsed = i128::from_str_radix(&digits, integer.radix()).ok();
            (
                integer.to_string(),
                parsed.is_some_and(|n| (min..=max).contains(&(n as f64))),
            )
        }
        (DeValue::Float(float), Allowed::Number { min, max }) => {
            let parsed: Option<f64> = float.as_str().replace('_', "").parse().ok();
            (
                float.to_string(),
                parsed.is_some_and(|n| n.is_finite() && (min..=max).contains(&n)),
            )
        }
        _ => return None,
    };
    if inside {
        return None;
    }
    let (table, key) = match path.split_last() {
        Some((key, [])) => (String::new(), *key),
        Some((key, table)) => (format!("[{}] ", table.join(".")), *key),
        None => return None,
    };
    let allowed = match range.allowed {
        Allowed::Integer { min, max } => format!("a whole number from {min} to {max}"),
        Allowed::Number { min, max } => format!("a number from {min} to {max}"),
    };
    Some(format!(
        "{table}{key} = {shown} is out of range: {} must be {allowed}",
        range.meaning
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGES: &[SettingRange] = &[
        SettingRange::integer(
            "run.max_retries",
            0,
            100,
            "rejected answers allowed per step",
        ),
        SettingRange::integer(
            "servers.*.timeout_secs",
            1,
            3600,
            "a call's timeout in seconds",
        ),
        SettingRange::number("model.temperature", 0.0, 2.0, "the sampling temperature"),
    ];

    #[test]
    fn values_outside_their_range_are_located_and_explained() {
        let text = "[run]\nmax_retries = 4294967295\n[servers.files]\ntimeout_secs = 0\n[model]\ntemperature = nan\n";
        let problems = check_ranges(text, RANGES);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!((problems[0].line, problems[0].column), (2, 15));
        assert_eq!(
            problems[0].message,
            "[run] max_retries = 4294967295 is out of range: rejected answers allowed per step must be a whole number from 0 to 100"
        );
        assert_eq!(problems[1].line, 4);
        assert!(
            problems[1]
                .message
                .starts_with("[servers.files] timeout_secs = 0 ")
        );
        assert_eq!(problems[2].line, 6);
        assert!(
            problems[2].message.contains("a number from 0 to 2"),
            "{}",
            problems[2].message
        );
    }

    #[test]
    fn values_inside_their_range_and_other_keys_pass() {
        let text = "run.max_retries = 0x64\n[servers.a]\ntimeout_secs = 3_600\nname = 5\n[model]\ntemperature = 1\n";
        assert_eq!(check_ranges(text, RANGES), []);
    }

    #[test]
    fn numbers_beyond_every_integer_type_are_still_reported() {
        let problems = check_ranges(
            "[run]\nmax_retries = 99999999999999999999999999999999999999999\n",
            RANGES,
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
