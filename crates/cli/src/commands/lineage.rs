//! Commands over a task's history: resume, fork, replay, gc.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use skillstate_core::skill::EnvironmentSettings;
use skillstate_providers::ModelProvider;
use skillstate_runtime::{NoProgress, Runner, fork_task, verify_journal};
use skillstate_store::{TaskRecord, TaskStatus, state_at};
use skillstate_tools::{Environment, UserRequest};

use crate::model::{ModelArgs, build_model, load_config};
use crate::render::outcome_line;

/// The world a stored task runs in, rebuilt from the settings it was created with.
fn environment_of(task: &TaskRecord, for_replay: bool) -> Result<Box<dyn Environment>> {
    match &task.environment {
        Some(value) => {
            let mut settings: EnvironmentSettings = serde_json::from_value(value.clone())
                .context("the task's stored environment settings")?;
            if for_replay {
                // Replaying a simulation must not write to the real audit log again.
                settings.params.remove("audit_log");
            }
            Ok(skillstate_envs::build_environment(&settings)?)
        }
        None => Ok(Box::new(UserRequest::new(String::new()))),
    }
}

/// The model (the task's own unless overridden) and the world a stored task continues with.
fn model_and_world(
    task: &TaskRecord,
    config_path: Option<&Path>,
    model_args: &ModelArgs,
) -> Result<(Arc<dyn ModelProvider>, Box<dyn Environment>)> {
    let config = load_config(config_path)?;
    let (spec, settings) = model_args.resolve(&config, Some(&task.model))?;
    let kind = task
        .environment
        .as_ref()
        .and_then(|e| e.get("kind"))
        .and_then(|k| k.as_str())
        .map(str::to_owned);
    Ok((
        build_model(&spec, &settings, kind.as_deref())?,
        environment_of(task, false)?,
    ))
}

#[derive(clap::Args)]
pub struct ReplyArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// The answer: to the model's `ask_user` question, or what happened to an action whose
    /// outcome is unknown.
    answer: String,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

/// Answers a paused task and runs it on.
pub async fn reply(db: &str, config_path: Option<&Path>, args: ReplyArgs) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let task = store.task(&args.task).await?;
    let (model, mut env) = model_and_world(&task, config_path, &args.model)?;
    let outcome = Runner::new(store, model, env.as_mut(), &mut NoProgress)
        .reply(&task.id, &args.answer)
        .await?;
    println!(
        "{}",
        outcome_line(
            &outcome.task_id,
            outcome.status,
            outcome.steps,
            outcome.outcome.as_ref()
        )
    );
    Ok(match outcome.status {
        TaskStatus::Failed => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}

/// Tasks waiting for a human, with what they wait for.
pub async fn pending(db: &str) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let mut any = false;
    for summary in store.list_tasks().await? {
        if summary.status != TaskStatus::AwaitingInput {
            continue;
        }
        let task = store.task(&summary.id).await?;
        let question = task
            .outcome
            .as_ref()
            .and_then(|o| o.get("question"))
            .and_then(|q| q.as_str())
            .unwrap_or("(no question recorded)");
        println!(
            "{}  {}  step {}  waiting for input: {question}",
            task.id, task.skill.name, task.version
        );
        any = true;
    }
    if any {
        println!("answer with: skillstate reply <task> \"...\"");
    } else {
        println!("no task is waiting");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

/// Continues a task after a crash, a kill or a reboot, from its last committed step.
pub async fn resume(db: &str, config_path: Option<&Path>, args: ResumeArgs) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let task = store.task(&args.task).await?;
    if task.status != TaskStatus::Running {
        println!(
            "{}",
            outcome_line(&task.id, task.status, task.version, task.outcome.as_ref())
        );
        println!("nothing to resume: the task is {}", task.status.as_str());
        return Ok(ExitCode::SUCCESS);
    }
    let (model, mut env) = model_and_world(&task, config_path, &args.model)?;
    let outcome = Runner::new(store, model, env.as_mut(), &mut NoProgress)
        .run(&task.id)
        .await?;
    println!(
        "{}",
        outcome_line(
            &outcome.task_id,
            outcome.status,
            outcome.steps,
            outcome.outcome.as_ref()
        )
    );
    Ok(match outcome.status {
        TaskStatus::Failed => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}

#[derive(clap::Args)]
pub struct ForkArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// The new task starts from the state after this step.
    #[arg(long)]
    step: u64,
}

pub async fn fork(db: &str, args: ForkArgs) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let parent = store.task(&args.task).await?;
    let mut env = environment_of(&parent, true)?;
    let fork = fork_task(store.as_ref(), &parent.id, args.step, Some(env.as_mut())).await?;
    println!("{}", fork.id);
    eprintln!(
        "forked task {} at step {} (state hash {}); continue it with: skillstate resume {}",
        parent.id,
        args.step,
        skillstate_core::json::state_hash(&fork.state),
        fork.id
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Task id or a unique prefix of it.
    task: String,
}

pub async fn replay(db: &str, args: ReplayArgs) -> Result<ExitCode> {
    let store = skillstate_store::open(db).await?;
    let task = store.task(&args.task).await?;
    let check = verify_journal(store.as_ref(), &task).await?;
    match check.mismatch {
        None => {
            println!(
                "task {}: re-derived {} step(s) from the snapshot at step {}; every recorded state hash matches",
                task.id, check.steps_checked, check.from_step
            );
            Ok(ExitCode::SUCCESS)
        }
        Some((step, message)) => {
            println!(
                "task {}: journal mismatch at step {step}: {message}",
                task.id
            );
            println!(
                "(steps {}..{} verified before it)",
                check.from_step + 1,
                step.saturating_sub(1)
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

#[derive(clap::Args)]
pub struct GcArgs {
    /// Compact every task's journal to its last N steps (older steps become one snapshot).
    #[arg(long)]
    keep_last: Option<u64>,
    /// Delete completed and failed tasks not updated for this long (`30d`, `12h`, `90m`).
    #[arg(long, value_parser = parse_age)]
    older_than: Option<u64>,
    /// Say what would be done, change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Milliseconds in `30d` / `12h` / `90m` / `45s`.
fn parse_age(text: &str) -> Result<u64, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not an age like 30d, 12h or 90m"))?;
    let unit_ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return Err(format!("`{text}`: use d, h, m or s (30d, 12h, 90m, 45s)")),
    };
    Ok(n * unit_ms)
}

pub async fn gc(db: &str, args: GcArgs) -> Result<ExitCode> {
    if args.keep_last.is_none() && args.older_than.is_none() {
        bail!(
            "say what to collect: --keep-last N (compact journals) and/or --older-than 30d (delete finished tasks)"
        );
    }
    let store = skillstate_store::open(db).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let verb = if args.dry_run { "would" } else { "did" };
    let mut deleted = 0;
    let mut compacted = 0;
    for summary in store.list_tasks().await? {
        if let Some(age) = args.older_than
            && summary.status.is_terminal()
            && now - summary.updated_at > age as i64
        {
            if !args.dry_run {
                store.delete_task(&summary.id).await?;
            }
            println!(
                "{verb} delete task {} ({}, {} steps)",
                summary.id,
                summary.status.as_str(),
                summary.version
            );
            deleted += 1;
            continue;
        }
        if let Some(keep) = args.keep_last
            && summary.version > keep
        {
            let keep_from = summary.version - keep + 1;
            let base = keep_from - 1;
            let state = match state_at(store.as_ref(), &summary.id, base, summary.version).await {
                Ok(state) => state,
                Err(skillstate_store::StoreError::Compacted { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let rows = if args.dry_run {
                0
            } else {
                store.compact_task(&summary.id, keep_from, &state).await?
            };
            println!(
                "{verb} compact task {} to steps {keep_from}..{} ({rows} rows removed)",
                summary.id, summary.version
            );
            compacted += 1;
        }
    }
    println!("{verb} delete {deleted} task(s) and compact {compacted} journal(s)");
    Ok(ExitCode::SUCCESS)
}
