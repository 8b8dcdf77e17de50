//! `skillstate batch …` and `skillstate batches`: submit a batch file's tasks to the queue, run
//! them in this process, follow them, report on them, stop and reopen them and retry the failed
//! ones (docs/batches.md, "Batches and workers").

pub mod control;
pub mod inputs;
pub mod output;
pub mod pin;
pub mod progress;
pub mod render;
pub mod report;
pub mod spec;
pub mod submit;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use skillstate_runtime::{StopLevel, run_worker};
use skillstate_store::prelude::*;
use skillstate_store::{BatchRecord, BatchState};
use tokio::sync::mpsc;

use super::keys::check_tenant;
use super::worker::{CliHost, stop_on_signals, worker_options};
use crate::config::{Config, load_config, open_existing, open_store};
use crate::render::{Table, format_time};
use spec::BatchSpec;

/// The database a command was given: `--db` (or SKILLSTATE_DB) when set explicitly, else the
/// default. A batch file's `store:` applies only when neither was given.
pub struct DbChoice {
    pub location: String,
    pub explicit: bool,
}

impl DbChoice {
    fn for_spec(&self, spec: &BatchSpec) -> String {
        match (&spec.store, self.explicit) {
            (Some(store), false) => store.clone(),
            _ => self.location.clone(),
        }
    }
}

#[derive(clap::Args)]
pub struct BatchArgs {
    #[command(subcommand)]
    command: BatchCommand,
}

#[derive(clap::Subcommand)]
enum BatchCommand {
    /// Submit a batch file's tasks and run them in this process; summary and output_dir at the
    /// end. Exits 1 when a task failed for good.
    Run {
        /// The batch file (batch.yaml).
        file: PathBuf,
        /// The tenant that owns the batch's tasks: its API keys see them and the batch (as if
        /// `POST /v1/tasks:batch` had made it). Default: no tenant (the CLI's own).
        #[arg(long)]
        tenant: Option<String>,
        /// The skill version to create each task on when its line has no `skill_version`: a
        /// skill.toml version (1.2.0) or a hash prefix from `skillstate skills` (at least 6 hex
        /// characters). The skill directory's when it holds it, else a version the database
        /// keeps. Default: the skill directory's.
        #[arg(long, value_name = "VERSION")]
        skill_version: Option<String>,
    },
    /// Queue a batch file's tasks for workers (`skillstate worker`); prints the batch id.
    Submit {
        /// The batch file (batch.yaml).
        file: PathBuf,
        /// The tenant that owns the batch's tasks: its API keys see them and the batch (as if
        /// `POST /v1/tasks:batch` had made it). Default: no tenant (the CLI's own).
        #[arg(long)]
        tenant: Option<String>,
        /// The skill version to create each task on when its line has no `skill_version`: a
        /// skill.toml version (1.2.0) or a hash prefix from `skillstate skills` (at least 6 hex
        /// characters). The skill directory's when it holds it, else a version the database
        /// keeps. Default: the skill directory's.
        #[arg(long, value_name = "VERSION")]
        skill_version: Option<String>,
    },
    /// Run the queued tasks of a submitted batch in this process, as `batch run` does.
    Resume {
        /// Batch id or a unique prefix of it.
        batch: String,
    },
    /// Counts by status, tokens, cost, ETA, the slowest tasks and the failed ones.
    Status {
        /// Batch id or a unique prefix of it.
        batch: String,
    },
    /// The batch's metrics and one row per task.
    Report {
        /// Batch id or a unique prefix of it.
        batch: String,
        #[arg(long, value_enum, default_value = "md")]
        format: ReportFormat,
        /// Write the report to this file instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Queue the batch's failed tasks again (they resume from their journals) and reopen it.
    Retry {
        /// Batch id or a unique prefix of it.
        batch: String,
        /// Which tasks: the failed ones (the only choice for now).
        #[arg(long, required = true)]
        failed: bool,
    },
    /// Stop the batch: workers claim none of its queued tasks (running ones finish) until
    /// `batch reopen`.
    Stop {
        /// Batch id or a unique prefix of it.
        batch: String,
        /// Why, shown by `batch status` (a stopped batch keeps its first reason).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Open a stopped batch again: workers claim its queued tasks (nothing is requeued).
    Reopen {
        /// Batch id or a unique prefix of it.
        batch: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ReportFormat {
    Md,
    Json,
    Csv,
}

pub async fn run(db: &DbChoice, config_path: Option<&Path>, args: BatchArgs) -> Result<ExitCode> {
    match args.command {
        BatchCommand::Run {
            file,
            tenant,
            skill_version,
        } => {
            if let Some(tenant) = &tenant {
                check_tenant(tenant)?;
            }
            let pin = default_pin(skill_version.as_deref())?;
            let config = load_config(config_path)?;
            let spec = BatchSpec::load(&file)?;
            let location = db.for_spec(&spec);
            let prepared = submit::prepare(&spec, &config, &location, pin)
                .await?
                .for_tenant(tenant.as_deref());
            let store = open_store(&location, &config).await?;
            let submitted = prepared.submit(store.as_ref()).await?;
            errln!(
                "batch {} submitted: {} task(s) in {}",
                submitted.batch.id,
                submitted.tasks.len(),
                shown_db(&location)
            );
            drive(store, &config, &location, submitted.batch).await
        }
        BatchCommand::Submit {
            file,
            tenant,
            skill_version,
        } => {
            if let Some(tenant) = &tenant {
                check_tenant(tenant)?;
            }
            let pin = default_pin(skill_version.as_deref())?;
            let config = load_config(config_path)?;
            let spec = BatchSpec::load(&file)?;
            let location = db.for_spec(&spec);
            let prepared = submit::prepare(&spec, &config, &location, pin)
                .await?
                .for_tenant(tenant.as_deref());
            let store = open_store(&location, &config).await?;
            let submitted = prepared.submit(store.as_ref()).await?;
            outln!("{}", submitted.batch.id);
            errln!(
                "{} task(s) queued in {}; run them with: skillstate{} worker --concurrency N",
                submitted.tasks.len(),
                shown_db(&location),
                db_flag(&location)
            );
            Ok(ExitCode::SUCCESS)
        }
        BatchCommand::Resume { batch } => {
            let config = load_config(config_path)?;
            let store = open_store(&db.location, &config).await?;
            let batch = store.batch(&batch).await?;
            drive(store, &config, &db.location, batch).await
        }
        BatchCommand::Status { batch } => {
            let config = load_config(config_path)?;
            let store = open_existing(&db.location).await?;
            let report = report::load(store.as_ref(), &batch, &config).await?;
            out!("{}", render::status(&report));
            Ok(ExitCode::SUCCESS)
        }
        BatchCommand::Report {
            batch,
            format,
            output,
        } => {
            let config = load_config(config_path)?;
            let store = open_existing(&db.location).await?;
            let report = report::load(store.as_ref(), &batch, &config).await?;
            let text = match format {
                ReportFormat::Md => render::markdown(&report),
                ReportFormat::Json => render::json(&report),
                ReportFormat::Csv => render::csv(&report),
            };
            match output {
                Some(path) => {
                    std::fs::write(&path, text)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    errln!("report written to {}", path.display());
                }
                None => out!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        BatchCommand::Retry { batch, failed: _ } => {
            let config = load_config(config_path)?;
            let store = open_store(&db.location, &config).await?;
            let batch = store.batch(&batch).await?;
            let queued = store.requeue_failed(&batch.id).await?;
            outln!("{queued} failed task(s) of batch {} queued again", batch.id);
            if queued > 0 {
                errln!(
                    "run them with: skillstate{0} batch resume {1}   (or skillstate{0} worker --batch {1})",
                    db_flag(&db.location),
                    batch.id
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        BatchCommand::Stop { batch, reason } => {
            let config = load_config(config_path)?;
            let store = open_store(&db.location, &config).await?;
            control::stop(store.as_ref(), &db.location, &batch, reason.as_deref()).await
        }
        BatchCommand::Reopen { batch } => {
            let config = load_config(config_path)?;
            let store = open_store(&db.location, &config).await?;
            control::reopen(store.as_ref(), &db.location, &batch).await
        }
    }
}

/// `--skill-version`, checked.
fn default_pin(text: Option<&str>) -> Result<Option<pin::Pin>> {
    text.map(|text| {
        pin::Pin::parse(text).map_err(|message| anyhow::anyhow!("--skill-version: {message}"))
    })
    .transpose()
}

/// Runs the batch's queued tasks in this process until none is left (or a signal drains it),
/// then writes the summary.
async fn drive(
    store: Arc<dyn Store>,
    config: &Config,
    location: &str,
    batch: BatchRecord,
) -> Result<ExitCode> {
    let spec = BatchSpec::from_value(&batch.spec);
    let concurrency = spec
        .as_ref()
        .map(|s| s.concurrency)
        .unwrap_or(spec::DEFAULT_CONCURRENCY);
    let before = report::load(store.as_ref(), &batch.id, config).await?;
    let mut options = worker_options(config, "skillstate batch run", concurrency);
    options.batch = Some(batch.id.clone());
    options.until_idle = true;
    let stop = stop_on_signals("batch run");
    let (sender, receiver) = mpsc::unbounded_channel();
    let start = progress::Tally {
        total: before.counts.total,
        completed: before.counts.completed,
        failed: before.counts.failed,
        paused: before.counts.paused,
        ..progress::Tally::default()
    };
    let follower = tokio::spawn(progress::follow(receiver, start));
    let host = Arc::new(CliHost::new(config.clone()));
    let result = run_worker(store.clone(), host, options, stop.clone(), Some(sender)).await;
    let level = *stop.borrow();
    if level == StopLevel::Now {
        errln!(
            "stopped at once: running tasks stay leased until their leases expire; continue with: skillstate{} batch resume {}",
            db_flag(location),
            batch.id
        );
        std::process::exit(130);
    }
    let _ = follower.await;
    result?;
    let report = report::load(store.as_ref(), &batch.id, config).await?;
    out!("{}", render::status(&report));
    if let Some(dir) = spec.as_ref().and_then(|s| s.output_dir.as_ref()) {
        let summary = output::write(dir, store.as_ref(), &report).await?;
        outln!(
            "results: {} (one JSON per task), summary: {}",
            dir.display(),
            summary.display()
        );
    }
    outln!(
        "report: skillstate{} batch report {} --format md|json|csv",
        db_flag(location),
        batch.id
    );
    if report.counts.remaining() > 0 {
        let why = if level == StopLevel::Drain {
            "drained on a signal"
        } else if report.batch.state == BatchState::Stopped {
            "the batch is stopped; `batch reopen` (or `batch retry --failed`) reopens it"
        } else {
            "other workers hold them or their retries wait"
        };
        errln!(
            "{} task(s) still queued ({why}); continue with: skillstate{} batch resume {}",
            report.counts.remaining(),
            db_flag(location),
            batch.id
        );
    }
    Ok(if report.counts.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `skillstate batches`: every batch, newest first.
pub async fn list(db: &str, config_path: Option<&Path>) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    let store = open_existing(db).await?;
    let batches = store.list_batches().await?;
    if batches.is_empty() {
        outln!(
            "no batches in {}; submit one with `skillstate batch submit batch.yaml`",
            shown_db(db)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&[
        "BATCH", "NAME", "STATE", "TASKS", "DONE", "FAILED", "CREATED",
    ]);
    for batch in batches {
        let tasks = store.batch_tasks(&batch.id).await?;
        let report = report::build(batch, &tasks, &config, report::now_millis());
        table.row(vec![
            report.batch.id.clone(),
            report.batch.name.clone(),
            match report.batch.state {
                BatchState::Open => "open".into(),
                BatchState::Stopped => "stopped".into(),
            },
            report.counts.total.to_string(),
            report.counts.completed.to_string(),
            report.counts.failed.to_string(),
            format_time(report.batch.created_at),
        ]);
    }
    out!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

/// A database location fit to print: a URL's password is masked.
pub fn shown_db(location: &str) -> String {
    let Some((scheme, rest)) = location.split_once("://") else {
        return location.to_owned();
    };
    let Some((credentials, host)) = rest.split_once('@') else {
        return location.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => location.to_owned(),
    }
}

/// ` --db <location>` for printed commands, empty for the default database.
pub(crate) fn db_flag(location: &str) -> String {
    if location == skillstate_store::DEFAULT_DB {
        String::new()
    } else {
        let shown = shown_db(location);
        if shown.contains([' ', '?', '&', '\'', '"']) {
            format!(" --db '{shown}'")
        } else {
            format!(" --db {shown}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            shown_db("postgres://app:s3cret@db.example/prod"),
            "postgres://app:***@db.example/prod"
        );
        assert_eq!(shown_db("postgres://app@db/prod"), "postgres://app@db/prod");
        assert_eq!(shown_db("./batch.db"), "./batch.db");
        assert_eq!(db_flag(skillstate_store::DEFAULT_DB), "");
        assert_eq!(
            db_flag("postgres://u@h/d?options=-c%20search_path%3Dx"),
            " --db 'postgres://u@h/d?options=-c%20search_path%3Dx'"
        );
    }
}
