//! Terminal presentation: aligned tables, times, one-line outcomes.

use serde_json::Value;
use skillstate_store::TaskStatus;

/// A left-aligned text table; numeric-looking columns are right-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let numeric: Vec<bool> = (0..columns)
            .map(|i| {
                !self.rows.is_empty()
                    && self.rows.iter().all(|r| {
                        r.get(i).is_some_and(|c| {
                            c == "-" || c.trim_end_matches('%').parse::<f64>().is_ok()
                        })
                    })
            })
            .collect();
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = width - cell.chars().count();
                if i > 0 {
                    line.push_str("  ");
                }
                if numeric[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < widths.len() {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `2026-11-30 03:12:45Z` from unix milliseconds.
pub fn format_time(millis: i64) -> String {
    skillstate_store::time::utc(millis)
}

/// `task <id> completed after 10 steps: ...`
pub fn outcome_line(task: &str, status: TaskStatus, steps: u64, outcome: Option<&Value>) -> String {
    let detail = outcome.map(describe_outcome).unwrap_or_default();
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    };
    format!(
        "task {task} {} after {steps} step(s){detail}",
        status.as_str()
    )
}

pub fn describe_outcome(outcome: &Value) -> String {
    let reason = outcome.get("reason").and_then(Value::as_str).unwrap_or("");
    match reason {
        "episode_over" => {
            let env = &outcome["environment"];
            let mut text = "environment episode over".to_owned();
            if let Some(score) = env.get("score").and_then(Value::as_f64) {
                text.push_str(&format!(", score {score:.2}"));
            }
            if let (Some(correct), Some(events)) =
                (env.get("correct_actions"), env.get("actionable_events"))
            {
                text.push_str(&format!(" ({correct}/{events} correct actions)"));
            }
            if let (Some(merged), Some(requested)) =
                (env.get("merged_clean"), env.get("features_requested"))
            {
                text.push_str(&format!(
                    " ({merged}/{requested} features merged with green CI)"
                ));
            }
            text
        }
        "finish" => format!("finished with result {}", outcome["result"]),
        "approval" => format!(
            "waiting for approval of {} {} (skillstate approve / reject)",
            outcome["tool"].as_str().unwrap_or("?"),
            outcome["args"]
        ),
        "unknown_outcome" => format!(
            "waiting for a human: {}",
            outcome["question"].as_str().unwrap_or("")
        ),
        "ask_user" => format!(
            "waiting for an answer to: {}",
            outcome["question"].as_str().unwrap_or("")
        ),
        _ => outcome
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| outcome.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_and_tables() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_time(1_796_010_765_000), "2026-11-30 03:52:45Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29 00:00:00Z");
        let mut t = Table::new(&["A", "N"]);
        t.row(vec!["x".into(), "5".into()]);
        t.row(vec!["long".into(), "12".into()]);
        assert_eq!(t.render(), "A      N\nx      5\nlong  12\n");
    }
}
