//! `skill.toml`: runtime settings kept beside SKILL.md so the skill stays a valid Agent Skill.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ranges::{SettingRange, check_ranges};
use crate::board::{BoardScope, BoardTable, ScopeList};

pub const DEFAULT_STATE_TOKENS: usize = 2000;
pub const DEFAULT_OBSERVATION_TOKENS: usize = 1000;
pub const DEFAULT_RECALL_TOKENS: usize = 400;
pub const DEFAULT_MAX_RETRIES: u32 = 2;
pub const DEFAULT_MAX_STEPS: u32 = 100;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SkillSettings {
    /// The skill's human version (`version = "1.2.0"`): names a version in `skillstate skills`
    /// and orders the skill's migrations. Optional; absent from what is stored without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<super::SkillVersion>,
    pub budgets: Budgets,
    pub run: RunLimits,
    pub tools: ToolSelection,
    /// The world the skill acts on, when a built-in environment provides it.
    pub environment: Option<EnvironmentSettings>,
    /// What the skill reads and may write on a board it is attached to (`[board]`, optional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub board: Option<BoardScope>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budgets {
    /// Largest allowed state, in o200k_base tokens of its compact JSON.
    pub state_tokens: usize,
    /// Longest observation shown in a prompt; longer ones are cut with a marker.
    pub observation_tokens: usize,
    /// Longest result of one `recall` call, in tokens; hits that do not fit are left out.
    pub recall_tokens: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            state_tokens: DEFAULT_STATE_TOKENS,
            observation_tokens: DEFAULT_OBSERVATION_TOKENS,
            recall_tokens: DEFAULT_RECALL_TOKENS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunLimits {
    /// Rejected outputs allowed per step before the task fails.
    pub max_retries: u32,
    /// Accepted steps allowed before the task stops.
    pub max_steps: u32,
    /// After a crash left an effectful action's outcome unknown: tell the model (`observe`) or
    /// pause until a human says what happened (`ask`, answered with `skillstate reply`).
    pub on_unknown_outcome: UnknownOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UnknownOutcome {
    #[default]
    Observe,
    Ask,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_retries: DEFAULT_MAX_RETRIES,
            max_steps: DEFAULT_MAX_STEPS,
            on_unknown_outcome: UnknownOutcome::Observe,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ToolSelection {
    /// Tool names (`ship`, `fs.read`) or whole tool sources (`warehouse`, `fs`, `shell`, an
    /// MCP server's name) the skill may use. Built-in and MCP tools are off unless listed.
    pub allow: Vec<String>,
    /// The directory the built-in `fs` and `shell` tools are confined to, relative to the skill
    /// directory (default: the directory skillstate runs in, or `--work-dir`).
    pub work_dir: Option<String>,
    pub shell: ShellSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShellSettings {
    /// Longest a command may run, in seconds.
    pub timeout_secs: u64,
    /// Bytes of stdout and of stderr kept; the rest is dropped with a marker.
    pub max_output_bytes: usize,
    /// Environment variables passed through from skillstate's own environment.
    pub env_allow: Vec<String>,
    /// Whether commands may use the network. Off by default: the sandbox gives them a network
    /// namespace of their own with only a loopback interface.
    pub network: bool,
}

impl Default for ShellSettings {
    fn default() -> Self {
        Self {
            timeout_secs: 30,
            max_output_bytes: 16 * 1024,
            env_allow: vec!["PATH".into(), "LANG".into(), "LC_ALL".into(), "TZ".into()],
            network: false,
        }
    }
}

impl ToolSelection {
    pub fn allows(&self, tool_name: &str, source: &str) -> bool {
        self.allow
            .iter()
            .any(|entry| entry == tool_name || entry == source)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentSettings {
    /// Which built-in environment (`warehouse`, ...).
    pub kind: String,
    /// Everything else in the `[environment]` table, passed to the environment as is.
    #[serde(flatten)]
    pub params: Map<String, Value>,
}

/// The allowed range of every numeric setting of `skill.toml` (`[environment]` parameters are
/// checked by the environment that reads them).
pub const SKILL_RANGES: &[SettingRange] = &[
    SettingRange::integer(
        "budgets.state_tokens",
        1,
        1_000_000,
        "the state budget in tokens",
    ),
    SettingRange::integer(
        "budgets.observation_tokens",
        1,
        1_000_000,
        "the observation budget in tokens",
    ),
    SettingRange::integer(
        "budgets.recall_tokens",
        50,
        100_000,
        "the budget of one recall result in tokens",
    ),
    SettingRange::integer(
        "run.max_retries",
        0,
        100,
        "the rejected answers allowed per step",
    ),
    SettingRange::integer(
        "run.max_steps",
        1,
        100_000_000,
        "the accepted steps allowed per task",
    ),
    SettingRange::integer(
        "tools.shell.timeout_secs",
        1,
        86_400,
        "a shell command's timeout in seconds",
    ),
    SettingRange::integer(
        "tools.shell.max_output_bytes",
        1,
        64 * 1024 * 1024,
        "the bytes kept of each output stream",
    ),
];

/// One problem in `skill.toml`: the 1-based line and column when known, and the message.
pub type SettingsProblem = (Option<(usize, usize)>, String);

impl SkillSettings {
    /// Parses `skill.toml` text: every number outside its range in [`SKILL_RANGES`], or else
    /// the parser's error, each with a 1-based line and column when known.
    pub fn from_toml(text: &str) -> Result<Self, Vec<SettingsProblem>> {
        let problems = check_ranges(text, SKILL_RANGES);
        if !problems.is_empty() {
            return Err(problems
                .into_iter()
                .map(|p| (Some((p.line, p.column)), p.message))
                .collect());
        }
        let problems = board_problems(text);
        if !problems.is_empty() {
            return Err(problems);
        }
        toml::from_str::<SkillSettings>(text).map_err(|error| {
            let position = error.span().map(|span| line_column(text, span.start));
            vec![(position, error.message().to_owned())]
        })
    }
}

/// Every bad entry of the `[board]` table, located at its string (`board.reads[2]: ...`): the
/// scope's rules ([`BoardScope::parse`]), and writes that overlap ([`BoardScope::overlapping_writes`],
/// checked here where a skill is written, not when a stored one is read). A table of the wrong
/// shape gives none here: the settings parser names the type it expected.
fn board_problems(text: &str) -> Vec<SettingsProblem> {
    let Some((table, positions)) = board_entries(text) else {
        return Vec::new();
    };
    let problems = match BoardScope::parse(&table) {
        Ok(scope) => scope.overlapping_writes(),
        Err(problems) => problems,
    };
    problems
        .into_iter()
        .map(|problem| {
            let position = positions
                .iter()
                .find(|(list, index, _)| *list == problem.list && *index == problem.index)
                .map(|(_, _, position)| *position);
            (position, problem.to_string())
        })
        .collect()
}

/// Where an entry of the `[board]` table is: its list, its index, its 1-based line and column.
pub type BoardEntryPosition = (ScopeList, usize, (usize, usize));

/// The `[board]` table of `skill.toml` text as written, with the position of each entry;
/// `None` without a table of strings.
pub fn board_entries(text: &str) -> Option<(BoardTable, Vec<BoardEntryPosition>)> {
    use toml::de::{DeTable, DeValue};
    let document = DeTable::parse(text).ok()?;
    let Some(DeValue::Table(board)) = document.get_ref().get("board").map(|v| v.get_ref()) else {
        return None;
    };
    let mut table = BoardTable::default();
    let mut positions = Vec::new();
    for (list, entries) in [
        (ScopeList::Reads, &mut table.reads),
        (ScopeList::Writes, &mut table.writes),
    ] {
        let Some(DeValue::Array(items)) = board.get(list.as_str()).map(|v| v.get_ref()) else {
            continue;
        };
        for item in items {
            let DeValue::String(entry) = item.get_ref() else {
                return None;
            };
            entries.push(entry.to_string());
            positions.push((
                list,
                entries.len() - 1,
                line_column(text, item.span().start),
            ));
        }
    }
    Some((table, positions))
}

/// 1-based line and column of byte `offset` in `text`.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_section() {
        let s = SkillSettings::from_toml(
            "[budgets]\nstate_tokens = 900\n[run]\nmax_steps = 12\n[tools]\nallow = [\"warehouse\"]\n[environment]\nkind = \"warehouse\"\nseed = 7\n",
        )
        .unwrap();
        assert_eq!(s.budgets.state_tokens, 900);
        assert_eq!(s.budgets.observation_tokens, DEFAULT_OBSERVATION_TOKENS);
        assert_eq!(s.run.max_steps, 12);
        assert!(s.tools.allows("ship", "warehouse"));
        let env = s.environment.unwrap();
        assert_eq!(env.kind, "warehouse");
        assert_eq!(env.params["seed"], 7);
    }

    #[test]
    fn unknown_keys_report_their_line() {
        let problems =
            SkillSettings::from_toml("[run]\nmax_steps = 3\nmax_stepz = 4\n").unwrap_err();
        let (position, message) = &problems[0];
        assert_eq!(position.map(|p| p.0), Some(3));
        assert!(message.contains("max_stepz"), "{message}");
    }

    #[test]
    fn settings_out_of_range_are_all_reported_with_their_line() {
        let text = "[budgets]\nstate_tokens = 0\n[run]\nmax_retries = 4294967295\nmax_steps = 0\n[tools.shell]\ntimeout_secs = 18446744073709551615\n";
        let problems = SkillSettings::from_toml(text).unwrap_err();
        let lines: Vec<usize> = problems.iter().filter_map(|p| p.0.map(|p| p.0)).collect();
        assert_eq!(lines, [2, 4, 5, 7], "{problems:?}");
        assert!(
            problems[1]
                .1
                .contains("[run] max_retries = 4294967295 is out of range")
        );
        assert!(problems[1].1.contains("from 0 to 100"));
    }

    #[test]
    fn the_board_table_is_optional_and_checked_where_written() {
        assert_eq!(SkillSettings::from_toml("").unwrap().board, None);
        let s = SkillSettings::from_toml(
            "[board]\nreads = [\"/plan\", \"/frontend\"]\nwrites = [\"/frontend\"]\n",
        )
        .unwrap();
        let board = s.board.unwrap();
        assert_eq!(board.reads.len(), 2);
        assert_eq!(board.writes[0].to_string(), "/frontend");
        let text = "[board]\nreads = [\"/plan\",\n  \"api\"]\nwrites = [\"/frontend\"]\n";
        let problems = SkillSettings::from_toml(text).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(problems[0].0, Some((3, 3)));
        assert!(
            problems[0]
                .1
                .starts_with("board.reads[1]: \"api\" is not a JSON pointer"),
            "{}",
            problems[0].1
        );
        assert_eq!(problems[1].0, Some((4, 11)));
        assert!(
            problems[1].1.contains("board.writes[0]"),
            "{}",
            problems[1].1
        );
        let problems = SkillSettings::from_toml("[board]\nread = []\n").unwrap_err();
        assert!(problems[0].1.contains("read"), "{problems:?}");
    }

    #[test]
    fn stored_settings_without_a_board_still_load() {
        let stored = serde_json::to_value(SkillSettings::default()).unwrap();
        assert!(stored.get("board").is_none());
        let back: SkillSettings = serde_json::from_value(stored).unwrap();
        assert_eq!(back, SkillSettings::default());
    }

    /// Guards the class: a numeric setting added later without a range fails here.
    #[test]
    fn every_numeric_setting_has_a_range() {
        let text = toml::to_string(&SkillSettings::default()).unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let mut numeric = Vec::new();
        numeric_keys(&table, "", &mut numeric);
        assert!(!numeric.is_empty());
        for key in numeric {
            assert!(
                SKILL_RANGES.iter().any(|r| r.key == key),
                "`{key}` in skill.toml has no entry in SKILL_RANGES (crates/core/src/skill/settings.rs)"
            );
        }
    }

    fn numeric_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
        for (key, value) in table {
            let path = format!("{prefix}{key}");
            match value {
                toml::Value::Table(inner) => numeric_keys(inner, &format!("{path}."), out),
                toml::Value::Integer(_) | toml::Value::Float(_) => out.push(path),
                _ => {}
            }
        }
    }
}
