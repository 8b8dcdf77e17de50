use std::process::ExitCode;

use anyhow::Result;

use crate::render::{Table, format_time};

pub async fn run(db: &str) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let tasks = store.list_tasks().await?;
    if tasks.is_empty() {
        println!("no tasks in {db}; start one with `skillstate run <skill> --model ...`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["TASK", "SKILL", "STATUS", "STEPS", "MODEL", "UPDATED"]);
    for task in tasks {
        table.row(vec![
            task.id,
            task.skill_name,
            task.status.as_str().to_owned(),
            task.version.to_string(),
            task.model,
            format_time(task.updated_at),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}
