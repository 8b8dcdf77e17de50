//! Allowed ranges of the numbers a user gives: the numeric settings of `skillstate.toml` and
//! the numeric flags that the runtime counts with. A value out of range is refused where it is
//! read, with the file and line or the flag, instead of overflowing or wrapping later.

#[cfg(test)]
use skillstate_core::skill::Allowed;
use skillstate_core::skill::{SettingRange, check_ranges};

/// Every numeric setting of `skillstate.toml`; `*` stands for a server name or a model spec.
pub const CONFIG_RANGES: &[SettingRange] = &[
    SettingRange::number("model.temperature", 0.0, 2.0, "the sampling temperature"),
    SettingRange::number("model.top_p", 0.0, 1.0, "top_p"),
    SettingRange::integer("model.max_tokens", 1, 1_000_000, "the output token limit"),
    SettingRange::integer("model.seed", 0, i64::MAX as i128, "the sampling seed"),
    SettingRange::integer(
        "model.timeout_secs",
        1,
        3_600,
        "a model request's timeout in seconds",
    ),
    SettingRange::integer(
        "model.max_retries",
        0,
        20,
        "the retries of a failed model request",
    ),
    SettingRange::integer(
        "model.requests_per_minute",
        1,
        1_000_000,
        "the request rate limit",
    ),
    SettingRange::integer(
        "model.tokens_per_minute",
        1,
        u32::MAX as i128,
        "the token rate limit",
    ),
    SettingRange::number(
        "prices.*.input",
        0.0,
        1_000_000.0,
        "a price in USD per million tokens",
    ),
    SettingRange::number(
        "prices.*.output",
        0.0,
        1_000_000.0,
        "a price in USD per million tokens",
    ),
    SettingRange::number(
        "prices.*.cached_input",
        0.0,
        1_000_000.0,
        "a price in USD per million tokens",
    ),
    SettingRange::number(
        "telemetry.sample_ratio",
        0.0,
        1.0,
        "the share of traces recorded",
    ),
    SettingRange::integer(
        "telemetry.timeout_ms",
        1,
        600_000,
        "an OTLP export's timeout in milliseconds",
    ),
    SettingRange::integer(
        "mcp.servers.*.timeout_secs",
        1,
        3_600,
        "an MCP call's timeout in seconds",
    ),
    SettingRange::integer(
        "mcp.servers.*.start_timeout_secs",
        1,
        3_600,
        "an MCP server's start-up timeout in seconds",
    ),
    SettingRange::integer(
        "store.snapshot_every",
        1,
        1_000_000,
        "the steps between state snapshots",
    ),
    SettingRange::integer(
        "store.lease_secs",
        3,
        86_400,
        "the execution lease in seconds",
    ),
    SettingRange::integer(
        "store.max_connections",
        *skillstate_store::MAX_CONNECTIONS_RANGE.start() as i128,
        *skillstate_store::MAX_CONNECTIONS_RANGE.end() as i128,
        "the PostgreSQL connections one process opens (default 16)",
    ),
    SettingRange::integer(
        "tools.sandbox_max_processes",
        8,
        1_000_000,
        "the processes at once in one shell sandbox",
    ),
    SettingRange::integer(
        "tools.sandbox_memory_bytes",
        64 << 20,
        1 << 50,
        "the address space of each sandboxed process in bytes",
    ),
    SettingRange::integer(
        "tools.sandbox_max_file_bytes",
        1 << 20,
        1 << 50,
        "the largest file a sandboxed process may write in bytes",
    ),
    SettingRange::integer(
        "tools.sandbox_cpu_secs",
        1,
        86_400,
        "the CPU seconds of each sandboxed process",
    ),
];

/// The configuration reference's table of allowed ranges (docs/operations/configuration.md,
/// between its `ranges` markers), rendered from [`CONFIG_RANGES`]: a test fails when the page
/// and the code differ, and `SKILLSTATE_BLESS=1 cargo test -p skillstate --bin skillstate
/// limits` writes the page anew. Consecutive settings with the same range and meaning share a
/// row.
#[cfg(test)]
pub fn ranges_table() -> String {
    let mut rows: Vec<(Vec<&str>, String, &str)> = Vec::new();
    for range in CONFIG_RANGES {
        let shown = match range.allowed {
            Allowed::Integer { min, max } => {
                format!(
                    "{}–{}",
                    integer_text(range.key, min),
                    integer_text(range.key, max)
                )
            }
            Allowed::Number { min, max } => format!("{}–{}", number_text(min), number_text(max)),
        };
        match rows.last_mut() {
            Some((keys, last, meaning)) if *last == shown && *meaning == range.meaning => {
                keys.push(range.key)
            }
            _ => rows.push((vec![range.key], shown, range.meaning)),
        }
    }
    let mut table = String::from("| key | range | what it bounds |\n|---|---|---|\n");
    for (keys, shown, meaning) in rows {
        let keys: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
        table.push_str(&format!("| {} | {shown} | {meaning} |\n", keys.join(", ")));
    }
    table
}

/// An integer bound as a reader takes it in: `2⁶³−1`, `64 MiB` for a byte count, else with
/// thousands separators.
#[cfg(test)]
fn integer_text(key: &str, value: i128) -> String {
    if value == i128::from(i64::MAX) {
        return "2⁶³−1".into();
    }
    if key.ends_with("_bytes") {
        for (unit, shift) in [
            ("PiB", 50),
            ("TiB", 40),
            ("GiB", 30),
            ("MiB", 20),
            ("KiB", 10),
        ] {
            let size = 1i128 << shift;
            if value >= size && value % size == 0 {
                return format!("{} {unit}", value / size);
            }
        }
    }
    let digits = value.unsigned_abs().to_string();
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < 0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

/// A decimal bound: one decimal below 10 (`0.0`, `2.0`), else as a whole number.
#[cfg(test)]
fn number_text(value: f64) -> String {
    if value.abs() < 10.0 {
        format!("{value:.1}")
    } else {
        integer_text("", value.round() as i128)
    }
}

/// Every value of `text` (the contents of `file`) outside its range, one `file:line:column:
/// message` per line, or `None` when all are inside.
pub fn config_range_errors(text: &str, file: &str) -> Option<String> {
    let problems = check_ranges(text, CONFIG_RANGES);
    (!problems.is_empty()).then(|| {
        problems
            .iter()
            .map(|p| format!("{file}:{}:{}: {}", p.line, p.column, p.message))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Largest `--budget`: far beyond any model's context, small enough to count with.
pub const MAX_CONTEXT_BUDGET: usize = 10_000_000;

/// `--budget N`: a token budget from 1 to [`MAX_CONTEXT_BUDGET`].
pub fn parse_budget(text: &str) -> Result<usize, String> {
    match text.parse::<u64>() {
        Ok(n) if (1..=MAX_CONTEXT_BUDGET as u64).contains(&n) => Ok(n as usize),
        _ => Err(format!(
            "`{text}` is not a token budget: use a whole number from 1 to {MAX_CONTEXT_BUDGET}"
        )),
    }
}

#[cfg(test)]
mod tests {

    /// The configuration reference shows the ranges this table enforces (`ranges_table`).
    #[test]
    fn the_configuration_reference_shows_the_enforced_ranges() {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/operations/configuration.md");
        let text = std::fs::read_to_string(&page).unwrap();
        let (begin, end) = (
            "<!-- ranges: generated from CONFIG_RANGES -->\n",
            "<!-- ranges: end -->",
        );
        let start = text.find(begin).expect("the page's ranges markers") + begin.len();
        let stop = start + text[start..].find(end).expect("the page's end marker");
        let table = ranges_table();
        if std::env::var_os("SKILLSTATE_BLESS").is_some() {
            let written = format!("{}{table}{}", &text[..start], &text[stop..]);
            std::fs::write(&page, written).unwrap();
            return;
        }
        assert_eq!(
            text[start..stop],
            table,
            "docs/operations/configuration.md differs from CONFIG_RANGES; run SKILLSTATE_BLESS=1 cargo test -p skillstate --bin skillstate limits"
        );
    }
    use super::*;
    use crate::config::Config;

    /// Guards the class: a numeric setting added to skillstate.toml without a range fails here.
    #[test]
    fn every_numeric_setting_has_a_range() {
        let sample = "[model]\ntemperature = 0.5\ntop_p = 1.0\nseed = 7\nrequests_per_minute = 10\ntokens_per_minute = 1000\n\
                      [prices.\"openai:m\"]\ninput = 1.0\noutput = 2.0\ncached_input = 0.5\n\
                      [mcp.servers.files]\ncommand = \"npx\"\n";
        let config = Config::from_toml(sample, "skillstate.toml").unwrap();
        let table: toml::Table = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
        let mut numeric = Vec::new();
        numeric_paths(&table, &mut Vec::new(), &mut numeric);
        assert!(numeric.len() >= 10, "{numeric:?}");
        for path in numeric {
            let keys: Vec<&str> = path.iter().map(String::as_str).collect();
            assert!(
                CONFIG_RANGES.iter().any(|r| r.matches(&keys)),
                "`{}` in skillstate.toml has no entry in CONFIG_RANGES (crates/cli/src/limits.rs)",
                keys.join(".")
            );
        }
    }

    fn numeric_paths(table: &toml::Table, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for (key, value) in table {
            prefix.push(key.clone());
            match value {
                toml::Value::Table(inner) => numeric_paths(inner, prefix, out),
                toml::Value::Integer(_) | toml::Value::Float(_) => out.push(prefix.clone()),
                _ => {}
            }
            prefix.pop();
        }
    }

    #[test]
    fn settings_out_of_range_name_file_line_key_and_range() {
        let text = "[model]\nmax_retries = 4294967295\ntimeout_secs = 0\n[mcp.servers.files]\ncommand = \"npx\"\ntimeout_secs = 18446744073709551615\n[store]\nsnapshot_every = 0\n";
        let error = Config::from_toml(text, "skillstate.toml").unwrap_err();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 4, "{error}");
        assert!(
            lines[0].starts_with(
                "skillstate.toml:2:15: [model] max_retries = 4294967295 is out of range:"
            ),
            "{error}"
        );
        assert!(lines[0].ends_with("from 0 to 20"), "{error}");
        assert!(lines[1].starts_with("skillstate.toml:3:"), "{error}");
        assert!(
            lines[2].contains("[mcp.servers.files] timeout_secs = 18446744073709551615"),
            "{error}"
        );
        assert!(lines[3].contains("[store] snapshot_every = 0"), "{error}");
    }

    #[test]
    fn budgets_outside_their_range_are_refused() {
        assert_eq!(parse_budget("1800"), Ok(1800));
        for bad in [
            "0",
            "18446744073709551615",
            "99999999999999999999999",
            "-1",
            "x",
        ] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
    }
}
