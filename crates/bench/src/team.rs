//! The team benchmark: the bugfix team (`skills/bugfix-coder` and `skills/bugfix-reviewer`
//! on a `boards/bugfix` board) run with the oracle over several seeds.
//!
//! For each seed a fresh board is created and both agents start on it at once, each a task of
//! its own skill with its own environment built from that seed (the same repository, two
//! copies); every step goes through the whole runtime. What is reported, per agent over all
//! seeds: tasks completed, steps, prompt tokens per step (first, last and largest: they stay
//! flat, since a prompt shows the state and the board's current slots, never a history), and
//! the board writes it committed, how many of them were rebased onto the other agent's newer
//! write, and how many answers were refused as conflicts (none: the agents write disjoint
//! parts). Per seed, whether the board ended released with every bug fixed and whether its
//! journal replays to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill};
use skillstate_envs::build_environment;
use skillstate_envs::oracle::OracleModel;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::{BoardAuthor, NewBoard, Store, TaskStatus, Verdict};

/// Where the team is defined and what to run.
#[derive(Debug, Clone)]
pub struct TeamConfig {
    /// The repository root (holds `skills/` and `boards/`).
    pub root: PathBuf,
    pub seeds: Vec<u64>,
    /// Failing tests per repository (1 to 5).
    pub bugs: u32,
}

/// One agent's figures over every seed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentFigures {
    pub skill: String,
    pub tasks: usize,
    pub completed: usize,
    /// Accepted steps over all its tasks, and the fewest and most of one task.
    pub steps: u64,
    pub steps_min: u64,
    pub steps_max: u64,
    /// Prompt tokens: the mean of each task's first step, of its last step, and the largest
    /// prompt of any step.
    pub prompt_tokens_first: u64,
    pub prompt_tokens_last: u64,
    pub prompt_tokens_max: u64,
    pub board_writes: u64,
    /// Its writes committed on a newer version than its answer was computed on.
    pub rebased: u64,
    /// Its answers refused because their board part met the other agent's change.
    pub conflicts: u64,
}

/// The figures of one run of the team benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct TeamReport {
    pub backend: String,
    pub seeds: usize,
    pub bugs: u32,
    pub seconds: f64,
    /// Boards that ended with the release out and every bug fixed.
    pub released: usize,
    /// Every board's journal replays to its final state, every hash checked.
    pub replay_ok: bool,
    pub coder: AgentFigures,
    pub reviewer: AgentFigures,
}

const CODER: &str = "skills/bugfix-coder";
const REVIEWER: &str = "skills/bugfix-reviewer";

/// The skill in `dir` with its environment drawn from `seed` with `bugs` bugs.
fn seeded_skill(dir: &Path, seed: u64, bugs: u32) -> Result<Skill, String> {
    let loaded = Skill::load(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut definition = loaded.skill.definition;
    let environment = definition
        .settings
        .environment
        .as_mut()
        .ok_or_else(|| format!("{}: skill.toml has no [environment]", dir.display()))?;
    environment.params.insert("seed".into(), json!(seed));
    environment.params.insert("bugs".into(), json!(bugs));
    Skill::from_definition(definition)
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// What one task did, from its journal.
#[derive(Debug, Default)]
struct TaskFigures {
    completed: bool,
    prompts: Vec<u64>,
    conflicts: u64,
}

async fn task_figures(store: &dyn Store, task: &str) -> Result<TaskFigures, String> {
    let record = store.task(task).await.map_err(|e| e.to_string())?;
    let journal = store.journal(task).await.map_err(|e| e.to_string())?;
    let conflicts = journal
        .iter()
        .filter(|e| {
            e.verdict == Verdict::Rejected
                && e.errors
                    .as_ref()
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x["kind"] == "board_conflict"))
        })
        .count() as u64;
    Ok(TaskFigures {
        completed: record.status == TaskStatus::Completed,
        prompts: journal
            .iter()
            .filter(|e| e.verdict == Verdict::Accepted)
            .map(|e| e.prompt_tokens)
            .collect(),
        conflicts,
    })
}

fn add(
    figures: &mut AgentFigures,
    task: &TaskFigures,
    firsts: &mut Vec<u64>,
    lasts: &mut Vec<u64>,
) {
    let steps = task.prompts.len() as u64;
    figures.tasks += 1;
    figures.completed += usize::from(task.completed);
    figures.steps += steps;
    figures.steps_min = if figures.tasks == 1 {
        steps
    } else {
        figures.steps_min.min(steps)
    };
    figures.steps_max = figures.steps_max.max(steps);
    figures.conflicts += task.conflicts;
    firsts.extend(task.prompts.first());
    lasts.extend(task.prompts.last());
    figures.prompt_tokens_max = figures
        .prompt_tokens_max
        .max(task.prompts.iter().copied().max().unwrap_or(0));
}

fn mean(values: &[u64]) -> u64 {
    if values.is_empty() {
        0
    } else {
        values.iter().sum::<u64>() / values.len() as u64
    }
}

/// Runs the team once per seed in `store`, both agents at once on a fresh board each time.
pub async fn run_team_bench(
    store: Arc<dyn Store>,
    backend: &str,
    config: &TeamConfig,
) -> Result<TeamReport, String> {
    let schema = read_json(&config.root.join("boards/bugfix/state.schema.json"))?;
    let initial = read_json(&config.root.join("boards/bugfix/state.init.json"))?;
    let mut coder = AgentFigures {
        skill: "bugfix-coder".into(),
        ..AgentFigures::default()
    };
    let mut reviewer = AgentFigures {
        skill: "bugfix-reviewer".into(),
        ..AgentFigures::default()
    };
    let (mut coder_first, mut coder_last, mut reviewer_first, mut reviewer_last) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut released = 0;
    let mut replay_ok = true;
    let started = Instant::now();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for &seed in &config.seeds {
        let board = store
            .create_board(NewBoard {
                name: format!("team-{stamp}-{seed}"),
                schema: schema.clone(),
                initial_state: initial.clone(),
                tenant: None,
            })
            .await
            .map_err(|e| e.to_string())?;
        let mut handles = Vec::new();
        let mut ids = Vec::new();
        for dir in [CODER, REVIEWER] {
            let skill = seeded_skill(&config.root.join(dir), seed, config.bugs)?;
            let settings = skill
                .settings()
                .environment
                .clone()
                .ok_or_else(|| format!("{dir}: no [environment]"))?;
            let mut env = build_environment(&settings).map_err(|e| format!("{dir}: {e}"))?;
            let task = start_task(
                store.as_ref(),
                &skill,
                env.as_mut(),
                &TaskOptions::new("oracle", ContextStrategy::State),
            )
            .await
            .map_err(|e| e.to_string())?;
            store
                .attach_task(&board.id, &task.id)
                .await
                .map_err(|e| e.to_string())?;
            let model =
                Arc::new(OracleModel::for_environment(&settings.kind).map_err(|e| e.to_string())?);
            let store = store.clone();
            let id = task.id.clone();
            ids.push(task.id);
            handles.push(tokio::spawn(async move {
                Runner::new(store, model, env.as_mut(), &mut NoProgress)
                    .run(&id)
                    .await
                    .map_err(|e| e.to_string())
            }));
        }
        for handle in handles {
            handle.await.map_err(|e| e.to_string())??;
        }

        let now = store
            .board(&board.id, None)
            .await
            .map_err(|e| e.to_string())?;
        if now.state["release"]["version"] == "1.4.1"
            && now.state["release"]["fixes"] == json!(config.bugs)
        {
            released += 1;
        }
        let replayed =
            skillstate_store::board_state_replayed(store.as_ref(), &board.id, now.version).await;
        replay_ok &= replayed.as_ref().is_ok_and(|state| *state == now.state);
        let writes = store
            .board_writes(&board.id, 1, now.version)
            .await
            .map_err(|e| e.to_string())?;
        for (id, figures, firsts, lasts) in [
            (&ids[0], &mut coder, &mut coder_first, &mut coder_last),
            (
                &ids[1],
                &mut reviewer,
                &mut reviewer_first,
                &mut reviewer_last,
            ),
        ] {
            let task = task_figures(store.as_ref(), id).await?;
            add(figures, &task, firsts, lasts);
            for write in writes
                .iter()
                .filter(|w| matches!(&w.author, BoardAuthor::Task { task, .. } if task == id))
            {
                figures.board_writes += 1;
                figures.rebased += u64::from(write.rebased_from.is_some());
            }
        }
    }
    coder.prompt_tokens_first = mean(&coder_first);
    coder.prompt_tokens_last = mean(&coder_last);
    reviewer.prompt_tokens_first = mean(&reviewer_first);
    reviewer.prompt_tokens_last = mean(&reviewer_last);
    Ok(TeamReport {
        backend: backend.to_owned(),
        seeds: config.seeds.len(),
        bugs: config.bugs,
        seconds: started.elapsed().as_secs_f64(),
        released,
        replay_ok,
        coder,
        reviewer,
    })
}

/// The report as a Markdown table, one row per agent.
pub fn team_table(report: &TeamReport) -> String {
    let mut out = format!(
        "{} seeds × {} bugs on {}, {:.1} s: {}/{} boards released, journals replay: {}\n\n",
        report.seeds,
        report.bugs,
        report.backend,
        report.seconds,
        report.released,
        report.seeds,
        if report.replay_ok { "yes" } else { "NO" }
    );
    out.push_str("| agent | completed | steps (min–max per task) | prompt tokens first / last / max | board writes | rebased | conflicts |\n");
    out.push_str("|---|---|---|---|---|---|---|\n");
    for a in [&report.coder, &report.reviewer] {
        out.push_str(&format!(
            "| {} | {}/{} | {} ({}–{}) | {} / {} / {} | {} | {} | {} |\n",
            a.skill,
            a.completed,
            a.tasks,
            a.steps,
            a.steps_min,
            a.steps_max,
            a.prompt_tokens_first,
            a.prompt_tokens_last,
            a.prompt_tokens_max,
            a.board_writes,
            a.rebased,
            a.conflicts
        ));
    }
    out
}
