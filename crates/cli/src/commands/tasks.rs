use std::process::ExitCode;

use anyhow::Result;

use crate::render::{Table, format_time};

pub async fn run(db: &str) -> Result<ExitCode> {
    let store = crate::config::open_existing(db).await?;
    let tasks = store.list_tasks().await?;
    if tasks.is_empty() {
        outln!("no tasks in {db}; start one with `skillstate run <skill> --model ...`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["TASK", "SKILL", "STATUS", "STEPS", "MODEL", "UPDATED"]);
    for task in tasks {
        table.row(vec![
            task.id,
            task.skill_name,
            match (&task.status, &task.problem) {
                (Some(status), None) => status.as_str().to_owned(),
                (Some(status), Some(problem)) => {
                    format!("{} (unreadable: {problem})", status.as_str())
                }
                (None, problem) => format!("unreadable: {}", problem.as_deref().unwrap_or("?")),
            },
            task.version.to_string(),
            task.model,
            format_time(task.updated_at),
        ]);
    }
    out!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}
