//! Commands over a task's history: resume, fork, replay, gc.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};
use skillstate_providers::ModelProvider;
use skillstate_runtime::{NoProgress, Runner, fork_task, is_retryable, verify_journal};
use skillstate_store::{TaskRecord, TaskStatus, state_at};

use super::{World, world_of_task};
use crate::config::{Config, lease_policy, load_config, open_existing, open_store};
use crate::hidden::{Hidden, shown_outcome};
use crate::model::{ModelArgs, build_model};
use crate::render::outcome_line;

/// The model (the task's own unless overridden) and the world a stored task continues with.
async fn model_and_world(
    task: &TaskRecord,
    config: &Config,
    model_args: &ModelArgs,
) -> Result<(Arc<dyn ModelProvider>, World)> {
    let (spec, settings) = model_args.resolve(config, Some(&task.model))?;
    let kind = task
        .environment
        .as_ref()
        .and_then(|e| e.get("kind"))
        .and_then(|k| k.as_str())
        .map(str::to_owned);
    let model = build_model(&spec, &settings, kind.as_deref())?;
    Ok((model, world_of_task(task, config, false).await?))
}

/// What a stored task is told before it continues.
pub(super) enum Decision<'a> {
    Resume,
    /// Run it whatever its status: its inbox holds what continues it (`skillstate say`).
    Delivered,
    Retry,
    Reply(&'a str),
    Approve,
    Reject(&'a str),
}

/// Continues a stored task with its model and world, then shuts the world down.
pub(super) async fn continue_task(
    db: &str,
    config_path: Option<&Path>,
    task_ref: &str,
    model_args: &ModelArgs,
    decision: Decision<'_>,
) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    let store = open_store(db, &config).await?;
    let task = store.task(task_ref).await?;
    // Entries waiting in the inbox (`say --no-run`, the service) are what continues a task
    // that is not running: `resume` delivers them, as a worker would.
    let waiting = !store.pending_messages(&task.id).await?.is_empty();
    if matches!(decision, Decision::Resume) && task.status != TaskStatus::Running && !waiting {
        // Nothing runs: say why and what would, and exit non-zero so scripts notice.
        let outcome = task.outcome.clone().map(|o| Hidden::of_task(&task).json(o));
        outln!(
            "{}",
            outcome_line(&task.id, task.status, task.version, outcome.as_ref())
        );
        let hint = match task.status {
            TaskStatus::Failed if is_retryable(task.outcome.as_ref()) => format!(
                "; the failure can be retried: skillstate resume {} --retry",
                task.id
            ),
            TaskStatus::Failed | TaskStatus::Completed => format!(
                "; to continue from an earlier step: skillstate fork {} --step N",
                task.id
            ),
            TaskStatus::AwaitingApproval => format!(
                "; it waits for: skillstate approve {0} | reject {0} --reason \"...\"",
                task.id
            ),
            TaskStatus::AwaitingInput => {
                format!("; it waits for: skillstate reply {} \"...\"", task.id)
            }
            TaskStatus::Running => String::new(),
        };
        errln!(
            "nothing to resume: the task is {}{hint}",
            task.status.as_str()
        );
        return Ok(ExitCode::FAILURE);
    }
    let (model, mut world) = model_and_world(&task, &config, model_args).await?;
    let mut observer = NoProgress;
    let label = match decision {
        Decision::Resume => "skillstate resume",
        Decision::Delivered => "skillstate say",
        Decision::Retry => "skillstate resume --retry",
        Decision::Reply(_) => "skillstate reply",
        Decision::Approve => "skillstate approve",
        Decision::Reject(_) => "skillstate reject",
    };
    let mut runner = Runner::new(store.clone(), model, world.env.as_mut(), &mut observer)
        .with_lease_policy(lease_policy(&config, label))
        .with_secrets(&config.secrets());
    let outcome = match decision {
        Decision::Resume | Decision::Delivered => runner.run(&task.id).await,
        Decision::Retry => runner.retry(&task.id).await,
        Decision::Reply(answer) => runner.reply(&task.id, answer).await,
        Decision::Approve => runner.approve(&task.id).await,
        Decision::Reject(reason) => runner.reject(&task.id, reason).await,
    };
    world.shutdown().await;
    let outcome = outcome?;
    let shown = shown_outcome(store.as_ref(), &outcome.task_id, outcome.outcome.as_ref()).await;
    outln!(
        "{}",
        outcome_line(
            &outcome.task_id,
            outcome.status,
            outcome.steps,
            shown.as_ref()
        )
    );
    Ok(match outcome.status {
        TaskStatus::Failed => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
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
    continue_task(
        db,
        config_path,
        &args.task,
        &args.model,
        Decision::Reply(&args.answer),
    )
    .await
}

#[derive(clap::Args)]
pub struct ApproveArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

/// Runs the action waiting for approval, once, and continues the task.
pub async fn approve(db: &str, config_path: Option<&Path>, args: ApproveArgs) -> Result<ExitCode> {
    continue_task(db, config_path, &args.task, &args.model, Decision::Approve).await
}

#[derive(clap::Args)]
pub struct RejectArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Why; the model sees it as the action's result.
    #[arg(long, default_value = "no reason given")]
    reason: String,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

/// Refuses the action waiting for approval; the task continues with the refusal as its result.
pub async fn reject(db: &str, config_path: Option<&Path>, args: RejectArgs) -> Result<ExitCode> {
    continue_task(
        db,
        config_path,
        &args.task,
        &args.model,
        Decision::Reject(&args.reason),
    )
    .await
}

/// Tasks waiting for a human, with what they wait for.
pub async fn pending(db: &str) -> Result<ExitCode> {
    let store = open_existing(db).await?;
    let mut any = false;
    for summary in store.list_tasks().await? {
        if !matches!(
            summary.status,
            Some(TaskStatus::AwaitingInput | TaskStatus::AwaitingApproval)
        ) {
            continue;
        }
        let task = store.task(&summary.id).await?;
        let outcome = Hidden::of_task(&task).json(task.outcome.clone().unwrap_or_default());
        let waiting = if task.status == TaskStatus::AwaitingApproval {
            format!(
                "approval of {} {}",
                outcome["tool"].as_str().unwrap_or("?"),
                outcome["args"]
            )
        } else {
            format!(
                "input: {}",
                outcome["question"]
                    .as_str()
                    .unwrap_or("(no question recorded)")
            )
        };
        outln!(
            "{}  {}  step {}  waiting for {waiting}",
            task.id,
            task.skill.name,
            task.version
        );
        any = true;
    }
    if any {
        outln!(
            "answer with: skillstate reply <task> \"...\" | approve <task> | reject <task> --reason \"...\""
        );
    } else {
        outln!("no task is waiting");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Continue a task that failed for a reason worth retrying (the model server was
    /// unreachable, every answer of a step was rejected): the failed step gets a fresh retry
    /// budget and the task goes on from its journal.
    #[arg(long)]
    retry: bool,
    /// Defaults to the model the task was started with.
    #[command(flatten)]
    model: ModelArgs,
}

/// Continues a task after a crash, a kill or a reboot, from its last committed step.
pub async fn resume(db: &str, config_path: Option<&Path>, args: ResumeArgs) -> Result<ExitCode> {
    let decision = if args.retry {
        Decision::Retry
    } else {
        Decision::Resume
    };
    continue_task(db, config_path, &args.task, &args.model, decision).await
}

#[derive(clap::Args)]
pub struct ForkArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// The new task starts from the state after this step.
    #[arg(long)]
    step: u64,
}

pub async fn fork(db: &str, config_path: Option<&Path>, args: ForkArgs) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    let store = open_store(db, &config).await?;
    let parent = store.task(&args.task).await?;
    let mut world = world_of_task(&parent, &config, true).await?;
    let fork = fork_task(
        store.as_ref(),
        &parent.id,
        args.step,
        Some(world.env.as_mut()),
    )
    .await;
    world.shutdown().await;
    let fork = fork?;
    outln!("{}", fork.id);
    let hash = if Hidden::of_task(&fork).hides_values() {
        "withheld: write-only values".to_owned()
    } else {
        skillstate_core::json::state_hash(&fork.state)
    };
    errln!(
        "forked task {} at step {} (state hash {hash}); continue it with: skillstate resume {}",
        parent.id,
        args.step,
        fork.id
    );
    // A fork of a board member joins its board with the same scope: say so, since its steps
    // write the shared board.
    if let Some(board) = store.task_board(&fork.id).await? {
        let name = match store.board(&board, None).await {
            Ok(record) => record.name,
            Err(_) => board.clone(),
        };
        errln!(
            "the fork is a member of board {name} ({board}), as its parent is: its prompts show the board as it is now, and its steps write it within the skill's [board] writes"
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Task id or a unique prefix of it.
    task: String,
}

pub async fn replay(db: &str, args: ReplayArgs) -> Result<ExitCode> {
    let store = open_existing(db).await?;
    let task = store.task(&args.task).await?;
    let check = verify_journal(store.as_ref(), &task).await?;
    match check.mismatch {
        None => {
            outln!(
                "task {}: re-derived {} step(s) from the snapshot at step {}; every recorded state hash matches",
                task.id,
                check.steps_checked,
                check.from_step
            );
            Ok(ExitCode::SUCCESS)
        }
        Some((step, message)) => {
            outln!(
                "task {}: journal mismatch at step {step}: {message}",
                task.id
            );
            outln!(
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
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    keep_last: Option<u64>,
    /// Delete completed and failed tasks not updated for this long (`30d`, `12h`, `90m`).
    #[arg(long, value_parser = parse_age)]
    older_than: Option<u64>,
    /// Say what would be done, change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Milliseconds in `30d` / `12h` / `90m` / `45s`. An age too long to count in milliseconds
/// (past 584 million years) saturates: it means "older than any task can be", so nothing
/// qualifies, which is what the user asked for.
fn parse_age(text: &str) -> Result<u64, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    if number.is_empty() {
        return Err(format!("`{text}` is not an age like 30d, 12h or 90m"));
    }
    let unit_ms: u64 = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1_000,
        _ => return Err(format!("`{text}`: use d, h, m or s (30d, 12h, 90m, 45s)")),
    };
    // Only digits are left, so the one way to fail is a number beyond u64.
    let n: u64 = number.parse().unwrap_or(u64::MAX);
    Ok(n.saturating_mul(unit_ms))
}

/// Whether a task last updated at `updated_at` (ms since the epoch) is older than `age_ms` at
/// `now_ms`. Exact for every input: an age longer than the time since the epoch, or a
/// timestamp from the future, never qualifies.
fn older_than(now_ms: i64, updated_at: i64, age_ms: u64) -> bool {
    i128::from(now_ms) - i128::from(updated_at) > i128::from(age_ms)
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
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let verb = if args.dry_run { "would" } else { "did" };
    let mut deleted = 0;
    let mut compacted = 0;
    // Whole partitions first (PostgreSQL: the tasks created in one period, when all qualify);
    // the tasks left are deleted one by one below.
    let mut in_dropped = std::collections::HashSet::new();
    if let Some(age) = args.older_than {
        let updated_before = i64::try_from(
            (i128::from(now) - i128::from(age)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)),
        )
        .unwrap_or(i64::MIN);
        for partition in store
            .retire_partitions(updated_before, args.dry_run)
            .await?
        {
            outln!(
                "{verb} drop partition {} (tasks created before {}): {} finished task(s)",
                partition.name,
                skillstate_store::time::utc(partition.to_ms),
                partition.tasks.len()
            );
            deleted += partition.tasks.len();
            in_dropped.extend(partition.tasks);
        }
    }
    for summary in store.list_tasks().await? {
        if in_dropped.contains(&summary.id) {
            continue;
        }
        if let Some(age) = args.older_than
            && summary.status.is_some_and(TaskStatus::is_terminal)
            && older_than(now, summary.updated_at, age)
        {
            if !args.dry_run {
                store.delete_task(&summary.id).await?;
            }
            outln!(
                "{verb} delete task {} ({}, {} steps)",
                summary.id,
                summary.status.map_or("?", TaskStatus::as_str),
                summary.version
            );
            deleted += 1;
            continue;
        }
        if let Some(keep) = args.keep_last
            && summary.version > keep
        {
            // A task another process is driving keeps its journal until that run ends.
            if let Some(lease) = store.lease(&summary.id).await?
                && lease.expires_at > now
            {
                outln!(
                    "skipped task {}: it is being run by {}",
                    summary.id,
                    lease.holder
                );
                continue;
            }
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
            outln!(
                "{verb} compact task {} to steps {keep_from}..{} ({rows} rows removed)",
                summary.id,
                summary.version
            );
            compacted += 1;
        }
    }
    outln!("{verb} delete {deleted} task(s) and compact {compacted} journal(s)");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod gc_tests {
    use super::*;

    #[test]
    fn ages_that_overflow_saturate_instead_of_wrapping() {
        assert_eq!(parse_age("30d"), Ok(30 * 86_400_000));
        assert_eq!(
            parse_age("10000000000000000s"),
            Ok(10_000_000_000_000_000_000)
        );
        assert_eq!(parse_age("99999999999999999999999d"), Ok(u64::MAX));
        assert_eq!(parse_age("18446744073709551615h"), Ok(u64::MAX));
        for bad in ["", "d", "-5d", "5", "5w", "1.5h"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_age_beyond_the_epoch_or_a_future_timestamp_never_qualifies() {
        let now = 1_800_000_000_000;
        assert!(older_than(now, now - 10, 5));
        assert!(!older_than(now, now - 10, 10));
        assert!(!older_than(now, 0, u64::MAX));
        assert!(!older_than(now, i64::MAX, 0));
        assert!(!older_than(now, i64::MIN, u64::MAX));
        assert!(older_than(now, i64::MIN, i64::MAX as u64));
        assert!(!older_than(i64::MIN, i64::MAX, 0));
    }
}
