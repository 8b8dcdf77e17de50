//! A board member through the service: its steps, answers and rebuilt prompts never show its
//! board's write-only values (the prompts mount the board, write-only values included), and a
//! fork of it made over HTTP is a member of the same board from its creation. On a SQLite file,
//! through the router.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_providers::{ModelProvider, ScriptedModel};
use skillstate_runtime::{NoProgress, Runner, rebuild_prompt};
use support::*;

const SECRET: &str = "deploy-token-7f3a9c21";

fn board_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "goal": {"type": "object", "properties": {"text": {"type": "string"}, "token": {"type": "string", "writeOnly": true}}},
            "change": {"type": "object", "properties": {"id": {"type": "integer"}}},
            "review": {"type": "object"}
        }
    })
}

fn answer(board: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": "r", "state_patch": {"board": board}, "action": {"tool": tool, "args": args}})
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_history_hides_its_boards_write_only_values_and_its_fork_joins_the_board() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let store = harness.store();
    let (acme, _) = harness.key("acme").await;
    let created = api
        .send(
            Call::post(
                "/v1/boards",
                &json!({
                    "name": "team",
                    "schema": board_schema(),
                    "initial_state": {"goal": {"text": "fix CI", "token": SECRET}, "change": {}, "review": {}}
                }),
            )
            .key(&acme),
        )
        .await;
    let board = created.expect(201).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A coder of the tenant, made a member of the board as `run --board` makes it.
    let task = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "bugfix-coder", "model": "oracle"}),
            )
            .key(&acme),
        )
        .await
        .expect(201)
        .json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    store.attach_task(&board, &task).await.unwrap();
    // A refused answer (the change is not an object), then one that writes the board and the
    // board's secret back into a rejected write of its own, then the end.
    let answers = vec![
        answer(
            json!({"change": 5, "goal": {"token": SECRET}}),
            "wait",
            json!({"seconds": 0.01}),
        ),
        answer(
            json!({"change": {"id": 1}}),
            "wait",
            json!({"seconds": 0.01}),
        ),
        answer(json!({}), "finish", json!({"result": "done"})),
    ];
    let model: Arc<dyn ModelProvider> =
        Arc::new(ScriptedModel::from_outputs("member.jsonl".into(), answers));
    let record = store.task(&task).await.unwrap();
    let mut env = world_of(&record).unwrap();
    Runner::new(store.clone(), model, env.as_mut(), &mut NoProgress)
        .run(&task)
        .await
        .unwrap();
    // The prompt the model got held the secret (its reads include /goal).
    let record = store.task(&task).await.unwrap();
    let (prompt, _) = rebuild_prompt(store.as_ref(), &record, 1, 1).await.unwrap();
    assert!(prompt.text().contains(SECRET));

    // Nothing the tenant's key reads of the task shows it.
    let task_base = format!("/v1/tasks/{task}");
    for path in [
        task_base.clone(),
        format!("{task_base}/steps"),
        format!("{task_base}/steps/1"),
        format!("{task_base}/steps/1/prompt"),
        format!("{task_base}/steps/1/prompt?attempt=1"),
        format!("{task_base}/steps/1/prompt?attempt=2"),
        format!("/v1/boards/{board}/state"),
    ] {
        let reply = api.send(Call::get(&path).key(&acme)).await;
        reply.expect(200);
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(!body.contains(SECRET), "{path}: {body}");
    }

    // A fork made over HTTP is a member of the board, after its parent.
    let fork = api
        .send(Call::post(format!("{task_base}/fork"), &json!({"step": 1})).key(&acme))
        .await;
    let fork = fork.expect(201).json()["id"].as_str().unwrap().to_owned();
    let shown = api
        .send(Call::get(format!("/v1/boards/{board}")).key(&acme))
        .await
        .json();
    assert_eq!(shown["members"], json!([task, fork]));
    assert_eq!(store.task_board(&fork).await.unwrap(), Some(board));
}
