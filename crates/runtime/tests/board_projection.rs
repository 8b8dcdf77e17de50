//! A board member's prompts never show what its scope does not read, whatever the board's
//! schema: random schemas with root-level and cross-member keywords, random scopes and writes
//! (test-support/board_cases.rs), run through the runtime on a real SQLite file, with another
//! writer changing (and breaking) the parts the member does not read between its attempts.
//! Every prompt the model is sent, each showing the rejections of the attempt before, holds no
//! hidden member name or value; the rejections kept in the task's journal hold no write-only
//! value either (its readers never see them).
#![allow(clippy::unwrap_used)]

mod common;

#[path = "../../../test-support/board_cases.rs"]
mod board_cases;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use board_cases::BoardCase;
use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::board::{BoardScope, BoardTable};
use skillstate_core::skill::SkillSettings;
use skillstate_core::{ContextStrategy, Skill, SkillDefinition, StatePatch};
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_board_task};
use skillstate_store::{BoardAuthor, BoardWrite, NewBoard, Store};
use skillstate_tools::UserRequest;

/// Answers with the case's attempts, then finishes; keeps every prompt; before answer `n`,
/// the other writer commits its change `n` straight to the store (not validated: the board
/// may break its own schema in parts the member does not read).
struct Member {
    answers: Vec<String>,
    others: Vec<Value>,
    prompts: Mutex<Vec<String>>,
    store: Arc<dyn Store>,
    board: String,
}

#[async_trait]
impl ModelProvider for Member {
    fn spec(&self) -> String {
        "scripted:member".into()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let n = {
            let mut prompts = self.prompts.lock().unwrap();
            prompts.push(request.prompt.text());
            prompts.len() - 1
        };
        if let Some(patch) = self.others.get(n) {
            let board = self.store.board(&self.board, None).await.unwrap();
            let new_state = StatePatch::from_value(patch)
                .unwrap()
                .apply(&board.state)
                .unwrap();
            self.store
                .commit_board_write(
                    &self.board,
                    board.version,
                    &BoardWrite {
                        patch: patch.clone(),
                        state_hash: skillstate_core::json::state_hash(&new_state),
                        new_state,
                        author: BoardAuthor::Cli,
                        rebased_from: None,
                    },
                )
                .await
                .unwrap();
        }
        let text = self.answers.get(n).cloned().unwrap_or_else(|| {
            json!({"reasoning": "r", "state_patch": {}, "action": {"tool": "finish", "args": {"result": "done"}}})
                .to_string()
        });
        Ok(ModelResponse {
            text,
            usage: None,
            latency: Duration::ZERO,
            truncated: false,
        })
    }
}

fn member_skill(case: &BoardCase) -> Skill {
    let mut settings = SkillSettings::default();
    settings.run.max_steps = 3;
    settings.run.max_retries = case.attempts.len() as u32 + 1;
    settings.board = Some(
        BoardScope::parse(&BoardTable {
            reads: case.reads.clone(),
            writes: case.writes.clone(),
        })
        .unwrap(),
    );
    Skill::from_definition(SkillDefinition {
        name: "member".into(),
        description: "A member of a random board".into(),
        metadata: None,
        procedure: "Write your part of the board, then finish.".into(),
        schema: json!({"type": "object"}),
        initial_state: json!({}),
        settings,
        migrations: Vec::new(),
    })
    .unwrap()
}

/// Runs the case's member to its end; returns every prompt and the journal's rejections.
async fn run_case(case: &BoardCase) -> (Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = common::sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let board = store
        .create_board(NewBoard {
            name: "random".into(),
            schema: case.schema.clone(),
            initial_state: case.initial.clone(),
            tenant: None,
        })
        .await
        .unwrap();
    let answers = case
        .attempts
        .iter()
        .map(|patch| {
            json!({"reasoning": "r", "state_patch": {"board": patch}, "action": {"tool": "finish", "args": {"result": "done"}}})
                .to_string()
        })
        .collect();
    let member = Arc::new(Member {
        answers,
        others: case.others.clone(),
        prompts: Mutex::new(Vec::new()),
        store: store.clone(),
        board: board.id.clone(),
    });
    let skill = member_skill(case);
    let mut env = UserRequest::new("Do your part.");
    let task = start_board_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(member.spec(), ContextStrategy::State),
        &board.id,
        &board.name,
    )
    .await
    .unwrap();
    let model: Arc<dyn ModelProvider> = member.clone();
    Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    let journal = store.journal(&task.id).await.unwrap();
    let rejections = journal
        .iter()
        .filter_map(|entry| entry.errors.as_ref().map(Value::to_string))
        .collect();
    let prompts = member.prompts.lock().unwrap().clone();
    (prompts, rejections)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn a_members_prompts_show_nothing_outside_its_reads(seed in any::<u64>()) {
        let case = BoardCase::generate(seed);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (prompts, rejections) = runtime.block_on(run_case(&case));
        prop_assert!(!prompts.is_empty());
        // The model is shown write-only values it reads; nothing else it does not read.
        let hidden = case.hidden(false);
        for prompt in &prompts {
            let leaks = BoardCase::leaks(&hidden, prompt);
            prop_assert!(leaks.is_empty(), "{leaks:?} in the prompt:\n{prompt}\ncase: {case:#?}");
        }
        let hidden = case.hidden(true);
        for kept in &rejections {
            let leaks = BoardCase::leaks(&hidden, kept);
            prop_assert!(leaks.is_empty(), "{leaks:?} in the journal: {kept}");
        }
    }
}

/// The issue's example, through the runtime: a member limited to `/pub` (and a new member it
/// may add) meets a root `maxProperties`; the next prompt tells it a rule about a part it
/// cannot read was broken, and shows nothing of `/vault`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_constraint_refusal_shows_the_member_nothing_of_the_vault() {
    let case = BoardCase {
        schema: json!({
            "type": "object",
            "maxProperties": 2,
            "properties": {"pub": {"type": "object"}, "vault": {"type": "object"}}
        }),
        initial: json!({"pub": {"note": "hello"}, "vault": {"zqkpinnumber": "zqvsecretpin"}}),
        reads: vec!["/pub".into(), "/extra".into()],
        writes: vec!["/extra".into()],
        attempts: vec![json!({"extra": "x"})],
        others: Vec::new(),
    };
    let (prompts, rejections) = run_case(&case).await;
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert!(
        prompts[1].contains("a rule that involves a part you cannot read is broken"),
        "{}",
        prompts[1]
    );
    for text in prompts.iter().chain(&rejections) {
        assert!(!text.contains("vault"), "{text}");
        assert!(!text.contains("zq"), "{text}");
    }
}
