//! `skillstate serve`: the HTTP service (crates/server) over this database, with embedded
//! workers running the tasks it creates. The server knows requests, tenants and the store; this
//! module only wires it: what requests may name (the service policy: skills directory, model
//! allow-list, scripted directory, operator-only environment settings), worlds and models as
//! `run` and `worker` build them, signals → graceful shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use async_trait::async_trait;
use serde_json::{Map, Value};
use skillstate_core::Skill;
use skillstate_runtime::{StopLevel, TaskOptions, presented_tools, run_worker};
use skillstate_server::{
    ApiError, AppState, FieldError, PublicUrl, ResolvedRequest, ResolvedSkill, ServerConfig,
    ServicePolicy, TaskFactory, UpgradeTarget, check_initial_state, skill_dir,
};
use skillstate_store::{NewTask, TaskRecord};

use super::batch::inputs::{Source, TaskInput};
use super::batch::submit::prepare_one;
use super::worker::{CliHost, stop_on_signals, worker_options};
use crate::config::{Config, load_config, open_store};
use crate::model::build_model;
use crate::toolbox;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) addr: SocketAddr,
    /// The directory whose skills create requests name (`"skill": "warehouse"` is
    /// `<skills>/warehouse`).
    #[arg(long, default_value = "skills")]
    pub(crate) skills: PathBuf,
    /// Tasks the embedded worker runs at once; 0 serves the API only (run `skillstate worker`
    /// against the same database elsewhere).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=4096))]
    pub(crate) workers: u16,
    /// A directory under which skills' absolute `[tools] work_dir` may lie (repeatable; adds
    /// to `[tools] work_roots` of skillstate.toml). Skills naming any other are refused.
    #[arg(long = "work-root", value_name = "DIR")]
    pub(crate) work_roots: Vec<PathBuf>,
    /// A model spec create requests may name (repeatable): exact (`openai:gpt-4o-mini`) or a
    /// prefix pattern (`openai:*`). Default: `oracle` and `spec` under [model] in
    /// skillstate.toml.
    #[arg(long = "allow-model", value_name = "SPEC")]
    pub(crate) allow_model: Vec<String>,
    /// Accept `scripted:<name>` models, read from files inside DIR only (a relative name, no
    /// `..`, no symbolic link). Off by default: a scripted model reads a file on the server.
    #[arg(long, value_name = "DIR")]
    pub(crate) scripted_dir: Option<PathBuf>,
    /// The address clients reach this service at (`https://agents.example.com`, a path prefix
    /// allowed), as the OpenAPI document's `servers` names it. Set it behind a proxy; without
    /// it the document names `http://` and the Host each request was sent to
    /// (`X-Forwarded-*` headers are never read).
    #[arg(long, value_name = "URL")]
    pub(crate) public_url: Option<PublicUrl>,
}

impl ServeArgs {
    /// What create requests may name on this server, from these flags and the configuration.
    fn policy(&self, skills: PathBuf, config: &Config) -> Result<ServicePolicy> {
        let models = if self.allow_model.is_empty() {
            let mut models = vec!["oracle".to_owned()];
            models.extend(config.model.spec.clone());
            models
        } else {
            self.allow_model.clone()
        };
        let mut policy = ServicePolicy::default()
            .with_skills_dir(skills)
            .with_models(models)
            .with_operator_only_environment(skillstate_envs::operator_only_parameters());
        if let Some(dir) = &self.scripted_dir {
            let dir = dir
                .canonicalize()
                .ok()
                .filter(|d| d.is_dir())
                .with_context(|| format!("--scripted-dir {}: no such directory", dir.display()))?;
            policy = policy.with_scripted_dir(dir);
        }
        Ok(policy)
    }
}

/// Builds tasks for create requests from the skills directory, as `batch submit` builds them
/// from a batch file's inputs.
struct SkillsFactory {
    skills: PathBuf,
    config: Config,
}

fn invalid(pointer: &str, message: String) -> ApiError {
    ApiError::Invalid {
        detail: message.clone(),
        errors: vec![FieldError::new("field", pointer, message)],
    }
}

#[async_trait]
impl TaskFactory for SkillsFactory {
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
        let dir = match &request.skill_dir {
            Some(dir) => dir.clone(),
            None => skill_dir(&self.skills, &request.skill)?,
        };
        let skill = Skill::load(&dir)
            .map_err(|errors| invalid("/skill", format!("skill `{}`: {errors}", request.skill)))?
            .skill;
        if let Some(state) = &request.state {
            check_initial_state(&skill, state)?;
        }
        toolbox::check_skill_paths(skill.settings(), &self.config).map_err(|e| {
            invalid(
                "/skill",
                format!("skill `{}`: skill.toml: {e:#}", request.skill),
            )
        })?;
        let environment = skill.settings().environment.clone();
        let model = build_model(
            &request.model,
            &self.config.model,
            environment.as_ref().map(|e| e.kind.as_str()),
        )
        .map_err(|e| invalid("/model", format!("{e:#}")))?;
        let options = TaskOptions {
            model: model.spec(),
            context: request.context.strategy(),
            context_budget: request.budget.and_then(|b| usize::try_from(b).ok()),
            environment: None,
            secrets: self.config.secrets(),
        };
        let toolbox = match &environment {
            Some(_) => None,
            None => {
                let work = toolbox::work_place(skill.settings(), Some(&dir), None, &self.config)
                    .map_err(|e| invalid("/skill", format!("{e:#}")))?;
                Some(
                    toolbox::build(skill.settings(), &work, &self.config)
                        .await
                        .map_err(|e| invalid("/skill", format!("{e:#}")))?,
                )
            }
        };
        let input = TaskInput {
            source: Source::Line(0),
            at: "request".into(),
            input: request.input.clone(),
            state: request.state.clone(),
            labels: request
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect::<Map<String, Value>>(),
            environment: request
                .environment
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            max_steps: None,
            max_retries: None,
            skill_version: None,
        };
        let prepared = prepare_one(
            &skill,
            environment.as_ref(),
            toolbox.as_ref(),
            &options,
            &input,
        );
        if let Some(toolbox) = &toolbox {
            toolbox.shutdown().await;
        }
        // The message names the request field it is about (`request: input: ...`).
        let queued = prepared.map_err(|e| {
            let message = format!("{e:#}");
            let field = message
                .strip_prefix("request: ")
                .and_then(|rest| rest.split(':').next())
                .filter(|f| ["input", "environment", "state"].contains(f))
                .map(|f| format!("/{f}"))
                .unwrap_or_default();
            invalid(&field, message)
        })?;
        Ok((queued.task, queued.initial_state))
    }

    async fn upgrade_target(
        &self,
        task: &TaskRecord,
        skill: &ResolvedSkill,
    ) -> Result<UpgradeTarget, ApiError> {
        let dir = match &skill.dir {
            Some(dir) => dir.clone(),
            None => skill_dir(&self.skills, &skill.name)?,
        };
        let loaded = Skill::load(&dir)
            .map_err(|errors| invalid("/skill", format!("skill `{}`: {errors}", skill.name)))?
            .skill;
        toolbox::check_skill_paths(loaded.settings(), &self.config).map_err(|e| {
            invalid(
                "/skill",
                format!("skill `{}`: skill.toml: {e:#}", skill.name),
            )
        })?;
        // The tools as the task's world presents them with the new definition.
        let probe = TaskRecord {
            skill: loaded.definition.clone(),
            ..task.clone()
        };
        let world = super::world_of_task(&probe, &self.config, false)
            .await
            .map_err(|e| {
                invalid(
                    "/skill",
                    format!(
                        "cannot rebuild the task's world with skill `{}`: {e:#}",
                        skill.name
                    ),
                )
            })?;
        let tools = presented_tools(&loaded, world.env.as_ref());
        world.shutdown().await;
        let tools =
            tools.map_err(|e| invalid("/skill", format!("skill `{}`: {e:#}", skill.name)))?;
        Ok(UpgradeTarget {
            skill: loaded,
            tools,
        })
    }
}

pub async fn run(db: &str, config_path: Option<&Path>, args: ServeArgs) -> Result<ExitCode> {
    run_with(db, config_path, args, Viewer::default()).await
}

/// What `skillstate view` adds to a server.
#[derive(Default)]
pub(crate) struct Viewer {
    /// A bench's results.json, shown by the web viewer's bench page (`view --bench`).
    pub(crate) bench: Option<Vec<u8>>,
    /// The secret of this process's local key (it sees the whole database); its link is
    /// printed on standard output, never logged.
    pub(crate) local_key: Option<String>,
}

/// Serves as `run` does, with what `view` adds.
pub(crate) async fn run_with(
    db: &str,
    config_path: Option<&Path>,
    args: ServeArgs,
    viewer: Viewer,
) -> Result<ExitCode> {
    let mut config = load_config(config_path)?;
    config
        .tools
        .work_roots
        .extend(args.work_roots.iter().cloned());
    let store = open_store(db, &config).await?;
    let skills = args
        .skills
        .canonicalize()
        .with_context(|| format!("--skills {}: no such directory", args.skills.display()))?;
    let policy = args.policy(skills.clone(), &config)?;
    let factory = Arc::new(SkillsFactory {
        skills: skills.clone(),
        config: config.clone(),
    });
    let server_config = ServerConfig {
        public_url: args.public_url.clone(),
        ..ServerConfig::default()
    };
    let mut state = AppState::with_config(store.clone(), factory, server_config)
        .with_policy(policy)
        .with_prices(config.prices.clone())
        .with_secrets(config.secrets());
    if let Some(results) = viewer.bench {
        state = state.with_bench_results(results);
    }
    if let Some(secret) = &viewer.local_key {
        state = state.with_local_key(secret);
    }
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let address = listener.local_addr()?;
    // Before the embedded workers start, so their first claims and steps are counted.
    skillstate_server::metrics::install();
    let mut stop = stop_on_signals("serve");
    let worker = (args.workers > 0).then(|| {
        let options = worker_options(&config, "skillstate serve", usize::from(args.workers));
        tokio::spawn(run_worker(
            store.clone(),
            Arc::new(CliHost::new(config.clone())),
            options,
            stop.clone(),
            None,
        ))
    });
    errln!(
        "serving http://{address} (skills from {}, database {db}, {} worker slots); Ctrl-C or SIGTERM stops",
        skills.display(),
        args.workers
    );
    match &viewer.local_key {
        Some(secret) => {
            errln!(
                "web viewer: http://{address}/ — open the link on standard output: it carries a key of this process only (every task and board of {db}; it ends with the process)"
            );
            // Standard output, apart from the log lines on standard error; the key is in the
            // fragment, which browsers never send to the server.
            outln!("http://{address}/#key={secret}");
        }
        None => errln!(
            "web viewer: http://{address}/ (it asks for an API key: skillstate keys create --tenant <name>)"
        ),
    }
    let shutdown = async move {
        while *stop.borrow() == StopLevel::Run {
            if stop.changed().await.is_err() {
                break;
            }
        }
    };
    skillstate_server::serve(listener, state, shutdown)
        .await
        .context("the server stopped")?;
    if let Some(worker) = worker {
        match worker.await {
            Ok(Ok(stats)) => errln!(
                "serve: workers stopped ({} completed, {} failed, {} released)",
                stats.completed,
                stats.failed,
                stats.released
            ),
            Ok(Err(error)) => errln!("serve: the worker stopped: {error}"),
            Err(error) => errln!("serve: the worker ended abnormally: {error}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
