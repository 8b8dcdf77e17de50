//! The `skillstate` command: wires the crates together; no logic of its own beyond presentation.

#[macro_use]
mod term;
mod commands;
mod config;
mod hidden;
mod limits;
mod model;
mod render;
mod telemetry;
mod toolbox;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "skillstate",
    version,
    about = "Run long-horizon LLM agents on explicit, validated state"
)]
struct Cli {
    /// Database: a SQLite file path (created if missing) or a postgres:// URL. Default:
    /// db/skillstate.db in the data directory.
    #[arg(long, global = true, env = "SKILLSTATE_DB")]
    db: Option<String>,
    /// The data directory: the default database (db/) and the work directories tasks get
    /// when the operator names none (work/).
    #[arg(long, global = true, env = "SKILLSTATE_DATA_DIR", default_value = config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Model settings and prices (default: ./skillstate.toml when it exists).
    #[arg(long, global = true, env = "SKILLSTATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a skill directory and report every problem with its file and line or JSON pointer.
    Validate {
        /// The skill directory (holds SKILL.md).
        skill: PathBuf,
        /// Check the skill's `[board]` pointers against a board's schema: a schema file (JSON
        /// Schema, as given to `board create --schema`), or the name or id of a board in the
        /// database. Pointers that name nothing in it are errors, with their line.
        #[arg(long, value_name = "SCHEMA_FILE|BOARD")]
        board: Option<String>,
    },
    /// Start a task for a skill and run it to the end.
    Run(commands::run::RunArgs),
    /// Continue a task after a crash, a kill or a reboot.
    Resume(commands::lineage::ResumeArgs),
    /// Tasks waiting for a human (an `ask_user` question, an action of unknown outcome).
    Pending,
    /// Answer a waiting task and run it on.
    Reply(commands::lineage::ReplyArgs),
    /// Send a task a message (its next observation) and continue it.
    Say(commands::say::SayArgs),
    /// Run the action a task waits to have approved, exactly once, and continue.
    Approve(commands::lineage::ApproveArgs),
    /// Refuse the action a task waits to have approved; the reason becomes its result.
    Reject(commands::lineage::RejectArgs),
    /// List every tool a skill can use: source, side-effect class, approval, input schema.
    Tools(commands::tools::ToolsArgs),
    /// Start a new task from the state after a step of another; the original is untouched.
    Fork(commands::lineage::ForkArgs),
    /// Re-derive every state from the journal and check every recorded hash.
    Replay(commands::lineage::ReplayArgs),
    /// Retention: compact journals and delete old finished tasks.
    Gc(commands::lineage::GcArgs),
    /// Compare context strategies on a skill's environment (offline with the oracle model).
    Bench(commands::bench::BenchArgs),
    /// List the tasks in the database.
    Tasks,
    /// The skill versions in the database: name, version (skill.toml's, and the content
    /// hash), the tasks on each.
    Skills,
    /// Move a task (or every task on a version of a skill) to the version of the skill in a
    /// directory: a dry run showing the migrated state's diff or the precise errors; --apply
    /// commits it as a step of the task's journal.
    Upgrade(commands::upgrade::UpgradeArgs),
    /// Show a task: its state and one row per step, or the state/prompt of one step.
    Show(commands::show::ShowArgs),
    /// Search a task's journal: observations, results, reasoning, actions and state writes,
    /// newest first, with their step numbers.
    Search(commands::search::SearchArgs),
    /// Batches of tasks from a batch file: run, submit, resume, status, report, retry.
    Batch(commands::batch::BatchArgs),
    /// List the batches in the database.
    Batches,
    /// Claim queued tasks from the database and run them; SIGTERM or Ctrl-C drains.
    Worker(commands::worker::WorkerArgs),
    /// Serve the HTTP API (tasks, state, journal) with embedded workers.
    Serve(commands::serve::ServeArgs),
    /// The web viewer over this database, on 127.0.0.1 (serve's API and the page at /).
    View(commands::view::ViewArgs),
    /// API keys of the service, per tenant: create, list, revoke.
    #[command(subcommand)]
    Keys(commands::keys::KeysCommand),
    /// Boards: shared states several agents read and write (create, list, show, upgrade).
    #[command(subcommand)]
    Board(commands::board::BoardCommand),
}

/// Makes this process non-dumpable, before any thread or child exists: its /proc entries
/// (environ with the API keys, mem, fds) then belong to root and cannot be read or ptraced
/// by other processes of the same user, such as an unconfined shell command or an MCP server.
fn protect_process() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_dumpable(false).map_err(|e| e.to_string())?;
    Ok(())
}

/// The command line with the database resolved.
struct Resolved {
    db: String,
    config: Option<PathBuf>,
    command: Command,
}

/// The data directory's database (its directory is created when a command first writes). A database
/// of an earlier version in the current directory is not opened silently in its place.
fn default_db(data_dir: &std::path::Path) -> Result<String, String> {
    let db = data_dir.join("db").join("skillstate.db");
    let legacy = std::path::Path::new("skillstate.db");
    if !db.exists() && legacy.is_file() {
        return Err(format!(
            "./skillstate.db is a database of an earlier version, kept in the current directory, where a command's work directory could reach it. skillstate now keeps its database in {}. Move it there: mkdir -p {} && mv skillstate.db* {}/ (or name it with --db, keeping it apart from every work directory)",
            db.display(),
            data_dir.join("db").display(),
            data_dir.join("db").display(),
        ));
    }
    Ok(db.display().to_string())
}

/// mimalloc instead of the system allocator: over a long task the system allocator's
/// allocation time grew with the process's history (`_int_malloc` 3% of the time at 1,000
/// events, 8% at 10,000) and a step with it; docs/performance.md, "Performance".
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let protected = protect_process();
    let matches = Cli::command().get_matches();
    let parsed = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    // `batch run`/`submit` use the batch file's `store:` unless --db or SKILLSTATE_DB was given.
    let db_explicit = parsed.db.is_some();
    let db = match parsed.db.clone() {
        Some(db) => db,
        None => match default_db(&parsed.data_dir) {
            Ok(db) => db,
            Err(error) => {
                errln!("error: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    config::set_process_site(parsed.data_dir.clone(), db.clone());
    let cli = Resolved {
        db,
        config: parsed.config,
        command: parsed.command,
    };
    // Known secret values are cleaned from everything printed, logs included. A configuration
    // that does not load still protects the usual key variables; the command reports the error.
    let loaded = config::load_config(cli.config.as_deref()).unwrap_or_default();
    term::install_secrets(loaded.secrets());
    // Traces only when the OTEL_* variables or `[telemetry]` ask for them; otherwise no
    // exporter and no layer exist (docs/operations/telemetry.md).
    let mut telemetry_problem = None;
    let (telemetry, otel_layer) = match loaded.telemetry.resolve(|name| std::env::var(name).ok()) {
        None => (None, None),
        Some(settings) => match telemetry::Telemetry::start(&settings) {
            Ok((telemetry, tracer)) => {
                use tracing_subscriber::Layer as _;
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_location(false)
                    .with_threads(false)
                    .with_target(false)
                    .with_level(false)
                    .with_tracked_inactivity(false)
                    // Spans' OpenTelemetry contexts are read with `OpenTelemetrySpanExt`, never
                    // from the current context: no thread-local push on every poll.
                    .with_context_activation(false)
                    .with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_target(skillstate_runtime::spans::TARGET, tracing::Level::INFO),
                    );
                (Some(telemetry), Some(layer))
            }
            Err(problem) => {
                telemetry_problem = Some(problem);
                (None, None)
            }
        },
    };
    {
        use tracing_subscriber::prelude::*;
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(|| term::CleanStderr)
            .with_ansi(false)
            .with_filter(
                tracing_subscriber::EnvFilter::try_from_env("SKILLSTATE_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            );
        tracing_subscriber::registry()
            .with(logs)
            .with(otel_layer)
            .init();
    }
    if let Some(problem) = telemetry_problem {
        tracing::warn!("traces are off: {problem}");
    }
    if let Err(error) = protected {
        tracing::debug!("cannot make the process non-dumpable: {error}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            errln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Validate { skill, board } => {
                commands::validate::run(&skill, cli.config.as_deref(), &cli.db, board.as_deref())
                    .await
            }
            Command::Run(args) => commands::run::run(&cli.db, cli.config.as_deref(), args).await,
            Command::Tasks => commands::tasks::run(&cli.db).await,
            Command::Skills => commands::upgrade::list(&cli.db).await,
            Command::Upgrade(args) => {
                commands::upgrade::run(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Resume(args) => {
                commands::lineage::resume(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Fork(args) => {
                commands::lineage::fork(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Pending => commands::lineage::pending(&cli.db).await,
            Command::Say(args) => commands::say::run(&cli.db, cli.config.as_deref(), args).await,
            Command::Approve(args) => {
                commands::lineage::approve(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Reject(args) => {
                commands::lineage::reject(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Tools(args) => commands::tools::run(cli.config.as_deref(), args).await,
            Command::Reply(args) => {
                commands::lineage::reply(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Replay(args) => commands::lineage::replay(&cli.db, args).await,
            Command::Gc(args) => commands::lineage::gc(&cli.db, args).await,
            Command::Bench(args) => {
                tokio::task::block_in_place(|| commands::bench::run(cli.config.as_deref(), args))
            }
            Command::Show(args) => commands::show::run(&cli.db, cli.config.as_deref(), args).await,
            Command::Search(args) => commands::search::run(&cli.db, args).await,
            Command::Batch(args) => {
                let db = commands::batch::DbChoice {
                    location: cli.db.clone(),
                    explicit: db_explicit,
                };
                commands::batch::run(&db, cli.config.as_deref(), args).await
            }
            Command::Batches => commands::batch::list(&cli.db, cli.config.as_deref()).await,
            Command::Worker(args) => {
                commands::worker::run(&cli.db, cli.config.as_deref(), args).await
            }
            Command::Serve(args) => {
                commands::serve::run(&cli.db, cli.config.as_deref(), args).await
            }
            Command::View(args) => commands::view::run(&cli.db, cli.config.as_deref(), args).await,
            Command::Keys(command) => {
                commands::keys::run(&cli.db, cli.config.as_deref(), command).await
            }
            Command::Board(command) => {
                commands::board::run(&cli.db, cli.config.as_deref(), command).await
            }
        }
    });
    // The last spans leave before the process does (serve and worker return here after their
    // drain, run when its task stops).
    drop(runtime);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    match result {
        Ok(code) => code,
        Err(error) => {
            errln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
