use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use skillstate_core::{AcceptedStep, ContextStrategy, RejectedStep, SecretValues, WriteOnly};
use skillstate_runtime::{
    RunObserver, Runner, RuntimeError, TaskOptions, start_board_task, start_task,
};
use skillstate_store::TaskStatus;
use skillstate_tools::ToolOutput;

use super::{load_skill, world_for};
use crate::config::{lease_policy, load_config, open_store};
use crate::hidden::shown_outcome;
use crate::model::{ModelArgs, build_model};
use crate::render::outcome_line;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The skill directory (holds SKILL.md).
    skill: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// What each prompt keeps besides the procedure and tools.
    #[arg(long, default_value = "state", value_parser = parse_context)]
    context: ContextStrategy,
    /// Token budget for the whole prompt with `--context window` (default 1800) and
    /// `--context summary` (drops the oldest summary lines to fit; uncapped by default).
    #[arg(long, value_parser = crate::limits::parse_budget)]
    budget: Option<usize>,
    /// The directory the fs and shell tools are confined to (default: `[tools] work_dir` of the
    /// skill, else the current directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// The request that opens the task, for skills without a built-in environment.
    #[arg(long)]
    input: Option<String>,
    /// Attach the task to this board (name or id; `skillstate board create`): its prompts show
    /// the board through the skill's `[board] reads`, and it writes within `[board] writes`.
    #[arg(long)]
    board: Option<String>,
    /// Print only the final line.
    #[arg(long, short)]
    quiet: bool,
}

fn parse_context(name: &str) -> Result<ContextStrategy, String> {
    ContextStrategy::parse(name).ok_or_else(|| {
        format!(
            "unknown context strategy `{name}`; use one of: {}",
            ContextStrategy::NAMES.join(", ")
        )
    })
}

/// Prints one line per step to stderr as the task runs, without the state's write-only values
/// (those of the initial state and whatever each answer writes at a write-only location).
struct StepPrinter {
    quiet: bool,
    write_only: WriteOnly,
    secrets: SecretValues,
}

impl RunObserver for StepPrinter {
    fn attempt(
        &mut self,
        step: u64,
        attempt: u32,
        prompt_tokens: usize,
        result: Result<&AcceptedStep, &RejectedStep>,
    ) {
        if self.quiet {
            return;
        }
        match result {
            Ok(accepted) => {
                self.write_only
                    .collect(&accepted.new_state, &mut self.secrets);
                errln!(
                    "step {step:>4}  prompt {prompt_tokens:>6} tok  {}",
                    self.secrets.scrub(&accepted.action.summary())
                )
            }
            Err(rejected) => {
                if let Some(parsed) = &rejected.parsed {
                    self.write_only
                        .collect_patch(&parsed.state_patch, &mut self.secrets);
                }
                errln!(
                    "step {step:>4}  prompt {prompt_tokens:>6} tok  attempt {attempt} rejected:"
                );
                for rejection in &rejected.rejections {
                    errln!("            {}", self.secrets.scrub(&rejection.to_string()));
                }
            }
        }
    }

    fn action_done(&mut self, _step: u64, output: &ToolOutput) {
        if !self.quiet && !output.ok {
            errln!("            -> {}", self.secrets.scrub(&output.text));
        }
    }
}

pub async fn run(db: &str, config_path: Option<&Path>, args: RunArgs) -> Result<ExitCode> {
    let skill = load_skill(&args.skill)?;
    let config = load_config(config_path)?;
    let mut world = world_for(
        &skill,
        &args.skill,
        args.input.as_deref(),
        args.work_dir.as_deref(),
        &config,
    )
    .await?;
    let (spec, settings) = args.model.resolve(&config, None)?;
    let kind = skill
        .settings()
        .environment
        .as_ref()
        .map(|e| e.kind.as_str());
    let model = build_model(&spec, &settings, kind)?;
    let store = open_store(db, &config).await?;
    let board = match &args.board {
        Some(name) => Some(store.board(name, None).await?),
        None => None,
    };
    let options = TaskOptions {
        model: model.spec(),
        context: args.context,
        context_budget: args.budget,
        environment: world.record(),
        secrets: config.secrets(),
    };
    // A task that joins a board is created with its membership, after the checks: a refused
    // join stores nothing.
    let started = match &board {
        Some(board) => {
            start_board_task(
                store.as_ref(),
                &skill,
                world.env.as_mut(),
                &options,
                &board.id,
                &board.name,
            )
            .await
        }
        None => start_task(store.as_ref(), &skill, world.env.as_mut(), &options).await,
    };
    let task = match started {
        Ok(task) => task,
        Err(error @ RuntimeError::CannotJoin { .. }) => {
            world.shutdown().await;
            anyhow::bail!("{}: {error}", args.skill.display());
        }
        Err(other) => {
            world.shutdown().await;
            return Err(other.into());
        }
    };
    if !args.quiet {
        errln!("task {} started ({} in {db})", task.id, skill.name());
    }
    if let Some(board) = &board
        && !args.quiet
    {
        errln!(
            "task {} joined board {} (version {})",
            task.id,
            board.name,
            board.version
        );
    }
    let write_only = WriteOnly::of_schema(&task.skill.schema);
    let secrets = write_only.secrets_of(&task.state);
    let mut printer = StepPrinter {
        quiet: args.quiet,
        write_only,
        secrets,
    };
    let outcome = Runner::new(store.clone(), model, world.env.as_mut(), &mut printer)
        .with_lease_policy(lease_policy(&config, "skillstate run"))
        .with_secrets(&config.secrets())
        .run(&task.id)
        .await;
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
    if !args.quiet {
        outln!("inspect it: skillstate show {}", outcome.task_id);
    }
    Ok(match outcome.status {
        TaskStatus::Failed => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}
