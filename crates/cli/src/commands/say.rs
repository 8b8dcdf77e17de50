//! `skillstate say`: sends a task a message through its inbox, then continues the task here
//! unless a runner elsewhere (a worker, `skillstate serve`) holds it or `--no-run` is given.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use skillstate_runtime::is_canceled;
use skillstate_store::{MessageKind, NewMessage};

use super::lineage::{Decision, continue_task};
use crate::config::{load_config, open_store};
use crate::model::ModelArgs;

/// Who `say` writes as, in the inbox.
const AUTHOR: &str = "cli";

#[derive(clap::Args)]
pub struct SayArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// The message. A running task sees it at its next step; a task waiting for a reply takes
    /// it as the reply; one waiting for approval takes it as a refusal showing the message; a
    /// finished one is reopened with it.
    message: String,
    /// Only post the message; a worker (or a later `skillstate resume`) delivers it.
    #[arg(long)]
    no_run: bool,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

pub async fn run(db: &str, config_path: Option<&Path>, args: SayArgs) -> Result<ExitCode> {
    if args.message.trim().is_empty() {
        bail!("the message is empty; say something: skillstate say <task> \"...\"");
    }
    let config = load_config(config_path)?;
    let store = open_store(db, &config).await?;
    let task = store.task(&args.task).await?;
    if is_canceled(&task) {
        bail!(
            "task {} was cancelled; it takes no messages (to continue from a step: skillstate fork {} --step N)",
            task.id,
            task.id
        );
    }
    let posted = store
        .post_message(
            &task.id,
            &NewMessage {
                kind: MessageKind::Message,
                text: args.message.clone(),
                author: AUTHOR.to_owned(),
            },
        )
        .await?;
    let held = store
        .lease(&task.id)
        .await?
        .filter(|lease| lease.expires_at > now_millis());
    if let Some(lease) = held {
        errln!(
            "message {} posted; {} is running the task and shows it at its next step",
            posted.id,
            lease.holder
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.no_run {
        errln!(
            "message {} posted; a worker delivers it, or run the task here with: skillstate resume {}",
            posted.id,
            task.id
        );
        return Ok(ExitCode::SUCCESS);
    }
    errln!("message {} posted; continuing the task", posted.id);
    continue_task(db, config_path, &task.id, &args.model, Decision::Delivered).await
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
