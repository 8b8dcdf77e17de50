use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use skillstate_tools::builtin::{Sandbox, ShellTool, WorkDir};

use super::{load_skill, world_for};
use crate::config::load_config;
use crate::render::Table;
use crate::toolbox;

#[derive(clap::Args)]
pub struct ToolsArgs {
    /// The skill directory.
    skill: PathBuf,
    /// The work directory for fs and shell tools (default: the skill's `[tools] work_dir`).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// Starts the skill's tool sources (MCP servers included), lists what they offer, stops them;
/// says how `shell.exec` is confined (or why it will refuse to run).
pub async fn run(config_path: Option<&Path>, args: ToolsArgs) -> Result<ExitCode> {
    let skill = load_skill(&args.skill)?;
    let config = load_config(config_path)?;
    // Listing tools needs no request, also for an environment that opens with one.
    let input = match &skill.settings().environment {
        Some(env) if !skillstate_envs::takes_request(&env.kind) => None,
        _ => Some(""),
    };
    let world = world_for(
        &skill,
        &args.skill,
        input,
        args.work_dir.as_deref(),
        &config,
    )
    .await?;
    let available = skillstate_runtime::available_tools(world.env.tools());
    world.shutdown().await;
    let work = world.toolbox.as_ref().and_then(|t| t.work.clone());
    // A directory of its own made only to list the tools is not kept.
    let _listing_dir = world.toolbox.map(DiscardOnDrop);
    let tools = skillstate_runtime::select_tools(&available, &skill.settings().tools)?;
    if tools.is_empty() {
        outln!(
            "skill `{}` uses no tools besides finish and ask_user",
            skill.name()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["TOOL", "SOURCE", "SIDE EFFECT", "APPROVAL", "INPUT SCHEMA"]);
    for tool in &tools {
        let spec = tool.spec();
        let schema = serde_json::to_string(&spec.input_schema).unwrap_or_default();
        table.row(vec![
            spec.name.clone(),
            spec.source.clone(),
            spec.side_effect.as_str().to_owned(),
            if spec.needs_approval { "required" } else { "-" }.to_owned(),
            schema,
        ]);
    }
    out!("{}", table.render());
    if tools.iter().any(|tool| tool.spec().name == "shell.exec") {
        let settings = skill.settings();
        let (place, work_dir) =
            work.context("the skill allows shell.exec but has no work directory")?;
        let sandbox = Sandbox::new(config.sandbox_config());
        let shown = match place {
            toolbox::WorkPlace::Shared(dir) => dir,
            toolbox::WorkPlace::Own { .. } => config.site.work_parent().join("<task>"),
        };
        outln!(
            "shell.exec sandbox: {}",
            sandbox.describe(&shown, settings.tools.shell.network).await
        );
        let shell = ShellTool::with_sandbox(
            &WorkDir::new(&work_dir, &config.site.protected).map_err(anyhow::Error::msg)?,
            settings.tools.shell.clone(),
            sandbox,
        )
        .withholding(config.secrets());
        let withheld = shell.withheld_variables();
        if !withheld.is_empty() {
            outln!(
                "shell.exec withholds {} from commands: env_allow lists them, but their values are secrets (model API keys, [secrets] in skillstate.toml)",
                withheld.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes the tool box's own work directory when dropped.
struct DiscardOnDrop(toolbox::Toolbox);

impl Drop for DiscardOnDrop {
    fn drop(&mut self) {
        self.0.discard_own_work_dir();
    }
}
