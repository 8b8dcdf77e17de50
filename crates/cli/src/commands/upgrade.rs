//! `skillstate upgrade` and `skillstate skills`: a task — or every task on one version of a
//! skill — moved to the version of the skill in a directory, dry run unless `--apply`
//! (docs/skill-versions.md, "Skill versions and upgrades"); the skill versions the database keeps.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use skillstate_core::Skill;
use skillstate_runtime::presented_tools;
use skillstate_runtime::upgrade::{Upgrade, UpgradeError, Upgraded, upgrade_task, version_name};
use skillstate_store::{SkillVersionSummary, Store, TaskRecord};

use crate::config::Config;
use crate::render::{Table, format_time};

/// Who the journal names as the author of an upgrade made from the command line.
const OPERATOR: &str = "operator";

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// The task to upgrade (full id or unique prefix).
    #[arg(required_unless_present = "skill", conflicts_with = "skill")]
    task: Option<String>,
    /// Every task that runs this skill now: `NAME` (any version but the target) or
    /// `NAME@VERSION` (skill.toml's version, or a hash prefix from `skillstate skills`).
    #[arg(long, value_name = "NAME[@VERSION]")]
    skill: Option<String>,
    /// The skill directory holding the version to move to.
    #[arg(long, value_name = "SKILL_DIR")]
    to: PathBuf,
    /// Commit the upgrade; without it nothing is written and the migrated state's diff (or
    /// the precise errors) is shown.
    #[arg(long)]
    apply: bool,
    /// Print the outcome of each task as JSON lines.
    #[arg(long)]
    json: bool,
}

pub async fn run(
    db: &str,
    config_path: Option<&std::path::Path>,
    args: UpgradeArgs,
) -> Result<ExitCode> {
    let skill = super::load_skill(&args.to)?;
    let config = crate::config::load_config(config_path)?;
    let store = crate::config::open_store(db, &config).await?;
    let tasks = match (&args.task, &args.skill) {
        (Some(task), _) => vec![store.task(task).await?],
        (None, Some(selector)) => tasks_on(store.as_ref(), selector).await?,
        (None, None) => bail!("name a task, or --skill NAME[@VERSION]"),
    };
    if tasks.is_empty() {
        outln!(
            "no task runs {}; `skillstate skills` lists the versions and their tasks",
            args.skill.as_deref().unwrap_or_default()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut refused = 0;
    let single = tasks.len() == 1 && args.task.is_some();
    let mut rows = Table::new(&["TASK", "FROM", "TO", "OUTCOME"]);
    for task in &tasks {
        let outcome = upgrade_one(&store, &config, task, &skill, args.apply).await;
        if args.json {
            outln!("{}", outcome_json(task, &outcome, args.apply));
        } else if single {
            print_single(&outcome, args.apply);
        } else {
            let (from, to, what) = match &outcome {
                Ok(done) => (done.from.to_string(), done.to.to_string(), moved_line(done)),
                Err(error) => (String::new(), String::new(), format!("refused: {error:#}")),
            };
            rows.row(vec![task.id.clone(), from, to, what]);
        }
        if outcome.is_err() {
            refused += 1;
        }
    }
    if !args.json && !single {
        out!("{}", rows.render());
        let verb = if args.apply { "moved" } else { "would move" };
        outln!(
            "{} {verb}, {refused} refused{}",
            tasks.len() - refused,
            if args.apply {
                ""
            } else {
                " (dry run: --apply to commit)"
            }
        );
    }
    store.release().await;
    Ok(if refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The upgrade of one task: the new version's tools as the task's world presents them, then
/// the runtime's upgrade.
async fn upgrade_one(
    store: &Arc<dyn Store>,
    config: &Config,
    task: &TaskRecord,
    skill: &Skill,
    apply: bool,
) -> Result<Upgraded> {
    let probe = TaskRecord {
        skill: skill.definition.clone(),
        ..task.clone()
    };
    let world = super::world_of_task(&probe, config, false)
        .await
        .context("cannot rebuild the task's world with the new version")?;
    let tools = presented_tools(skill, world.env.as_ref());
    world.shutdown().await;
    let tools = tools?;
    let upgrade = Upgrade {
        task: &task.id,
        to: skill,
        tools: &tools,
        author: OPERATOR,
        apply,
    };
    match upgrade_task(store, &upgrade).await {
        Ok(done) => Ok(done),
        Err(UpgradeError::Refused { rejections, to, .. }) => {
            let lines: Vec<String> = rejections.iter().map(|r| format!("  {r}")).collect();
            bail!(
                "the migrated state does not fit {to}:\n{}",
                lines.join("\n")
            )
        }
        Err(other) => Err(other.into()),
    }
}

fn moved_line(done: &Upgraded) -> String {
    let migrations = if done.migrations.is_empty() {
        "state kept as it is".to_owned()
    } else {
        format!("migrations {}", done.migrations.join(", "))
    };
    let changes = done.diff.as_array().map_or(0, Vec::len);
    if done.scheduled {
        let when = if done.applied { "moved" } else { "moves" };
        format!(
            "{when} at step {} once its waiting action is settled (approve, reject or reply) ({migrations}; {changes} change(s))",
            done.step
        )
    } else if done.applied {
        format!(
            "moved at step {} ({migrations}; {changes} change(s))",
            done.step
        )
    } else {
        format!(
            "would move at step {} ({migrations}; {changes} change(s))",
            done.step
        )
    }
}

fn print_single(outcome: &Result<Upgraded>, apply: bool) {
    match outcome {
        Ok(done) => {
            outln!("task {}: {} → {}", done.task, done.from, done.to);
            outln!("{}", moved_line(done));
            for op in done.diff.as_array().into_iter().flatten() {
                outln!("  {op}");
            }
            if !apply {
                outln!("dry run: nothing was written; --apply to commit");
            }
        }
        Err(error) => errln!("error: {error:#}"),
    }
}

fn outcome_json(task: &TaskRecord, outcome: &Result<Upgraded>, apply: bool) -> serde_json::Value {
    match outcome {
        Ok(done) => {
            // A dry run of a waiting task is `planned` (its `scheduled` says applying waits).
            let outcome = match (done.applied, done.scheduled && apply) {
                (true, _) => "moved",
                (false, true) => "scheduled",
                (false, false) => "planned",
            };
            serde_json::json!({"task": task.id, "outcome": outcome, "upgrade": done})
        }
        Err(error) => {
            serde_json::json!({"task": task.id, "outcome": "refused", "error": format!("{error:#}")})
        }
    }
}

/// The tasks that run `selector` (`NAME` or `NAME@VERSION`) now.
async fn tasks_on(store: &dyn Store, selector: &str) -> Result<Vec<TaskRecord>> {
    let (name, version) = match selector.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (selector, None),
    };
    let versions: Vec<SkillVersionSummary> = store
        .skill_versions()
        .await?
        .into_iter()
        .filter(|v| v.name == name)
        .filter(|v| {
            version.is_none_or(|wanted| {
                v.version.as_deref() == Some(wanted)
                    || (wanted.len() >= 6 && v.hash.starts_with(wanted))
            })
        })
        .collect();
    if versions.is_empty() {
        bail!(
            "no stored version of skill `{name}` matches `{selector}`; `skillstate skills` lists them"
        );
    }
    let mut tasks = Vec::new();
    for summary in store.list_tasks().await? {
        if summary.skill_name != name {
            continue;
        }
        let task = store.task(&summary.id).await?;
        let hash = version_name(&task.skill, &task.tools).hash;
        if versions.iter().any(|v| v.hash == hash) {
            tasks.push(task);
        }
    }
    Ok(tasks)
}

/// `skillstate skills`: the stored skill versions.
pub async fn list(db: &str) -> Result<ExitCode> {
    let store = crate::config::open_existing(db).await?;
    let versions = store.skill_versions().await?;
    if versions.is_empty() {
        outln!("no skill versions in {db}; a task stores the version of its skill when it starts");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&[
        "SKILL", "VERSION", "HASH", "TASKS", "MOVED ON", "BYTES", "STORED",
    ]);
    for v in versions {
        table.row(vec![
            v.name,
            v.version.unwrap_or_else(|| "-".into()),
            v.hash[..v.hash.len().min(12)].to_owned(),
            v.tasks.to_string(),
            v.former_tasks.to_string(),
            v.bytes.to_string(),
            format_time(v.created_at),
        ]);
    }
    out!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}
