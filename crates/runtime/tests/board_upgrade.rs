//! A board's schema changing (`board_upgrade::upgrade_board`) on a real SQLite file, with a
//! tenant's key limited to board pointers and an attached task as members: a rename with its
//! migration is applied as a write of its own, the state migrated and earlier versions read
//! with their schema; a schema that drops a pointer a member names is refused naming the
//! member and the pointer, and nothing changes; a migration that breaks the new schema is
//! refused with its pointers; a stale plan is refused. And a member running while the schema
//! changes has its answer checked against the schema in effect where it commits.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::sqlite_store;
use serde_json::{Value, json};
use skillstate_core::board::{BoardMember, BoardScope, BoardTable};
use skillstate_core::skill::SkillSettings;
use skillstate_core::{ContextStrategy, Skill, SkillDefinition, StateSchema};
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};
use skillstate_runtime::board_upgrade::{BoardUpgrade, BoardUpgradeError, upgrade_board};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_store::{
    BoardAuthor, BoardRecord, NewBoard, NewKey, Store, TaskStatus, board_schema_at, board_state_at,
};
use skillstate_tools::UserRequest;

fn old_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {
                "type": "object",
                "properties": {"goal": {"type": "string", "readOnly": true}},
                "additionalProperties": false
            },
            "frontend": {"type": "object"},
            "backend": {"type": "object"}
        },
        "additionalProperties": false
    })
}

/// `goal` renamed `objective`; a frontend's status is one of two.
fn renamed_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "plan": {
                "type": "object",
                "properties": {"objective": {"type": "string", "readOnly": true}},
                "required": ["objective"],
                "additionalProperties": false
            },
            "frontend": {
                "type": "object",
                "properties": {"status": {"enum": ["todo", "done"]}}
            },
            "backend": {"type": "object"}
        },
        "additionalProperties": false
    })
}

fn rename() -> Value {
    json!([{"op": "move", "from": "/plan/goal", "path": "/plan/objective"}])
}

fn compiled(schema: Value) -> StateSchema {
    StateSchema::compile(schema).unwrap()
}

fn agent_skill(reads: &[&str], writes: &[&str]) -> Skill {
    let mut settings = SkillSettings::default();
    settings.run.max_steps = 10;
    settings.run.max_retries = 3;
    settings.board = Some(
        BoardScope::parse(&BoardTable {
            reads: reads.iter().map(|s| (*s).to_owned()).collect(),
            writes: writes.iter().map(|s| (*s).to_owned()).collect(),
        })
        .unwrap(),
    );
    Skill::from_definition(SkillDefinition {
        name: "frontend".into(),
        description: "The frontend agent".into(),
        metadata: None,
        procedure: "Do your part of the plan on the board, then finish.".into(),
        schema: json!({"type": "object", "properties": {"done": {"type": "boolean"}}}),
        initial_state: json!({"done": false}),
        settings,
        migrations: Vec::new(),
    })
    .unwrap()
}

fn finish_with(board: Value) -> String {
    json!({
        "reasoning": "r",
        "state_patch": {"done": true, "board": board},
        "action": {"tool": "finish", "args": {"result": "ok"}}
    })
    .to_string()
}

/// A model that answers from a list and, before its first answer, may upgrade the board (the
/// operator changing the schema while the member thinks).
struct Member {
    answers: Vec<String>,
    calls: Mutex<usize>,
    store: Arc<dyn Store>,
    board: String,
    upgrade_first: bool,
}

#[async_trait]
impl ModelProvider for Member {
    fn spec(&self) -> String {
        "scripted:member".into()
    }
    async fn complete(&self, _request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let n = {
            let mut calls = self.calls.lock().unwrap();
            *calls += 1;
            *calls - 1
        };
        if n == 0 && self.upgrade_first {
            let schema = compiled(renamed_schema());
            let migration = rename();
            upgrade_board(
                self.store.as_ref(),
                &BoardUpgrade {
                    board: &self.board,
                    tenant: None,
                    schema: &schema,
                    migration: Some(&migration),
                    author: BoardAuthor::Cli,
                    planned_at: None,
                    apply: true,
                },
            )
            .await
            .unwrap();
        }
        Ok(ModelResponse {
            text: self.answers.get(n).cloned().unwrap_or_default(),
            usage: None,
            latency: Duration::ZERO,
            truncated: false,
        })
    }
}

/// A tenant's board with a limited key (reads /plan and /backend, writes /backend), a revoked
/// key and another tenant's key that name parts the board does not keep (neither is a
/// member), and a task attached (reads /plan and /frontend, writes /frontend) that has
/// written the board once.
async fn setup(
    dir: &std::path::Path,
    upgrade_first: bool,
) -> (Arc<dyn Store>, BoardRecord, String, String) {
    let (sqlite, _) = sqlite_store(dir).await;
    let store: Arc<dyn Store> = sqlite;
    let board = store
        .create_board(NewBoard {
            name: "release-42".into(),
            schema: old_schema(),
            initial_state: json!({"plan": {"goal": "ship v2"}, "frontend": {}, "backend": {}}),
            tenant: Some("acme".into()),
        })
        .await
        .unwrap();
    let key = |tenant: &str, hash: &str, reads: &[&str], writes: &[&str]| NewKey {
        tenant: tenant.into(),
        label: "test".into(),
        secret_hash: hash.repeat(64),
        scopes: Some(json!({"board": {"reads": reads, "writes": writes}})),
    };
    let limited = store
        .create_key(&key("acme", "a", &["/plan", "/backend"], &["/backend"]))
        .await
        .unwrap();
    let revoked = store
        .create_key(&key("acme", "b", &["/gone"], &[]))
        .await
        .unwrap();
    store.revoke_key(&revoked.id).await.unwrap();
    store
        .create_key(&key("other", "c", &["/gone"], &[]))
        .await
        .unwrap();

    let skill = agent_skill(&["/plan", "/frontend"], &["/frontend"]);
    let answers = if upgrade_first {
        // Valid under the schema it was shown, not under the one in effect where it commits.
        vec![
            finish_with(json!({"frontend": {"status": "shipped"}})),
            finish_with(json!({"frontend": {"status": "done"}})),
        ]
    } else {
        vec![finish_with(json!({"frontend": {"status": "todo"}}))]
    };
    let mut env = UserRequest::new("Build your part of v2.");
    let model = Arc::new(Member {
        answers,
        calls: Mutex::new(0),
        store: store.clone(),
        board: board.id.clone(),
        upgrade_first,
    });
    let task = start_task(
        store.as_ref(),
        &skill,
        &mut env,
        &TaskOptions::new(model.spec(), ContextStrategy::State),
    )
    .await
    .unwrap();
    store.attach_task(&board.id, &task.id).await.unwrap();
    let provider: Arc<dyn ModelProvider> = model;
    let outcome = Runner::new(store.clone(), provider, &mut env, &mut NoProgress)
        .run(&task.id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);
    (store, board, limited.id, task.id)
}

fn upgrade<'a>(
    schema: &'a StateSchema,
    migration: Option<&'a Value>,
    planned_at: Option<u64>,
    apply: bool,
) -> BoardUpgrade<'a> {
    BoardUpgrade {
        board: "release-42",
        tenant: Some("acme"),
        schema,
        migration,
        author: BoardAuthor::Cli,
        planned_at,
        apply,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_with_its_migration_is_a_write_and_old_versions_keep_their_schema() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board, key, task) = setup(dir.path(), false).await;
    let before = store.board(&board.id, None).await.unwrap();
    assert_eq!(before.version, 1);
    let schema = compiled(renamed_schema());
    let migration = rename();

    // The dry run writes nothing and names the members checked: the task, then the key.
    let planned = upgrade_board(
        store.as_ref(),
        &upgrade(&schema, Some(&migration), None, false),
    )
    .await
    .unwrap();
    assert!(!planned.applied);
    assert_eq!(
        planned.members,
        [
            BoardMember::Task(task.clone()),
            BoardMember::Key(key.clone())
        ]
    );
    assert_eq!((planned.planned_at, planned.version), (1, 2));
    assert_eq!(store.board(&board.id, None).await.unwrap(), before);

    let done = upgrade_board(
        store.as_ref(),
        &upgrade(&schema, Some(&migration), Some(1), true),
    )
    .await
    .unwrap();
    assert!(done.applied);
    assert_eq!(done.diff, planned.diff);
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.version, 2);
    assert_eq!(now.schema, renamed_schema());
    assert_eq!(
        now.state,
        json!({"plan": {"objective": "ship v2"}, "frontend": {"status": "todo"}, "backend": {}})
    );
    let write = &store.board_writes(&board.id, 2, 2).await.unwrap()[0];
    assert_eq!(write.author, BoardAuthor::Cli);
    // Every version with the schema in effect at it; every hash checked on the way.
    for (version, schema) in [(0, old_schema()), (1, old_schema()), (2, renamed_schema())] {
        assert_eq!(
            board_schema_at(store.as_ref(), &board.id, version)
                .await
                .unwrap(),
            schema
        );
    }
    let old = board_state_at(store.as_ref(), &board.id, 1).await.unwrap();
    assert_eq!(old["plan"], json!({"goal": "ship v2"}));
    assert_eq!(
        board_state_at(store.as_ref(), &board.id, 2).await.unwrap(),
        now.state
    );

    // Planned against version 1, but the board is at 2 now.
    match upgrade_board(store.as_ref(), &upgrade(&schema, None, Some(1), true)).await {
        Err(BoardUpgradeError::Stale {
            planned: 1,
            actual: 2,
            ..
        }) => {}
        other => panic!("a stale plan: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_drops_a_members_pointer_or_breaks_its_migration_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, board, key, task) = setup(dir.path(), false).await;
    let before = store.board(&board.id, None).await.unwrap();

    // Neither /frontend (the task's) nor /backend (the key's) is kept.
    let mut narrow = renamed_schema();
    let properties = narrow["properties"].as_object_mut().unwrap();
    properties.remove("frontend");
    properties.remove("backend");
    let schema = compiled(narrow);
    let migration = json!([
        {"op": "move", "from": "/plan/goal", "path": "/plan/objective"},
        {"op": "remove", "path": "/frontend"},
        {"op": "remove", "path": "/backend"}
    ]);
    match upgrade_board(
        store.as_ref(),
        &upgrade(&schema, Some(&migration), None, true),
    )
    .await
    {
        Err(error @ BoardUpgradeError::Refused { .. }) => {
            let BoardUpgradeError::Refused {
                rejections, scopes, ..
            } = &error
            else {
                unreachable!()
            };
            assert!(rejections.is_empty(), "{rejections:?}");
            let named: Vec<(BoardMember, &str, &str)> = scopes
                .iter()
                .map(|s| (s.member.clone(), s.list, s.pointer.as_str()))
                .collect();
            assert_eq!(
                named,
                [
                    (BoardMember::Task(task.clone()), "reads", "/frontend"),
                    (BoardMember::Task(task.clone()), "writes", "/frontend"),
                    (BoardMember::Key(key.clone()), "reads", "/backend"),
                    (BoardMember::Key(key.clone()), "writes", "/backend"),
                ]
            );
            let text = error.to_string();
            assert!(
                text.contains(&format!("API key {key}: its reads pointer \"/backend\"")),
                "{text}"
            );
        }
        other => panic!("a dropped pointer: {other:?}"),
    }

    // A migration that leaves the state breaking the new schema: every pointer.
    let schema = compiled(renamed_schema());
    let breaking =
        json!({"frontend": {"status": "shipped"}, "plan": {"goal": null, "objective": 7}});
    match upgrade_board(
        store.as_ref(),
        &upgrade(&schema, Some(&breaking), None, true),
    )
    .await
    {
        Err(BoardUpgradeError::Refused {
            rejections, scopes, ..
        }) => {
            assert!(scopes.is_empty(), "{scopes:?}");
            let mut pointers: Vec<&str> = rejections.iter().map(|r| r.pointer.as_str()).collect();
            pointers.sort_unstable();
            assert_eq!(
                pointers,
                ["/frontend/status", "/plan/objective"],
                "{rejections:?}"
            );
        }
        other => panic!("a breaking migration: {other:?}"),
    }

    // Nothing changed: state, version, schema and its history.
    assert_eq!(store.board(&board.id, None).await.unwrap(), before);
    assert_eq!(store.board_schemas(&board.id).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_running_while_the_schema_changes_commits_under_the_new_schema() {
    let dir = tempfile::tempdir().unwrap();
    // The upgrade lands while the member's first answer is computed on the old schema; that
    // answer (a status the new schema refuses) is rebased and refused, the next one commits.
    let (store, board, _, task) = setup(dir.path(), true).await;
    let now = store.board(&board.id, None).await.unwrap();
    assert_eq!(now.version, 2);
    assert_eq!(
        now.state,
        json!({"plan": {"objective": "ship v2"}, "frontend": {"status": "done"}, "backend": {}})
    );
    let writes = store.board_writes(&board.id, 1, 2).await.unwrap();
    assert_eq!(writes[0].author, BoardAuthor::Cli);
    assert!(matches!(&writes[1].author, BoardAuthor::Task { task: t, .. } if *t == task));
    let journal = store.journal(&task).await.unwrap();
    assert!(
        journal.iter().any(|entry| entry
            .errors
            .as_ref()
            .is_some_and(|e| e.to_string().contains("/board/frontend/status"))),
        "{journal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diff_shows_no_write_only_value_of_either_schema() {
    let dir = tempfile::tempdir().unwrap();
    let (sqlite, _) = sqlite_store(dir.path()).await;
    let store: Arc<dyn Store> = sqlite;
    let secret = "tok-4f9a-never-shown";
    store
        .create_board(NewBoard {
            name: "vault".into(),
            schema: json!({
                "type": "object",
                "properties": {"token": {"type": "string", "writeOnly": true}, "note": {"type": "string"}}
            }),
            initial_state: json!({"token": secret, "note": "n"}),
            tenant: None,
        })
        .await
        .unwrap();
    // The migration moves the token where the new schema shows values, and adds a new
    // write-only one.
    let schema = compiled(json!({
        "type": "object",
        "properties": {
            "shown": {"type": "string"},
            "pin": {"type": "string", "writeOnly": true},
            "note": {"type": "string"}
        }
    }));
    let migration = json!([
        {"op": "move", "from": "/token", "path": "/shown"},
        {"op": "add", "path": "/pin", "value": "pin-0042-hidden"}
    ]);
    let planned = upgrade_board(
        store.as_ref(),
        &BoardUpgrade {
            board: "vault",
            tenant: None,
            schema: &schema,
            migration: Some(&migration),
            author: BoardAuthor::Cli,
            planned_at: None,
            apply: false,
        },
    )
    .await
    .unwrap();
    let diff = planned.diff.to_string();
    assert!(
        !diff.contains(secret) && !diff.contains("pin-0042"),
        "{diff}"
    );
    assert!(
        diff.contains("[redacted]") && diff.contains("/shown"),
        "{diff}"
    );
}
