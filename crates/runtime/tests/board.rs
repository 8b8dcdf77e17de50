//! Tasks attached to a board, on a real SQLite file: the prompt shows only the skill's reads,
//! writes outside `writes` are refused with their pointer, an answer that meets another
//! writer's change is refused with the fresh value and recomputed, a disjoint one is rebased,
//! and every board write is journaled with its author in the step's transaction.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use async_trait::async_trait;
use common::sqlite_store;
use serde_json::{Value, json};
use skillstate_core::board::BoardScope;
use skillstate_core::skill::SkillSettings;
use skillstate_core::{ContextStrategy, RejectionKind, Skill, SkillDefinition};
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::{
    LeasePolicy, NoProgress, Runner, TaskOptions, rebuild_prompt, start_task,
};
use skillstate_store::{
    BoardAuthor, BoardRecord, BoardWrite, NewBoard, Store, TaskStatus, Verdict, board_state_at,
};
use skillstate_tools::UserRequest;

fn board_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {"type": "object", "properties": {"goal": {"type": "string", "readOnly": true}}},
            "frontend": {"type": "object"},
            "backend": {"type": "object"},
            "secret_roadmap": {"type": "string"},
            "shared": {"type": "object", "properties": {"counter": {"type": "integer"}}}
        },
        "additionalProperties": false
    })
}

fn initial_board() -> Value {
    json!({
        "plan": {"goal": "ship v2"},
        "frontend": {},
        "backend": {},
        "secret_roadmap": "acquire-competitor-in-q3",
        "shared": {"counter": 0}
    })
}

fn agent_skill(name: &str, reads: &[&str], writes: &[&str]) -> Skill {
    let mut settings = SkillSettings::default();
    settings.run.max_steps = 10;
    settings.run.max_retries = 1;
    let table = skillstate_core::board::BoardTable {
        reads: reads.iter().map(|s| (*s).to_owned()).collect(),
        writes: writes.iter().map(|s| (*s).to_owned()).collect(),
    };
    settings.board = Some(BoardScope::parse(&table).unwrap());
    Skill::from_definition(SkillDefinition {
        name: name.into(),
        description: format!("The {name} agent"),
        metadata: None,
        procedure: "Do your part of the plan on the board, then finish.".into(),
        schema: json!({"type": "object", "properties": {"done": {"type": "boolean"}}, "required": ["done"]}),
        initial_state: json!({"done": false}),
        settings,
        migrations: Vec::new(),
    })
    .unwrap()
}

fn answer(patch: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": "r", "state_patch": patch, "action": {"tool": tool, "args": args}})
        .to_string()
}

/// A counter agent's answer: set the board's counter to `n`, then finish.
fn counter_answer(n: i64) -> String {
    answer(
        json!({"done": true, "board": {"shared": {"counter": n}}}),
        "finish",
        json!({"result": "ok"}),
    )
}

type Hook = Box<dyn Fn(usize) -> Option<(Value, u64)> + Send + Sync>;

/// A model that answers from a list, keeps every prompt it was sent, and before answering
/// call `n` may have another writer commit a patch on the board (`hook(n)` gives it), so races
/// happen exactly where the test wants them.
struct Team {
    answers: Vec<String>,
    prompts: Mutex<Vec<String>>,
    store: Arc<dyn Store>,
    board: String,
    hook: Hook,
    /// Set: once out of answers, announce it here and never answer (the process "dies"
    /// waiting for the model).
    stall: Option<Arc<Notify>>,
}

#[async_trait]
impl ModelProvider for Team {
    fn spec(&self) -> String {
        "scripted:team".into()
    }
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let n = {
            let mut prompts = self.prompts.lock().unwrap();
            prompts.push(request.prompt.text());
            prompts.len() - 1
        };
        if let Some((patch, expected)) = (self.hook)(n) {
            let board = self.store.board(&self.board, None).await.unwrap();
            let new_state = skillstate_core::StatePatch::from_value(&patch)
                .unwrap()
                .apply(&board.state)
                .unwrap();
            self.store
                .commit_board_write(
                    &self.board,
                    expected,
                    &BoardWrite {
                        patch,
                        state_hash: skillstate_core::json::state_hash(&new_state),
                        new_state,
                        author: BoardAuthor::Cli,
                        rebased_from: None,
                    },
                )
                .await
                .unwrap();
        }
        if let (Some(stall), None) = (&self.stall, self.answers.get(n)) {
            stall.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(ModelResponse {
            text: self.answers.get(n).cloned().unwrap_or_default(),
            usage: None,
            latency: Duration::ZERO,
            truncated: false,
        })
    }
}

async fn setup(dir: &std::path::Path) -> (Arc<dyn Store>, BoardRecord) {
    let (sqlite, _) = sqlite_store(dir).await;
    let store: Arc<dyn Store> = sqlite;
    let board = store
        .create_board(NewBoard {
            name: "release-42".into(),
            schema: board_schema(),
            initial_state: initial_board(),
            tenant: None,
        })
        .await
        .unwrap();
    (store, board)
}

async fn run_agent(
    store: &Arc<dyn Store>,
    board: &BoardRecord,
    skill: &Skill,
    answers: Vec<String>,
    hook: Hook,
) -> (String, Arc<Team>, TaskStatus) {
    let mut env = UserRequest::new("Build your part of v2.");
    let team = Arc::new(Team {
        answers,
        prompts: Mutex::new(Vec::new()),
        store: store.clone(),
        board: board.id.clone(),
        hook,
        stall: None,
    });
    let task = start_task(
        store.as_ref(),
        skill,
        &mut env,
        &TaskOptions::new(team.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    store.attach_task(&board.id, &task.id).await.unwrap();
    let model: Arc<dyn ModelProvider> = team.clone();
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    (task.id, team, outcome.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_shows_only_the_reads_and_writes_land_with_their_author() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board) = setup(dir.path()).await;
    let skill = agent_skill("frontend", &["/plan", "/frontend"], &["/frontend"]);
    let answers = vec![answer(
        json!({"done": true, "board": {"frontend": {"login_page": "built"}}}),
        "finish",
        json!({"result": "ok"}),
    )];
    let (task, team, status) = run_agent(&store, &board, &skill, answers, Box::new(|_| None)).await;
    assert_eq!(status, TaskStatus::Completed);

    // The prompt showed the plan and the frontend, at /board, and nothing else of the board.
    let prompts = team.prompts.lock().unwrap().clone();
    assert!(
        prompts[0].contains("\"board\":{\"frontend\":{},\"plan\":{\"goal\":\"ship v2\"}}"),
        "{}",
        prompts[0]
    );
    assert!(!prompts[0].contains("acquire-competitor"));
    assert!(!prompts[0].contains("backend"));
    assert!(!prompts[0].contains("counter"));

    // The board has the write, journaled with its author; the task's own state has no board.
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.version, 1);
    assert_eq!(now.state["frontend"], json!({"login_page": "built"}));
    let writes = store.board_writes(&board.id, 1, 1).await.unwrap();
    assert_eq!(
        writes[0].author,
        BoardAuthor::Task {
            task: task.clone(),
            step: 1
        }
    );
    assert_eq!(writes[0].rebased_from, None);
    let record = store.task(&task).await.unwrap();
    assert_eq!(record.state, json!({"done": true}));
    let journal = store.journal(&task).await.unwrap();
    assert_eq!(journal[0].board_version, Some(0));
    assert_eq!(journal[0].patch, Some(json!({"done": true})));
    // Time travel on the board checks every hash.
    assert_eq!(
        board_state_at(store.as_ref(), &board.id, 0).await.unwrap(),
        initial_board()
    );
    assert_eq!(
        board_state_at(store.as_ref(), &board.id, 1).await.unwrap(),
        now.state
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_the_scope_and_to_read_only_board_fields_are_refused_with_their_pointer() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board) = setup(dir.path()).await;
    let skill = agent_skill("frontend", &["/plan", "/frontend"], &["/frontend"]);
    let answers = vec![
        answer(
            json!({"done": true, "board": {"backend": {"x": 1}}}),
            "finish",
            json!({"result": "ok"}),
        ),
        answer(
            json!({"done": true, "board": {"plan": {"goal": "ship v3"}}}),
            "finish",
            json!({"result": "ok"}),
        ),
    ];
    let (task, _, status) = run_agent(&store, &board, &skill, answers, Box::new(|_| None)).await;
    assert_eq!(status, TaskStatus::Failed);
    let journal = store.journal(&task).await.unwrap();
    let errors: Vec<Value> = journal.iter().filter_map(|e| e.errors.clone()).collect();
    assert_eq!(errors[0][0]["kind"], "outside_write_scope");
    assert_eq!(errors[0][0]["pointer"], "/board/backend");
    // The plan is shown to this agent, but it writes only the frontend.
    assert_eq!(errors[1][0]["kind"], "outside_write_scope");
    assert_eq!(errors[1][0]["pointer"], "/board/plan");
    // A planner may write the plan, but not its read-only goal.
    let planner = agent_skill("planner", &["/plan"], &["/plan"]);
    let answers = vec![answer(
        json!({"done": true, "board": {"plan": {"goal": "ship v3"}}}),
        "finish",
        json!({"result": "ok"}),
    )];
    let (task, _, status) = run_agent(&store, &board, &planner, answers, Box::new(|_| None)).await;
    assert_eq!(status, TaskStatus::Failed);
    let journal = store.journal(&task).await.unwrap();
    let errors = journal[0].errors.clone().unwrap();
    assert_eq!(errors[0]["kind"], "read_only");
    assert_eq!(errors[0]["pointer"], "/board/plan/goal");
    // Nothing reached the board.
    assert_eq!(store.board(&board.id, None).await.unwrap().version, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_meeting_another_writers_change_is_refused_with_the_fresh_value_then_recomputed()
{
    let dir = tempfile::tempdir().unwrap();
    let (store, board) = setup(dir.path()).await;
    let skill = agent_skill("counter", &["/shared"], &["/shared/counter"]);
    // While the model thinks about its first answer (computed on counter = 0), someone sets the
    // counter to 5. The answer "counter = 1" must not overwrite that.
    let answers = vec![counter_answer(1), counter_answer(6)];
    let hook: Hook = Box::new(|n| (n == 0).then(|| (json!({"shared": {"counter": 5}}), 0)));
    let (task, team, status) = run_agent(&store, &board, &skill, answers, hook).await;
    assert_eq!(status, TaskStatus::Completed);
    let journal = store.journal(&task).await.unwrap();
    assert_eq!(journal[0].verdict, Verdict::Rejected);
    let errors: Vec<skillstate_core::Rejection> =
        serde_json::from_value(journal[0].errors.clone().unwrap()).unwrap();
    assert_eq!(errors[0].kind, RejectionKind::BoardConflict);
    assert_eq!(errors[0].pointer, "/board/shared/counter");
    assert!(
        errors[0].message.contains("it is now 5"),
        "{}",
        errors[0].message
    );
    // The second prompt showed the fresh value and the conflict.
    let prompts = team.prompts.lock().unwrap().clone();
    assert!(prompts[1].contains("\"counter\":5"));
    assert!(prompts[1].contains("board_conflict"));
    // Final board: the other writer's 5, then this agent's 6 — no lost update.
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.state["shared"]["counter"], 6);
    assert_eq!(now.version, 2);
    assert_eq!(journal[1].board_version, Some(1));
    // Each attempt's exact prompt is rebuilt from the journals: the board at the version it
    // showed, mounted as it was.
    let record = store.task(&task).await.unwrap();
    for (attempt, sent) in [(1u32, &prompts[0]), (2, &prompts[1])] {
        let (rebuilt, recorded) = rebuild_prompt(store.as_ref(), &record, 1, attempt)
            .await
            .unwrap();
        assert_eq!(&rebuilt.text(), sent);
        assert_eq!(skillstate_core::json::text_hash(&rebuilt.text()), recorded);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_locations_nobody_changed_is_rebased_onto_the_newest_version() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board) = setup(dir.path()).await;
    let skill = agent_skill("frontend", &["/plan", "/frontend"], &["/frontend"]);
    let answers = vec![answer(
        json!({"done": true, "board": {"frontend": {"login_page": "built"}}}),
        "finish",
        json!({"result": "ok"}),
    )];
    // The backend agent writes its own part while this one thinks.
    let hook: Hook = Box::new(|n| (n == 0).then(|| (json!({"backend": {"api": "up"}}), 0)));
    let (task, team, status) = run_agent(&store, &board, &skill, answers, hook).await;
    assert_eq!(status, TaskStatus::Completed);
    assert_eq!(team.prompts.lock().unwrap().len(), 1);
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.version, 2);
    assert_eq!(now.state["backend"], json!({"api": "up"}));
    assert_eq!(now.state["frontend"], json!({"login_page": "built"}));
    let writes = store.board_writes(&board.id, 2, 2).await.unwrap();
    assert_eq!(writes[0].rebased_from, Some(0));
    assert_eq!(writes[0].author, BoardAuthor::Task { task, step: 1 });
    assert_eq!(
        board_state_at(store.as_ref(), &board.id, 2).await.unwrap(),
        now.state
    );
}

/// A run that dies after others' writes refused two answers of a step, resumed by a new
/// runner: those refusals were not the model's mistakes, so they did not spend the step's
/// retry budget before the crash and do not after it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn board_conflicts_before_a_crash_do_not_spend_the_resumed_steps_retries() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board) = setup(dir.path()).await;
    // max_retries = 1: two answers of a step may be the model's mistakes.
    let skill = agent_skill("counter", &["/shared"], &["/shared/counter"]);
    assert_eq!(skill.settings().run.max_retries, 1);
    let lease = Duration::from_millis(300);
    let policy = || LeasePolicy {
        ttl: lease,
        label: "test".into(),
    };

    // First process: while the model computes each of its two answers, someone else moves the
    // counter (to 5, then to 7); both answers are refused as conflicts; then it dies waiting
    // for its third answer.
    let stuck = Arc::new(Notify::new());
    let first = Arc::new(Team {
        answers: vec![counter_answer(1), counter_answer(6)],
        prompts: Mutex::new(Vec::new()),
        store: store.clone(),
        board: board.id.clone(),
        hook: Box::new(|n| match n {
            0 => Some((json!({"shared": {"counter": 5}}), 0)),
            1 => Some((json!({"shared": {"counter": 7}}), 1)),
            _ => None,
        }),
        stall: Some(stuck.clone()),
    });
    let mut env = UserRequest::new("Count.");
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(first.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    store.attach_task(&board.id, &task.id).await.unwrap();
    {
        let model: Arc<dyn ModelProvider> = first.clone();
        let mut quiet = NoProgress;
        let mut runner =
            Runner::new(store.clone(), model, &mut env, &mut quiet).with_lease_policy(policy());
        let run = runner.run(&task.id);
        tokio::select! {
            result = run => panic!("the run should hang on its model: {result:?}"),
            () = stuck.notified() => {}
        }
    }
    let journal = store.journal(&task.id).await.unwrap();
    let kinds: Vec<(u32, Verdict, String)> = journal
        .iter()
        .map(|e| {
            let errors = e.errors.clone().unwrap_or_default();
            (
                e.attempt,
                e.verdict,
                errors[0]["kind"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (1, Verdict::Rejected, "board_conflict".to_owned()),
            (2, Verdict::Rejected, "board_conflict".to_owned())
        ]
    );
    tokio::time::sleep(lease * 2).await;

    // Second process: its one answer, computed on the fresh 7, is the step's third answer and
    // only its first counted one.
    let second = Arc::new(Team {
        answers: vec![counter_answer(8)],
        prompts: Mutex::new(Vec::new()),
        store: store.clone(),
        board: board.id.clone(),
        hook: Box::new(|_| None),
        stall: None,
    });
    let model: Arc<dyn ModelProvider> = second.clone();
    let mut env = UserRequest::new("Count.");
    let outcome = Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .with_lease_policy(policy())
        .run(&task.id)
        .await
        .unwrap();
    let record = store.task(&task.id).await.unwrap();
    assert_eq!(
        outcome.status,
        TaskStatus::Completed,
        "{:?}",
        record.outcome
    );
    let prompts = second.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1);
    assert!(
        prompts[0].contains("board_conflict") && prompts[0].contains("\"counter\":7"),
        "the resumed step shows the last conflict and the fresh value: {}",
        prompts[0]
    );
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.state["shared"]["counter"], 8);
    assert_eq!(now.version, 3);
    let accepted: Vec<(u64, u32)> = store
        .journal(&task.id)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .map(|e| (e.step, e.attempt))
        .collect();
    assert_eq!(accepted, [(1, 3)]);
}
