//! A batch report as text: the terminal status, Markdown, CSV (one row per task) and JSON.

use serde_json::Value;
use skillstate_store::BatchState;

use super::report::{Report, TaskRow};
use crate::render::{Table, format_time};

/// `2h 03m`, `4m 05s`, `12.3s`, `850ms`.
pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    if secs < 60 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    if secs < 3600 {
        return format!("{}m {:02}s", secs / 60, secs % 60);
    }
    format!("{}h {:02}m", secs / 3600, (secs % 3600) / 60)
}

fn percent(rate: Option<f64>) -> String {
    rate.map(|r| format!("{:.1}%", r * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn number(value: Option<f64>, digits: usize) -> String {
    value
        .map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// `file=a.txt line=3`, for tables.
fn labels(labels: &Value) -> String {
    match labels.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => "-".into(),
    }
}

fn cost(report: &Report) -> String {
    let reported = report.metrics.input_tokens + report.metrics.output_tokens;
    match (report.metrics.cost_usd, &report.batch.model) {
        (Some(cost), _) => format!("${cost:.4}"),
        (None, _) if reported == 0 => "none (the model reported no token usage)".into(),
        (None, Some(model)) => format!("unknown (no [prices.\"{model}\"] in skillstate.toml)"),
        (None, None) => "unknown".into(),
    }
}

fn batch_state(report: &Report) -> String {
    match (&report.batch.state, &report.batch.stop_reason) {
        (BatchState::Open, _) => "open".into(),
        (BatchState::Stopped, Some(reason)) => format!("stopped ({reason})"),
        (BatchState::Stopped, None) => "stopped".into(),
    }
}

fn counts_line(report: &Report) -> String {
    let c = &report.counts;
    let mut text = format!(
        "{} tasks: {} completed, {} failed, {} running, {} queued, {} retry-waiting, {} paused",
        c.total, c.completed, c.failed, c.running, c.queued, c.retry_waiting, c.paused
    );
    if c.unknown > 0 {
        text.push_str(&format!(", {} unreadable", c.unknown));
    }
    text
}

fn eta(report: &Report) -> String {
    match (report.metrics.eta_ms, &report.batch.state) {
        (Some(0), _) => "done".into(),
        (Some(ms), _) => duration(ms),
        (None, BatchState::Stopped) => {
            "none: the batch is stopped (batch reopen or batch retry reopens it)".into()
        }
        (None, BatchState::Open) => "unknown until a task finishes".into(),
    }
}

/// The metric lines shared by the terminal and Markdown.
fn metric_lines(report: &Report) -> Vec<(&'static str, String)> {
    let m = &report.metrics;
    vec![
        ("task completion rate", percent(m.completion_rate)),
        (
            "rejected-answer rate",
            format!(
                "{} ({} of {} answers)",
                percent(m.rejected_answer_rate),
                m.rejected_answers,
                m.answers
            ),
        ),
        (
            "invalid tool call rate",
            format!(
                "{} ({} unknown tool or invalid arguments, {} tool errors)",
                percent(m.invalid_tool_call_rate),
                m.tool_call_rejections,
                m.tool_errors
            ),
        ),
        (
            "outcome unknown",
            format!(
                "{} (actions whose outcome a crash left unknown; not counted as tool errors)",
                m.outcome_unknown
            ),
        ),
        ("avg tokens per task", number(m.avg_tokens_per_task, 0)),
        (
            "avg duration per task",
            m.avg_duration_ms
                .map(|d| duration(d as i64))
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "tokens",
            format!(
                "{} (prompt {} counted; provider input {}, output {})",
                m.tokens, m.prompt_tokens, m.input_tokens, m.output_tokens
            ),
        ),
        ("cost", cost(report)),
        (
            "steps p50 / p95",
            format!("{} / {}", number(m.steps.p50, 0), number(m.steps.p95, 0)),
        ),
        (
            "duration p50 / p95",
            format!(
                "{} / {}",
                m.duration_ms
                    .p50
                    .map(|d| duration(d as i64))
                    .unwrap_or_else(|| "-".into()),
                m.duration_ms
                    .p95
                    .map(|d| duration(d as i64))
                    .unwrap_or_else(|| "-".into())
            ),
        ),
    ]
}

/// `batch status`: counts, tokens, cost, ETA, the slowest tasks and the failed ones.
pub fn status(report: &Report) -> String {
    let b = &report.batch;
    let mut out = format!(
        "batch {} ({}) — {}, created {}\n{}\n",
        b.id,
        b.name,
        batch_state(report),
        format_time(b.created_at),
        counts_line(report)
    );
    let settings: Vec<String> = [("skill", &b.skill), ("model", &b.model)]
        .into_iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| format!("{name} {v}")))
        .collect();
    if !settings.is_empty() {
        out.push_str(&format!("{}\n", settings.join(", ")));
    }
    for (name, value) in metric_lines(report) {
        out.push_str(&format!("{name}: {value}\n"));
    }
    out.push_str(&format!("ETA: {}\n", eta(report)));
    let slowest = report.slowest(5);
    if !slowest.is_empty() {
        out.push_str("\nslowest tasks:\n");
        let mut table = Table::new(&["TASK", "LABELS", "STATUS", "STEPS", "DURATION"]);
        for row in slowest {
            table.row(vec![
                row.id.clone(),
                labels(&row.labels),
                row.status.as_str().into(),
                row.steps.to_string(),
                row.duration_ms.map(duration).unwrap_or_else(|| "-".into()),
            ]);
        }
        out.push_str(&table.render());
    }
    let failures = report.failures();
    if !failures.is_empty() {
        out.push_str(&format!("\nfailed tasks ({}):\n", failures.len()));
        for row in failures.iter().take(20) {
            out.push_str(&format!(
                "  {} [{}] {} — {}\n",
                row.id,
                labels(&row.labels),
                row.status.as_str(),
                row.failure.as_deref().unwrap_or("no reason recorded")
            ));
        }
        if failures.len() > 20 {
            out.push_str(&format!(
                "  … and {} more (skillstate batch report {} --format md)\n",
                failures.len() - 20,
                b.id
            ));
        }
    }
    out
}

/// A Markdown cell: pipes escaped, lines joined.
fn cell(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

pub fn markdown(report: &Report) -> String {
    let b = &report.batch;
    let mut out = format!("# Batch {}\n\n", cell(&b.name));
    out.push_str(&format!("- id: `{}`\n", b.id));
    out.push_str(&format!("- state: {}\n", cell(&batch_state(report))));
    if let Some(skill) = &b.skill {
        out.push_str(&format!("- skill: `{}`\n", cell(skill)));
    }
    if let Some(model) = &b.model {
        out.push_str(&format!("- model: `{}`\n", cell(model)));
    }
    out.push_str(&format!("- created: {}\n", format_time(b.created_at)));
    out.push_str(&format!(
        "- report generated: {}\n\n",
        format_time(report.generated_at)
    ));
    let c = &report.counts;
    out.push_str("| status | tasks |\n|---|---:|\n");
    for (name, count) in [
        ("completed", c.completed),
        ("failed", c.failed),
        ("running", c.running),
        ("queued", c.queued),
        ("retry-waiting", c.retry_waiting),
        ("paused", c.paused),
        ("unreadable", c.unknown),
        ("total", c.total),
    ] {
        out.push_str(&format!("| {name} | {count} |\n"));
    }
    out.push_str("\n## Metrics\n\n| metric | value |\n|---|---|\n");
    for (name, value) in metric_lines(report) {
        out.push_str(&format!("| {name} | {} |\n", cell(&value)));
    }
    out.push_str(&format!("| ETA | {} |\n", cell(&eta(report))));
    out.push_str(
        "\n## Tasks\n\n| task | labels | status | steps | tries | tokens | duration | failure |\n|---|---|---|---:|---:|---:|---:|---|\n",
    );
    for row in &report.tasks {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            row.id,
            cell(&labels(&row.labels)),
            row.status.as_str(),
            row.steps,
            row.tries,
            row.tokens,
            row.duration_ms.map(duration).unwrap_or_else(|| "-".into()),
            cell(row.failure.as_deref().unwrap_or(""))
        ));
    }
    out
}

/// One CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

pub const CSV_HEADER: &str = "task,labels,status,steps,tries,tokens,prompt_tokens,input_tokens,output_tokens,answers,rejected_answers,tool_call_rejections,tool_errors,outcome_unknown,duration_ms,cost_usd,failure";

fn csv_row(row: &TaskRow) -> String {
    [
        row.id.clone(),
        row.labels.to_string(),
        row.status.as_str().to_owned(),
        row.steps.to_string(),
        row.tries.to_string(),
        row.tokens.to_string(),
        row.prompt_tokens.to_string(),
        row.input_tokens.to_string(),
        row.output_tokens.to_string(),
        row.answers.to_string(),
        row.rejected_answers.to_string(),
        row.tool_call_rejections.to_string(),
        row.tool_errors.to_string(),
        row.outcome_unknown.to_string(),
        row.duration_ms.map(|d| d.to_string()).unwrap_or_default(),
        row.cost_usd.map(|c| format!("{c:.6}")).unwrap_or_default(),
        row.failure.clone().unwrap_or_default(),
    ]
    .iter()
    .map(|f| csv_field(f))
    .collect::<Vec<_>>()
    .join(",")
}

pub fn csv(report: &Report) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for row in &report.tasks {
        out.push_str(&csv_row(row));
        out.push('\n');
    }
    out
}

pub fn json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\"\nnow"), "\"say \"\"hi\"\"\nnow\"");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_340), "12.3s");
        assert_eq!(duration(245_000), "4m 05s");
        assert_eq!(duration(7_380_000), "2h 03m");
    }

    /// A finished batch: 10 answers, 2 tool-call rejections, 1 tool error, 3 actions whose
    /// outcome a crash left unknown.
    fn report_with_unknown_outcomes() -> Report {
        let task = |id: &str, tool_errors: u64, outcome_unknown: u64| skillstate_store::BatchTask {
            id: id.into(),
            status: Some(skillstate_store::TaskStatus::Completed),
            queue: Some(skillstate_store::QueueState::Done),
            tries: 0,
            labels: serde_json::json!({}),
            version: 5,
            outcome: None,
            failure: None,
            accepted: 5,
            rejected: 0,
            tool_call_rejections: 1,
            tool_errors,
            outcome_unknown,
            prompt_tokens: 100,
            input_tokens: 0,
            output_tokens: 0,
            created_at: 0,
            started_at: Some(0),
            updated_at: 10,
            leased: false,
        };
        let batch = skillstate_store::BatchRecord {
            id: "b".into(),
            name: "b".into(),
            spec: serde_json::json!({}),
            on_error: skillstate_store::OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: skillstate_store::RateLimit::default(),
            state: skillstate_store::BatchState::Open,
            stop_reason: None,
            created_at: 0,
        };
        Report::build(
            batch,
            &[task("t1", 1, 2), task("t2", 0, 1)],
            None,
            None,
            None,
            20,
        )
    }

    #[test]
    fn unknown_outcomes_are_shown_apart_from_the_invalid_tool_call_rate() {
        let report = report_with_unknown_outcomes();
        for text in [status(&report), markdown(&report)] {
            assert!(
                text.contains("30.0% (2 unknown tool or invalid arguments, 1 tool errors)"),
                "{text}"
            );
            assert!(text.contains("outcome unknown"), "{text}");
            assert!(
                text.contains("3 (actions whose outcome a crash left unknown"),
                "{text}"
            );
        }
        let csv = csv(&report);
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let column = header.iter().position(|h| *h == "outcome_unknown");
        let first: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let errors = header.iter().position(|h| *h == "tool_errors");
        assert_eq!(column.map(|c| first[c]), Some("2"), "{csv}");
        assert_eq!(errors.map(|c| first[c]), Some("1"), "{csv}");
    }

    #[test]
    fn markdown_cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc"), "a\\|b c");
    }
}
