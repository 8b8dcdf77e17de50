//! A batch's `output_dir`: one result JSON per task (named after its input: `<file>.json` for
//! an input directory, `line-<n>.json` for a .jsonl file), plus summary.json (the JSON report)
//! and summary.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use skillstate_store::prelude::*;

use super::render;
use super::report::{Report, TaskRow};
use crate::hidden::Hidden;

/// The result file of a task, from its labels.
pub fn result_name(row: &TaskRow) -> String {
    let name = match (row.labels.get("line"), row.labels.get("file")) {
        (Some(line), _) => format!("line-{line}"),
        (None, Some(Value::String(file))) => file.clone(),
        _ => row.id.clone(),
    };
    let safe: String = name
        .chars()
        .map(|c| {
            if c == '/' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    let safe = if safe.starts_with('.') {
        format!("_{safe}")
    } else {
        safe
    };
    format!("{safe}.json")
}

/// Writes every task's result and the two summaries; returns the summary.md path.
pub async fn write(dir: &Path, store: &dyn Store, report: &Report) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("output_dir: cannot create {}", dir.display()))?;
    for row in &report.tasks {
        let task = store.task(&row.id).await?;
        // An export shows no write-only value of the task's state.
        let hidden = Hidden::of_task(&task);
        let result = json!({
            "task": row.id,
            "labels": row.labels,
            "status": row.status,
            "task_status": task.status.as_str(),
            "steps": row.steps,
            "tries": row.tries,
            "failure": row.failure.as_deref().map(|f| hidden.text(f).into_owned()),
            "outcome": task.outcome.clone().map(|o| hidden.json(o)),
            "state": hidden.state(task.state.clone()),
            "tokens": row.tokens,
            "prompt_tokens": row.prompt_tokens,
            "input_tokens": row.input_tokens,
            "output_tokens": row.output_tokens,
            "rejected_answers": row.rejected_answers,
            "tool_call_rejections": row.tool_call_rejections,
            "tool_errors": row.tool_errors,
            "outcome_unknown": row.outcome_unknown,
            "duration_ms": row.duration_ms,
            "cost_usd": row.cost_usd,
        });
        let path = dir.join(result_name(row));
        let text = serde_json::to_string_pretty(&result).unwrap_or_default();
        write_file(&path, &(text + "\n"))?;
    }
    write_file(&dir.join("summary.json"), &render::json(report))?;
    let summary = dir.join("summary.md");
    write_file(&summary, &render::markdown(report))?;
    Ok(summary)
}

/// Writes through a temporary file and a rename, so a reader never sees half a file.
fn write_file(path: &Path, text: &str) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!("{name}.partial"));
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, path))
        .with_context(|| format!("output_dir: cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::batch::report::Standing;

    fn row(labels: Value) -> TaskRow {
        TaskRow {
            id: "019a".into(),
            labels,
            status: Standing::Completed,
            steps: 0,
            tries: 0,
            tokens: 0,
            prompt_tokens: 0,
            input_tokens: 0,
            output_tokens: 0,
            answers: 0,
            rejected_answers: 0,
            tool_call_rejections: 0,
            tool_errors: 0,
            outcome_unknown: 0,
            duration_ms: None,
            cost_usd: None,
            failure: None,
        }
    }

    #[test]
    fn results_are_named_after_their_input() {
        assert_eq!(
            result_name(&row(json!({"file": "order-7.txt"}))),
            "order-7.txt.json"
        );
        assert_eq!(
            result_name(&row(json!({"line": 12, "kind": "x"}))),
            "line-12.json"
        );
        assert_eq!(result_name(&row(json!({}))), "019a.json");
        assert_eq!(result_name(&row(json!({"file": "../up"}))), "_.._up.json");
    }
}
