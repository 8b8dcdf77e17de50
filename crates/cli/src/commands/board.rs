//! `skillstate board`: shared states that several tasks read and write (docs/boards.md, "Several agents,
//! one state").

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skillstate_core::board::touched;
use skillstate_core::json::pointer_for_humans;
use skillstate_core::{Rejection, RejectionKind, StateSchema, WriteOnly};
use skillstate_runtime::board_upgrade::{BoardUpgrade, BoardUpgradeError, upgrade_board};
use skillstate_store::{BoardAuthor, BoardRecord, NewBoard, board_state_at};

use crate::config::{Config, load_config, open_existing, open_store};
use crate::render::{Table, format_time};

#[derive(clap::Subcommand)]
pub enum BoardCommand {
    /// Create a board: a shared state with its own schema, versions and journal.
    Create(CreateArgs),
    /// List the boards in the database.
    List,
    /// Show a board's state (now, or at a version) and who wrote what, when.
    Show(ShowArgs),
    /// Change a board's schema (dry run unless --apply): the migrated state's diff, or every
    /// problem with its pointer, and each member's pointers checked against the new schema.
    Upgrade(UpgradeArgs),
}

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// The board's name or id.
    board: String,
    /// The new JSON Schema (2020-12).
    #[arg(long)]
    schema: PathBuf,
    /// A migration applied to the board's current state first: a JSON Patch (array) or a JSON
    /// merge patch (object).
    #[arg(long)]
    migration: Option<PathBuf>,
    /// Refuse unless the board is still at this version (the one a dry run showed).
    #[arg(long, value_name = "VERSION")]
    at: Option<u64>,
    /// Commit the upgrade (otherwise nothing is written).
    #[arg(long)]
    apply: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The board's name (letters, digits, `-`, `_`, `.`; at most 100 characters).
    name: String,
    /// The board's JSON Schema (2020-12).
    #[arg(long)]
    schema: PathBuf,
    /// The initial state (default: `{}`), valid against the schema.
    #[arg(long)]
    init: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    /// The board's name or id.
    board: String,
    /// Show the state at this version (0 = as created) instead of now.
    #[arg(long)]
    version: Option<u64>,
    /// How many of the latest writes to list.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    writes: u64,
    /// Print JSON (state, version, members, writes) instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(db: &str, config_path: Option<&Path>, command: BoardCommand) -> Result<ExitCode> {
    let config = load_config(config_path)?;
    match command {
        BoardCommand::Create(args) => create(db, &config, args).await,
        BoardCommand::List => list(db).await,
        BoardCommand::Show(args) => show(db, args).await,
        BoardCommand::Upgrade(args) => upgrade(db, &config, args).await,
    }
}

/// A name is safe in a URL, a terminal and a file name.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!(
            "board name `{name}`: use 1 to 100 letters, digits, `-`, `_` or `.` (for example release-42)"
        );
    }
    Ok(())
}

pub(crate) fn read_json(path: &Path, what: &str) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{}:{}:{}: the {what} is not valid JSON: {e}",
            path.display(),
            e.line(),
            e.column()
        )
    })
}

/// The board schema of `path`, compiled; every defect with its pointer in the file.
fn board_schema(path: &Path) -> Result<(Value, StateSchema)> {
    let document = read_json(path, "board schema")?;
    let schema = StateSchema::compile_all(document.clone()).map_err(|defects| {
        let lines: Vec<String> = defects
            .iter()
            .map(|d| {
                format!(
                    "  {} at {}: {}",
                    path.display(),
                    skillstate_core::json::pointer_for_humans(&d.pointer, "schema"),
                    d.message
                )
            })
            .collect();
        anyhow::anyhow!("the board schema is not usable:\n{}", lines.join("\n"))
    })?;
    Ok((document, schema))
}

async fn create(db: &str, config: &Config, args: CreateArgs) -> Result<ExitCode> {
    check_name(&args.name)?;
    let (schema_doc, schema) = board_schema(&args.schema)?;
    let (initial, origin) = match &args.init {
        Some(path) => (
            read_json(path, "initial state")?,
            path.display().to_string(),
        ),
        None => (
            Value::Object(Default::default()),
            "the default initial state {}".to_owned(),
        ),
    };
    let violations = schema.violations(&initial);
    if !violations.is_empty() {
        let reader = schema.whole_view();
        let lines: Vec<String> = violations
            .iter()
            .map(|v| v.render(&reader))
            .map(|v| {
                format!(
                    "  {origin} at {}: {}",
                    skillstate_core::json::pointer_for_humans(&v.pointer, "state"),
                    v.message
                )
            })
            .collect();
        bail!(
            "the initial state breaks the board schema{}:\n{}",
            if args.init.is_none() {
                " (give one with --init FILE)"
            } else {
                ""
            },
            lines.join("\n")
        );
    }
    let store = open_store(db, config).await?;
    let board = store
        .create_board(NewBoard {
            name: args.name,
            schema: schema_doc,
            initial_state: initial,
            tenant: None,
        })
        .await?;
    outln!("board {} created ({}) in {db}", board.name, board.id);
    outln!(
        "attach agents with `skillstate run <skill> --board {} --model ...` (each skill declares [board] reads and writes)",
        board.name
    );
    Ok(ExitCode::SUCCESS)
}

async fn list(db: &str) -> Result<ExitCode> {
    let store = open_existing(db).await?;
    let boards = store.list_boards(None).await?;
    if boards.is_empty() {
        outln!("no boards in {db}; create one with `skillstate board create NAME --schema FILE`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["BOARD", "NAME", "VERSION", "AGENTS", "UPDATED"]);
    for board in boards {
        table.row(vec![
            board.id,
            board.name,
            board.version.to_string(),
            board.members.to_string(),
            format_time(board.updated_at),
        ]);
    }
    out!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

fn author_text(author: &BoardAuthor) -> String {
    match author {
        BoardAuthor::Task { task, step } => format!("task {task} step {step}"),
        BoardAuthor::Key { key } => format!("API key {key}"),
        BoardAuthor::Cli => "command line".to_owned(),
    }
}

async fn show(db: &str, args: ShowArgs) -> Result<ExitCode> {
    let store = open_existing(db).await?;
    let board: BoardRecord = store.board(&args.board, None).await?;
    let version = args.version.unwrap_or(board.version);
    let state = if version == board.version {
        board.state.clone()
    } else {
        board_state_at(store.as_ref(), &board.id, version).await?
    };
    let members = store.board_members(&board.id).await?;
    let from = version.saturating_sub(args.writes).saturating_add(1);
    let mut writes = if args.writes == 0 || version == 0 {
        Vec::new()
    } else {
        store.board_writes(&board.id, from, version).await?
    };
    // Each version is read with the schema in effect at it; what any schema of the board's
    // history marks write-only is shown redacted.
    let schemas = store.board_schemas(&board.id).await?;
    let schema = schemas
        .iter()
        .rev()
        .find(|s| s.from_version <= version)
        .map_or(&board.schema, |s| &s.schema);
    let mut state = state;
    WriteOnly::of_schema(schema).redact(&mut state);
    for hider in schemas.iter().map(|s| WriteOnly::of_schema(&s.schema)) {
        for write in &mut writes {
            hider.redact_patch(&mut write.patch);
        }
    }
    let schema_changes: Vec<u64> = schemas
        .iter()
        .map(|s| s.from_version)
        .filter(|v| *v > 0)
        .collect();
    if args.json {
        let shown = serde_json::json!({
            "id": board.id,
            "name": board.name,
            "version": version,
            "latest_version": board.version,
            "state": state,
            "schema": schema,
            "schema_changes": schema_changes,
            "members": members,
            "writes": writes,
        });
        outln!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "board {} ({}) at version {version}{}",
        board.name,
        board.id,
        if version == board.version {
            String::new()
        } else {
            format!(" of {}", board.version)
        }
    );
    outln!("{}", serde_json::to_string_pretty(&state)?);
    if !members.is_empty() {
        outln!("\nagents: {}", members.join(", "));
    }
    if !writes.is_empty() {
        outln!();
        let mut table = Table::new(&["VERSION", "AUTHOR", "WROTE", "REBASED", "AT"]);
        for write in writes.iter().rev() {
            let mut wrote: Vec<String> = skillstate_core::StatePatch::from_value(&write.patch)
                .map(|p| touched(&p).iter().map(ToString::to_string).collect())
                .unwrap_or_default();
            if schema_changes.contains(&write.version) {
                wrote.insert(0, "(new schema)".to_owned());
            }
            table.row(vec![
                write.version.to_string(),
                author_text(&write.author),
                wrote.join(" "),
                write
                    .rebased_from
                    .map(|v| format!("from v{v}"))
                    .unwrap_or_default(),
                format_time(write.created_at),
            ]);
        }
        out!("{}", table.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// A refusal's problem as a line: the migrated board's pointer, or the migration's.
fn rejection_line(rejection: &Rejection, migration: Option<&Path>) -> String {
    let place = match (rejection.kind, migration) {
        (RejectionKind::PatchApply, Some(file)) if rejection.pointer.starts_with('/') => {
            format!("{} at {}", file.display(), rejection.pointer)
        }
        _ => format!(
            "the migrated board at {}",
            pointer_for_humans(&rejection.pointer, "board")
        ),
    };
    format!(
        "[{}] {place}: {}",
        rejection.kind.as_str(),
        rejection.message
    )
}

async fn upgrade(db: &str, config: &Config, args: UpgradeArgs) -> Result<ExitCode> {
    let (_, schema) = board_schema(&args.schema)?;
    let migration = match &args.migration {
        Some(path) => {
            let patch = read_json(path, "migration")?;
            if !patch.is_array() && !patch.is_object() {
                bail!(
                    "{}: the migration is neither a JSON Patch (an array of operations) nor a JSON merge patch (an object); write one of the two",
                    path.display()
                );
            }
            Some(patch)
        }
        None => None,
    };
    let store = open_store(db, config).await?;
    let upgrade = BoardUpgrade {
        board: &args.board,
        tenant: None,
        schema: &schema,
        migration: migration.as_ref(),
        author: BoardAuthor::Cli,
        planned_at: args.at,
        apply: args.apply,
    };
    let outcome = upgrade_board(store.as_ref(), &upgrade).await;
    let shown = |problems: &mut Vec<String>, error: &BoardUpgradeError| match error {
        BoardUpgradeError::Refused {
            rejections, scopes, ..
        } => {
            problems.extend(
                rejections
                    .iter()
                    .map(|r| rejection_line(r, args.migration.as_deref())),
            );
            problems.extend(scopes.iter().map(ToString::to_string));
        }
        other => problems.push(other.to_string()),
    };
    if args.json {
        let value = match &outcome {
            Ok(done) => serde_json::json!({
                "outcome": if done.applied { "upgraded" } else { "planned" },
                "upgrade": done,
            }),
            Err(error) => {
                let mut problems = Vec::new();
                shown(&mut problems, error);
                let (rejections, scopes) = match error {
                    BoardUpgradeError::Refused {
                        rejections, scopes, ..
                    } => (
                        serde_json::to_value(rejections)?,
                        serde_json::to_value(scopes)?,
                    ),
                    _ => (Value::Array(Vec::new()), Value::Array(Vec::new())),
                };
                serde_json::json!({
                    "outcome": "refused",
                    "problems": problems,
                    "rejections": rejections,
                    "scopes": scopes,
                })
            }
        };
        outln!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(if outcome.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    match outcome {
        Ok(done) => {
            let members = if done.members.is_empty() {
                "no members".to_owned()
            } else {
                done.members
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let changes = done.diff.as_array().map_or(0, Vec::len);
            outln!(
                "board {} ({}) at version {}: the schema of {} ({changes} change(s) to the state; scopes checked: {members})",
                done.name,
                done.board,
                done.planned_at,
                args.schema.display()
            );
            for op in done.diff.as_array().into_iter().flatten() {
                outln!("  {op}");
            }
            if done.applied {
                outln!(
                    "upgraded: version {} records the new schema; earlier versions keep theirs (skillstate board show {} --version {})",
                    done.version,
                    done.name,
                    done.planned_at
                );
            } else {
                outln!(
                    "dry run: nothing was written; --apply --at {} to commit it as version {} (refused if the board moved on)",
                    done.planned_at,
                    done.version
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error @ BoardUpgradeError::Refused { .. }) => {
            let mut problems = Vec::new();
            shown(&mut problems, &error);
            let name = match &error {
                BoardUpgradeError::Refused { name, .. } => name.as_str(),
                _ => args.board.as_str(),
            };
            errln!(
                "error: board {name} cannot move to the schema of {}; nothing was changed:",
                args.schema.display()
            );
            for problem in problems {
                errln!("  {problem}");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(other) => Err(other.into()),
    }
}
