//! The board benchmark: N agents writing disjoint parts of one board at full speed.
//!
//! Each agent is a task of a small counting skill attached to one board; its `[board]` scope
//! reads `/plan` and its own `/agents/aN` and writes only `/agents/aN`. A scripted model answers
//! every step with the next count, written both to the task's state and to the agent's part of
//! the board, and a no-op read-only tool call. All agents run at once in one process, each
//! step through the whole runtime (prompt with the board mounted, validation, the step and the
//! board write in one transaction, rebasing onto others' writes). What is measured: committed
//! board writes per second, how many were rebased, how many answers were refused as conflicts
//! (none should be: the parts are disjoint), and whether each agent's prompt stays the same
//! size as the board grows.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};
use skillstate_core::board::{BoardScope, BoardTable};
use skillstate_core::{ContextStrategy, Skill};
use skillstate_providers::ScriptedModel;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::{NewBoard, Store, TaskStatus, Verdict};

use crate::queue::{counter_environment, counter_skill};

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct BoardReport {
    pub backend: String,
    pub agents: usize,
    pub steps: u32,
    pub seconds: f64,
    pub board_writes: u64,
    pub board_writes_per_sec: f64,
    /// Writes committed on top of a newer version than their answer was computed on.
    pub rebased: u64,
    /// Answers refused because their board part met another writer's change.
    pub conflicts: u64,
    pub completed: usize,
    /// Each agent's prompt tokens at its first and its last step.
    pub prompt_tokens_first: Vec<u64>,
    pub prompt_tokens_last: Vec<u64>,
    /// The journal replayed from the initial state reproduces the board, every hash checked.
    pub replay_ok: bool,
}

fn agent_skill(index: usize, steps: u32) -> Result<Skill, String> {
    let mut skill = counter_skill(steps)?;
    let mine = format!("/agents/a{index}");
    let table = BoardTable {
        reads: vec!["/plan".into(), mine.clone()],
        writes: vec![mine],
    };
    skill.definition.settings.board = Some(BoardScope::parse(&table).map_err(|problems| {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })?);
    skill.definition.name = format!("agent-{index}");
    skill.definition.procedure = format!(
        "Each step: set `count` to the step number, write it to your part of the board (board.agents.a{index}.count) and call `tick`. After the last step, finish."
    );
    Skill::from_definition(skill.definition)
}

fn agent_answers(index: usize, steps: u32) -> Vec<String> {
    let mut answers: Vec<String> = (1..=steps)
        .map(|i| {
            json!({
                "reasoning": "next tick",
                "state_patch": {"count": i, "board": {"agents": {format!("a{index}"): {"count": i}}}},
                "action": {"tool": "tick", "args": {}}
            })
            .to_string()
        })
        .collect();
    answers.push(
        json!({"reasoning": "done", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "counted"}}})
            .to_string(),
    );
    answers
}

/// Runs `agents` agents of `steps` steps each on one new board in `store`.
pub async fn run_board_bench(
    store: Arc<dyn Store>,
    backend: &str,
    agents: usize,
    steps: u32,
) -> Result<BoardReport, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut parts = serde_json::Map::new();
    for index in 0..agents {
        parts.insert(format!("a{index}"), json!({"count": 0}));
    }
    let board = store
        .create_board(NewBoard {
            name: format!(
                "bench-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ),
            schema: json!({
                "type": "object",
                "properties": {
                    "plan": {"type": "string", "readOnly": true},
                    "agents": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"count": {"type": "integer", "minimum": 0}},
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["plan", "agents"]
            }),
            initial_state: json!({"plan": "every agent counts in its own part", "agents": parts}),
            tenant: None,
        })
        .await
        .map_err(|e| err(&e))?;

    let mut tasks = Vec::new();
    for index in 0..agents {
        let skill = agent_skill(index, steps)?;
        let mut env = counter_environment();
        let task = start_task(
            store.as_ref(),
            &skill,
            env.as_mut(),
            &TaskOptions::new("scripted:board-bench", ContextStrategy::State),
        )
        .await
        .map_err(|e| err(&e))?;
        store
            .attach_task(&board.id, &task.id)
            .await
            .map_err(|e| err(&e))?;
        tasks.push(task.id);
    }

    let started = Instant::now();
    let mut handles = Vec::new();
    for (index, task) in tasks.iter().enumerate() {
        let store = store.clone();
        let task = task.clone();
        handles.push(tokio::spawn(async move {
            let mut env = counter_environment();
            let model = Arc::new(ScriptedModel::from_outputs(
                "board-bench.jsonl".into(),
                agent_answers(index, steps),
            ));
            Runner::new(store, model, env.as_mut(), &mut NoProgress)
                .run(&task)
                .await
                .map_err(|e| e.to_string())
        }));
    }
    let mut completed = 0;
    for handle in handles {
        let outcome = handle.await.map_err(|e| err(&e))??;
        if outcome.status == TaskStatus::Completed {
            completed += 1;
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    let now = store.board(&board.id, None).await.map_err(|e| err(&e))?;
    let writes = store
        .board_writes(&board.id, 1, now.version)
        .await
        .map_err(|e| err(&e))?;
    let rebased = writes.iter().filter(|w| w.rebased_from.is_some()).count() as u64;
    let replayed =
        skillstate_store::board_state_replayed(store.as_ref(), &board.id, now.version).await;
    let replay_ok = replayed.as_ref().is_ok_and(|state| *state == now.state);

    let mut conflicts = 0;
    let mut first = Vec::new();
    let mut last = Vec::new();
    for task in &tasks {
        let journal = store.journal(task).await.map_err(|e| err(&e))?;
        conflicts += journal
            .iter()
            .filter(|e| {
                e.verdict == Verdict::Rejected
                    && e.errors.as_ref().is_some_and(|errors| {
                        errors
                            .as_array()
                            .is_some_and(|a| a.iter().any(|x| x["kind"] == "board_conflict"))
                    })
            })
            .count() as u64;
        let accepted: Vec<u64> = journal
            .iter()
            .filter(|e| e.verdict == Verdict::Accepted)
            .map(|e| e.prompt_tokens)
            .collect();
        first.push(accepted.first().copied().unwrap_or(0));
        // The last tick (the finish answer after it shows the same board).
        last.push(accepted.iter().rev().nth(1).copied().unwrap_or(0));
    }
    Ok(BoardReport {
        backend: backend.to_owned(),
        agents,
        steps,
        seconds,
        board_writes: now.version,
        board_writes_per_sec: now.version as f64 / seconds.max(1e-9),
        rebased,
        conflicts,
        completed,
        prompt_tokens_first: first,
        prompt_tokens_last: last,
        replay_ok,
    })
}

/// The whole board as JSON, for a report.
pub fn report_json(report: &BoardReport) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}
