//! A task moved to another version of its skill, on a real SQLite file and on the local
//! PostgreSQL server: paused for approval, a migration that breaks the new schema is refused
//! with pointers (nothing changes), a dry run writes nothing, and the upgrade with a migration
//! that renames a field is scheduled; approved, the action runs once under the version that
//! proposed it, the upgrade is the next step of the journal, and the task completes under the
//! new procedure and state shape; its whole journal replays with every hash, and prompts from
//! before and after the upgrade both rebuild byte-identical.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use skillstate_core::json::text_hash;
use skillstate_core::skill::{Migration, SkillSettings, SkillVersion};
use skillstate_core::validate::RejectionKind;
use skillstate_core::{ContextStrategy, Skill, SkillDefinition};
use skillstate_runtime::upgrade::{Upgrade, UpgradeError, upgrade_task};
use skillstate_runtime::{
    NoProgress, Runner, TaskOptions, presented_tools, rebuild_prompt, start_task, verify_journal,
};
use skillstate_store::prelude::*;
use skillstate_store::{PostgresStore, SqliteStore, Synchronous, TaskStatus};
use skillstate_tools::{
    CallContext, Environment, EnvironmentError, SideEffect, Tool, ToolError, ToolOutput, ToolSpec,
};

const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn notes_skill(version: &str, schema: Value, procedure: &str, migrations: Vec<Migration>) -> Skill {
    let mut settings = SkillSettings {
        version: Some(SkillVersion::parse(version).unwrap()),
        ..Default::default()
    };
    settings.tools.allow = vec!["office".into()];
    let initial = if schema["required"][0] == "notes" {
        json!({"notes": []})
    } else {
        json!({"entries": [], "owner": "ops"})
    };
    Skill::from_definition(SkillDefinition {
        name: "notes".into(),
        description: "Keep notes".into(),
        metadata: None,
        procedure: procedure.into(),
        schema,
        initial_state: initial,
        settings,
        migrations,
    })
    .unwrap()
}

fn v1() -> Skill {
    notes_skill(
        "1.0.0",
        json!({"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}}, "required": ["notes"], "additionalProperties": false}),
        "Write down what the user says in notes, file them, then finish.",
        Vec::new(),
    )
}

/// 2.0.0 calls the notes `entries` and adds a read-only `owner`.
fn v2_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "entries": {"type": "array", "items": {"type": "string"}},
            "owner": {"type": "string", "readOnly": true}
        },
        "required": ["entries", "owner"],
        "additionalProperties": false
    })
}

fn v2(migration: Value) -> Skill {
    notes_skill(
        "2.0.0",
        v2_schema(),
        "Keep what the user says in entries, then finish.",
        vec![Migration {
            from: SkillVersion::parse("1.0.0").unwrap(),
            patch: migration,
        }],
    )
}

fn rename() -> Value {
    json!([
        {"op": "move", "from": "/notes", "path": "/entries"},
        {"op": "add", "path": "/owner", "value": "ops"}
    ])
}

fn answer(patch: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": "r", "state_patch": patch, "action": {"tool": tool, "args": args}})
        .to_string()
}

struct Desk {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for Desk {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, _args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success("filed"))
    }
}

struct Office {
    tools: Vec<Arc<dyn Tool>>,
}

impl Office {
    fn new() -> Self {
        let spec = ToolSpec {
            name: "file".into(),
            description: "File the notes".into(),
            input_schema: json!({"type": "object"}),
            side_effect: SideEffect::Effectful,
            source: "office".into(),
            needs_approval: true,
        };
        Self {
            tools: vec![Arc::new(Desk { spec })],
        }
    }
}

impl Environment for Office {
    fn kind(&self) -> &str {
        "office"
    }
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }
    fn opening_observation(&mut self) -> String {
        "Take notes.".into()
    }
    fn after_action(&mut self) -> Option<String> {
        None
    }
    fn episode_over(&self) -> bool {
        false
    }
    fn outcome(&self) -> Value {
        Value::Null
    }
    fn checkpoint(&self) -> Value {
        Value::Null
    }
    fn restore(&mut self, _: &Value) -> Result<(), EnvironmentError> {
        Ok(())
    }
}

async fn stores(dir: &std::path::Path) -> Vec<(&'static str, Arc<dyn Store>)> {
    let path = dir.join("skillstate.db");
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap(),
    );
    let mut stores = vec![("sqlite", sqlite)];
    match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => {
            skip::skip_part(
                "the PostgreSQL half of the upgrade test",
                "SKILLSTATE_TEST_POSTGRES_URL is `off`",
                "unset SKILLSTATE_TEST_POSTGRES_URL (or point it at a server)",
            );
        }
        found => {
            let url = found
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| POSTGRES_URL.to_owned());
            let schema = format!("upgrade_{}", uuid::Uuid::now_v7().simple());
            let postgres: Arc<dyn Store> =
                Arc::new(PostgresStore::open_in_schema(&url, &schema).await.unwrap());
            stores.push(("postgres", postgres));
        }
    }
    stores
}

fn upgrade<'a>(task: &'a str, to: &'a Skill, tools: &'a [ToolSpec], apply: bool) -> Upgrade<'a> {
    Upgrade {
        task,
        to,
        tools,
        author: "operator",
        apply,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_moves_to_a_new_version_as_a_step_and_goes_on_under_it() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store) in stores(dir.path()).await {
        let mut env = Office::new();
        let skill = v1();
        let options = TaskOptions::new("scripted:test.jsonl", ContextStrategy::State);
        let task = start_task(store.as_ref(), &skill, &mut env, &options)
            .await
            .unwrap()
            .id;
        let answers = vec![
            answer(json!({"notes": ["milk"]}), "file", json!({})),
            // After the upgrade: the new shape.
            answer(
                json!([{"op": "add", "path": "/entries/-", "value": "eggs"}]),
                "finish",
                json!({"result": "kept"}),
            ),
        ];
        let paused = Runner::new(
            store.clone(),
            scripted(answers.clone()),
            &mut env,
            &mut NoProgress,
        )
        .run(&task)
        .await
        .unwrap();
        assert_eq!(paused.status, TaskStatus::AwaitingApproval, "{backend}");
        let before = store.task(&task).await.unwrap();
        let journal_before = store.journal(&task).await.unwrap();

        let target = v2(rename());
        let tools = presented_tools(&target, &env).unwrap();
        // A migration that leaves the old field breaks the new schema: refused with its
        // pointer, nothing changes.
        let breaking = v2(json!({"owner": "ops"}));
        match upgrade_task(&store, &upgrade(&task, &breaking, &tools, true)).await {
            Err(UpgradeError::Refused { rejections, .. }) => {
                assert!(
                    rejections.iter().any(|r| r.kind == RejectionKind::Schema),
                    "{backend}: {rejections:?}"
                );
                assert!(
                    rejections.iter().all(|r| r.pointer.is_empty()
                        || r.pointer.starts_with("/notes")
                        || r.pointer.starts_with("/entries")),
                    "{backend}: {rejections:?}"
                );
            }
            other => panic!("{backend}: {other:?}"),
        }
        assert_eq!(store.task(&task).await.unwrap(), before, "{backend}");
        assert_eq!(store.journal(&task).await.unwrap(), journal_before);

        // A dry run says what would happen and writes nothing.
        let planned = upgrade_task(&store, &upgrade(&task, &target, &tools, false))
            .await
            .unwrap();
        assert!(!planned.applied && planned.scheduled);
        assert_eq!(planned.step, 2);
        assert_eq!(planned.migrations, ["1.0.0"]);
        assert_eq!(store.task(&task).await.unwrap(), before, "{backend}");

        // Waiting for approval: scheduled, the action keeps the version that proposed it.
        let scheduled = upgrade_task(&store, &upgrade(&task, &target, &tools, true))
            .await
            .unwrap();
        assert!(!scheduled.applied && scheduled.scheduled);
        assert_eq!(scheduled.diff, planned.diff);
        let waiting = store.task(&task).await.unwrap();
        assert_eq!(
            (waiting.version, &waiting.state, &waiting.skill),
            (before.version, &before.state, &before.skill)
        );
        assert!(waiting.upgrade_to.is_some());

        // Approved: the action runs, then the upgrade is step 2, then the model goes on under
        // the new procedure and shape.
        let done = Runner::new(
            store.clone(),
            scripted(answers.clone()),
            &mut env,
            &mut NoProgress,
        )
        .approve(&task)
        .await
        .unwrap();
        assert_eq!(done.status, TaskStatus::Completed, "{backend}");
        let last = store.task(&task).await.unwrap();
        assert_eq!(last.version, 3);
        assert_eq!(last.skill, target.definition);
        assert_eq!(last.upgrade_to, None);
        assert_eq!(
            last.state,
            json!({"entries": ["milk", "eggs"], "owner": "ops"})
        );
        let journal = store.journal(&task).await.unwrap();
        assert_eq!(journal[1].step, 2);
        assert_eq!(journal[1].author.as_deref(), Some("operator"));
        let intents = store.intents(&task).await.unwrap();
        assert_eq!(intents.len(), 1, "the approved action ran once");
        assert!(intents[0].done && intents[0].step == 1);
        let versions = store.task_versions(&task).await.unwrap();
        assert_eq!(
            versions
                .iter()
                .map(|v| (v.from_step, v.version.clone()))
                .collect::<Vec<_>>(),
            [(0, Some("1.0.0".into())), (2, Some("2.0.0".into()))],
            "{backend}"
        );
        // The same version again is no upgrade.
        assert!(matches!(
            upgrade_task(&store, &upgrade(&task, &target, &tools, true)).await,
            Err(UpgradeError::Unchanged { .. })
        ));

        // The whole journal replays, and prompts on both sides of the boundary rebuild
        // byte-identical, each with the procedure it was rendered from.
        let check = verify_journal(store.as_ref(), &last).await.unwrap();
        assert_eq!(check.mismatch, None, "{backend}");
        assert_eq!(check.steps_checked, 3);
        for (step, procedure) in [(1, "in notes, file them"), (3, "in entries")] {
            let (prompt, recorded) = rebuild_prompt(store.as_ref(), &last, step, 1)
                .await
                .unwrap();
            assert_eq!(
                text_hash(&prompt.text()),
                recorded,
                "{backend} step {step}: {}\nobservation: {:?}",
                prompt.text(),
                store.observation(&task, step).await.unwrap()
            );
            assert!(prompt.text().contains(procedure), "{backend} step {step}");
        }
        let skills = store.skill_versions().await.unwrap();
        assert_eq!(skills.len(), 2, "{backend}");
        assert_eq!(
            skills
                .iter()
                .map(|s| (s.tasks, s.former_tasks))
                .collect::<Vec<_>>(),
            [(0, 1), (1, 0)],
            "{backend}"
        );
        store.release().await;
    }
}

/// A skill whose state holds a write-only token (1.0.0), then (2.0.0) a migration that moves
/// it where the new schema shows it, or to a place whose type it breaks.
fn vault(version: &str, schema: Value, migrations: Vec<Migration>) -> Skill {
    let mut settings = SkillSettings {
        version: Some(SkillVersion::parse(version).unwrap()),
        ..Default::default()
    };
    settings.tools.allow = vec!["office".into()];
    Skill::from_definition(SkillDefinition {
        name: "vault".into(),
        description: "Keep a token".into(),
        metadata: None,
        procedure: "Keep the token.".into(),
        schema,
        initial_state: json!({"token": "tok-9f8e7d6c5b4a3921"}),
        settings,
        migrations,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_never_shows_what_either_version_hides() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("skillstate.db");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap(),
    );
    let v1 = vault(
        "1.0.0",
        json!({"type": "object", "properties": {"token": {"type": "string", "writeOnly": true}}}),
        Vec::new(),
    );
    let mut env = Office::new();
    let options = TaskOptions::new("scripted:test.jsonl", ContextStrategy::State);
    let task = start_task(store.as_ref(), &v1, &mut env, &options)
        .await
        .unwrap()
        .id;
    let moved = |schema: Value| {
        vault(
            "2.0.0",
            schema,
            vec![Migration {
                from: SkillVersion::parse("1.0.0").unwrap(),
                patch: json!([{"op": "move", "from": "/token", "path": "/shown"}]),
            }],
        )
    };
    // 2.0.0 shows the value at a location that is not write-only: the report still hides it.
    let shows = moved(json!({"type": "object", "properties": {"shown": {"type": "string"}}}));
    let tools = presented_tools(&shows, &env).unwrap();
    let planned = upgrade_task(&store, &upgrade(&task, &shows, &tools, false))
        .await
        .unwrap();
    let diff = planned.diff.to_string();
    assert!(!diff.contains("tok-9f8e7d6c5b4a3921"), "{diff}");
    assert!(diff.contains("[redacted]"), "{diff}");
    // A refusal about the value does not quote it either.
    let breaks = moved(json!({"type": "object", "properties": {"shown": {"type": "integer"}}}));
    let tools = presented_tools(&breaks, &env).unwrap();
    match upgrade_task(&store, &upgrade(&task, &breaks, &tools, false)).await {
        Err(error @ UpgradeError::Refused { .. }) => {
            let text = format!("{error} {error:?}");
            assert!(!text.contains("tok-9f8e7d6c5b4a3921"), "{text}");
            assert!(text.contains("/shown"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // The journal keeps the real value: applied, the state holds it where 2.0.0 put it.
    let applied = upgrade_task(
        &store,
        &upgrade(&task, &shows, &tools_of(&shows, &env), true),
    )
    .await
    .unwrap();
    assert!(applied.applied);
    assert_eq!(
        store.task(&task).await.unwrap().state,
        json!({"shown": "tok-9f8e7d6c5b4a3921"})
    );
    store.release().await;
}

fn tools_of(skill: &Skill, env: &Office) -> Vec<ToolSpec> {
    presented_tools(skill, env).unwrap()
}
