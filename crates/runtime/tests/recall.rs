//! The `recall` tool and provenance through the real runtime (docs/recall.md, "Recall and provenance"):
//! a warehouse skill that allows `recall`, scripted answers, a real SQLite file. What recall
//! returns is the next observation, cites step numbers, searches only the steps before the one
//! asking, and never shows a write-only value; provenance names each writing step's
//! observation and author (the model, or the API key of a write through the service).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use skillstate_core::Skill;
use skillstate_runtime::provenance::{Author, provenance};
use skillstate_runtime::{NoProgress, Runner, StateWrite, TaskOptions, start_task, write_state};
use skillstate_store::Store;

const SECRET: &str = "zq-secret-774411";

/// The warehouse skill allowing `recall`, with a write-only `token` in its state.
fn recall_skill(root: &Path, seed: u64, events: u32) -> Skill {
    let dir = root.join("skill").join("warehouse");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["SKILL.md", "state.init.json"] {
        std::fs::copy(warehouse_skill_dir().join(file), dir.join(file)).unwrap();
    }
    let mut schema: Value = serde_json::from_str(
        &std::fs::read_to_string(warehouse_skill_dir().join("state.schema.json")).unwrap(),
    )
    .unwrap();
    schema["properties"]["token"] = json!({"type": "string", "writeOnly": true});
    std::fs::write(dir.join("state.schema.json"), schema.to_string()).unwrap();
    std::fs::write(
        dir.join("skill.toml"),
        format!(
            "[budgets]\nrecall_tokens = 600\n[run]\nmax_steps = 100\n[tools]\nallow = [\"warehouse\", \"recall\"]\n[environment]\nkind = \"warehouse\"\nseed = {seed}\nevents = {events}\n"
        ),
    )
    .unwrap();
    Skill::load(&dir).unwrap().skill
}

fn answer(reasoning: &str, patch: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": reasoning, "state_patch": patch, "action": {"tool": tool, "args": args}})
        .to_string()
}

/// Runs `answers` on a fresh recall-enabled warehouse task; returns the store and task id.
async fn run(root: &Path, answers: Vec<String>) -> (Arc<dyn Store>, String) {
    let skill = recall_skill(root, 11, 8);
    let (store, _) = sqlite_store(root).await;
    let store: Arc<dyn Store> = store;
    let mut env = warehouse(11, 8);
    let model = scripted(answers);
    let options = TaskOptions::new(model.spec(), skillstate_core::ContextStrategy::State);
    let task = start_task(store.as_ref(), &skill, &mut env, &options)
        .await
        .unwrap();
    assert!(
        task.tools.iter().any(|t| t.name == "recall"),
        "the task is created with recall"
    );
    Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    (store, task.id)
}

/// The item and shelf of the first correct answer (a `store`).
fn first_store(answers: &[String]) -> (String, String) {
    let first: Value = serde_json::from_str(&answers[0]).unwrap();
    let args = &first["action"]["args"];
    (
        args["item"].as_str().unwrap().to_owned(),
        args["shelf"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_finds_earlier_steps_and_its_result_is_the_next_observation() {
    let tmp = tempfile::tempdir().unwrap();
    let correct = correct_answers(11, 8);
    let (item, shelf) = first_store(&correct);
    let mut answers: Vec<String> = correct[..3].to_vec();
    answers.push(answer(
        &format!("Where did {item} go?"),
        json!({}),
        "recall",
        json!({"query": item, "limit": 20}),
    ));
    answers.push(answer(
        "Bad arguments.",
        json!({}),
        "recall",
        json!({"query": "x", "from_step": 9, "to_step": 3}),
    ));
    answers.push(answer("Done.", json!({}), "finish", json!({})));
    let (store, task) = run(tmp.path(), answers).await;

    let recalled = store.observation(&task, 5).await.unwrap().unwrap();
    assert!(recalled.starts_with("Recall: "), "{recalled}");
    assert!(
        recalled.contains(&format!(
            "[step 1 action] store {{\"item\":\"{item}\",\"shelf\":\"{shelf}\"}}"
        )),
        "{recalled}"
    );
    assert!(
        recalled.contains(&format!("[step 1 state] /inventory/{shelf} = \"{item}\"")),
        "{recalled}"
    );
    // The step that asked is not among the hits (its reasoning names the item).
    assert!(!recalled.contains("[step 4 "), "{recalled}");
    // Newest first.
    let steps: Vec<u64> = recalled
        .lines()
        .filter_map(|l| l.strip_prefix("[step ")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(steps.windows(2).all(|w| w[0] >= w[1]), "{steps:?}");
    let result = recalled.split("\nMaintenance").next().unwrap_or(&recalled);
    let result = result.split("\nShipment").next().unwrap_or(result);
    let result = result.split("\nCustomer").next().unwrap_or(result);
    assert!(
        skillstate_core::count_tokens(result) <= 600,
        "bounded by recall_tokens"
    );

    let refused = store.observation(&task, 6).await.unwrap().unwrap();
    assert!(
        refused.contains("Error") && refused.contains("from_step"),
        "an argument problem names the argument: {refused}"
    );
    // The recall result was not indexed again: the item is found where it was, not in step 5.
    let query = skillstate_core::recall::RecallQuery::new(Some(&item), None).unwrap();
    let hits = store
        .search_journal(&task, &query, None, 100)
        .await
        .unwrap();
    assert!(hits.iter().all(|h| h.step != 5), "{hits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_never_shows_a_write_only_value() {
    let tmp = tempfile::tempdir().unwrap();
    let correct = correct_answers(11, 8);
    let first: Value = serde_json::from_str(&correct[0]).unwrap();
    let mut patch = first["state_patch"].clone();
    patch["token"] = json!(SECRET);
    let answers = vec![
        answer(
            &format!("Stored. I saved the token {SECRET} for later."),
            patch,
            first["action"]["tool"].as_str().unwrap(),
            first["action"]["args"].clone(),
        ),
        // Overwritten: an older write-only value stays hidden too.
        answer(
            "Rotate the token.",
            json!({"token": "another-value-99"}),
            "wait",
            json!({}),
        ),
        answer("Find it.", json!({}), "recall", json!({"query": SECRET})),
        answer(
            "Find the note.",
            json!({}),
            "recall",
            json!({"query": "saved the token"}),
        ),
        answer(
            "Find the writes.",
            json!({}),
            "recall",
            json!({"pointer": "/token"}),
        ),
        answer(
            "Find by a piece.",
            json!({}),
            "recall",
            json!({"query": "774411"}),
        ),
        answer("Done.", json!({}), "finish", json!({})),
    ];
    let (store, task) = run(tmp.path(), answers).await;
    let mut shown = Vec::new();
    for step in 4..=7 {
        shown.push(store.observation(&task, step).await.unwrap().unwrap());
    }
    for text in &shown {
        assert!(!text.contains(SECRET), "{text}");
        // A piece of the value is found nowhere either (the query itself is the model's own).
        assert!(
            text.lines()
                .filter(|l| l.starts_with("[step"))
                .all(|l| !l.contains("774411")),
            "{text}"
        );
        assert!(!text.contains("another-value-99"), "{text}");
    }
    assert!(shown[0].starts_with("Recall: no matches"), "{}", shown[0]);
    assert!(
        shown[1].contains("[step 1 reasoning] Stored. I saved the token"),
        "{}",
        shown[1]
    );
    assert!(shown[2].starts_with("Recall: no matches"), "{}", shown[2]);
    assert!(shown[3].starts_with("Recall: no matches"), "{}", shown[3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provenance_names_each_writing_step_its_observation_and_its_author() {
    let tmp = tempfile::tempdir().unwrap();
    let correct = correct_answers(11, 8);
    let (item, shelf) = first_store(&correct);
    let mut answers: Vec<String> = correct[..1].to_vec();
    answers.push(answer("Done.", json!({}), "finish", json!({})));
    let (store, task) = run(tmp.path(), answers).await;
    let pointer = format!("/inventory/{shelf}");
    let record = store.task(&task).await.unwrap();
    let why = provenance(store.as_ref(), &record, &pointer, false)
        .await
        .unwrap();
    assert_eq!(why.current, Some(json!(item)));
    assert_eq!(why.writes.len(), 1, "{why:#?}");
    assert_eq!(why.writes[0].step, 1);
    assert_eq!(why.writes[0].value, Some(json!(item)));
    assert!(
        why.writes[0]
            .observation
            .as_deref()
            .unwrap()
            .contains(&item)
    );
    assert!(
        matches!(&why.writes[0].author, Author::Model { model } if model.starts_with("scripted"))
    );

    // A write through the service: the next answer names its key, and every past value stays.
    let patch = json!({"inventory": {shelf.clone(): "item_999999"}, "token": SECRET});
    write_state(
        &store,
        &StateWrite {
            task: &task,
            if_match: record.version,
            patch: &patch,
            author: "key_ops_1",
            checked: None,
        },
    )
    .await
    .unwrap();
    let record = store.task(&task).await.unwrap();
    let why = provenance(store.as_ref(), &record, &pointer, false)
        .await
        .unwrap();
    assert_eq!(why.current, Some(json!("item_999999")));
    assert_eq!(why.writes.len(), 1);
    assert_eq!(
        why.writes[0].author,
        Author::ApiKey {
            key: "key_ops_1".into()
        }
    );
    assert!(
        !why.writes[0].patch.to_string().contains(SECRET),
        "{}",
        why.writes[0].patch
    );
    let all = provenance(store.as_ref(), &record, &pointer, true)
        .await
        .unwrap();
    assert_eq!(
        all.writes.iter().map(|w| w.step).collect::<Vec<_>>(),
        vec![record.version, 1]
    );
    let token = provenance(store.as_ref(), &record, "/token", true)
        .await
        .unwrap();
    assert!(!serde_json::to_string(&token).unwrap().contains(SECRET));
    assert!(
        provenance(store.as_ref(), &record, "inventory", false)
            .await
            .is_err()
    );
}

/// A board member recalls its own history only as its reader sees it: nothing of the board
/// outside its reads (never in its journal), and no write-only value of the board.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_members_recall_stays_inside_its_reads() {
    use skillstate_core::board::{BoardScope, BoardTable};
    use skillstate_core::skill::SkillSettings;
    use skillstate_core::{ContextStrategy, SkillDefinition};
    use skillstate_runtime::start_board_task;
    use skillstate_store::NewBoard;
    use skillstate_tools::UserRequest;

    let tmp = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(tmp.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let board = store
        .create_board(NewBoard {
            name: "shared".into(),
            schema: json!({
                "type": "object",
                "properties": {
                    "vault": {"type": "object", "properties": {"code": {"type": "string", "writeOnly": true}}}
                }
            }),
            initial_state: json!({"pub": {}, "vault": {}, "hidden": {"x": "walrus-in-hiding"}}),
            tenant: None,
        })
        .await
        .unwrap();
    let mut settings = SkillSettings::default();
    settings.run.max_steps = 10;
    settings.tools.allow = vec!["recall".into()];
    settings.board = Some(
        BoardScope::parse(&BoardTable {
            reads: vec!["/pub".into(), "/vault".into()],
            writes: vec!["/pub".into(), "/vault".into()],
        })
        .unwrap(),
    );
    let skill = Skill::from_definition(SkillDefinition {
        name: "member".into(),
        description: "A member that recalls".into(),
        metadata: None,
        procedure: "Write your part of the board, recall, then finish.".into(),
        schema: json!({"type": "object"}),
        initial_state: json!({}),
        settings,
        migrations: Vec::new(),
    })
    .unwrap();
    let code = "vault-code-5521-zz";
    let answers = vec![
        answer(
            "Write the note and the code.",
            json!({"board": {"pub": {"note": "penguin"}, "vault": {"code": code}}}),
            "recall",
            json!({"query": "walrus"}),
        ),
        answer(
            "Look for the code.",
            json!({}),
            "recall",
            json!({"query": code}),
        ),
        answer(
            "Look for the note.",
            json!({}),
            "recall",
            json!({"query": "penguin"}),
        ),
        answer("Done.", json!({}), "finish", json!({"result": "done"})),
    ];
    let model = scripted(answers);
    let mut env = UserRequest::new("Do your part.");
    let task = start_board_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
        &board.id,
        &board.name,
    )
    .await
    .unwrap();
    Runner::new(store.clone(), model, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    let walrus = store.observation(&task.id, 2).await.unwrap().unwrap();
    assert!(walrus.starts_with("Recall: no matches"), "{walrus}");
    let vault = store.observation(&task.id, 3).await.unwrap().unwrap();
    assert!(vault.starts_with("Recall: no matches"), "{vault}");
    assert!(!vault.contains(code), "{vault}");
    let note = store.observation(&task.id, 4).await.unwrap().unwrap();
    assert!(
        note.contains("[step 1 state] /board/pub/note = \"penguin\""),
        "{note}"
    );
    assert!(!note.contains(code), "{note}");
}
