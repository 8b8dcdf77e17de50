//! Secrets in state: values a state schema marks `"writeOnly": true` reach the model but leave
//! the service nowhere — not in the state, a patch, a step, a prompt, an event, a task view or a
//! problem. A real server on 127.0.0.1 over a SQLite file; the task is run in-process by the
//! runtime with a scripted model that records every prompt it receives.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill, SkillDefinition};
use skillstate_providers::{
    ModelProvider, ModelRequest, ModelResponse, ProviderError, ScriptedModel,
};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, prepare_task};
use skillstate_server::{
    ApiError, AppState, FieldError, ResolvedRequest, ServerConfig, ServicePolicy, TaskFactory,
    check_initial_state,
};
use skillstate_store::{EventQuery, NewTask, TaskStatus};
use skillstate_tools::UserRequest;
use support::*;

/// The initial state's password (also quoted by the user's request).
const INITIAL: &str = "init-pw-Kq7Zt2Vx";
/// The password written through the API.
const WRITTEN: &str = "api-pw-Hw3Lp9Ds";
/// A value a refused API write tried to put at a write-only location.
const REFUSED: &str = "bad-pin-Yt6Rc1Nm";
/// A value of a model answer that was rejected.
const REJECTED: &str = "rej-pin-Qa8Ue4Jb";
/// What the model's accepted patch writes into `tokens` (and then quotes in its result).
const TOKEN: &str = "model-token-Zx5Wn7Gk";
/// What it writes under a `patternProperties` key.
const VAULT: &str = "vault-key-Pm2Kd8Sv";

const SECRETS: [&str; 6] = [INITIAL, WRITTEN, REFUSED, REJECTED, TOKEN, VAULT];

fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "creds": {"$ref": "#/$defs/creds"},
            "tokens": {"type": "array", "items": {"type": "string", "writeOnly": true}},
            "vault": {
                "type": "object",
                "patternProperties": {"^key_": {"type": "string", "writeOnly": true}}
            },
            "notes": {"type": "string"}
        },
        "required": ["creds"],
        "$defs": {
            "creds": {
                "type": "object",
                "properties": {
                    "user": {"type": "string"},
                    "password": {"type": "string", "writeOnly": true},
                    "pin": {"type": "integer", "writeOnly": true}
                },
                "required": ["user"]
            }
        }
    })
}

fn skill() -> Skill {
    Skill::from_definition(SkillDefinition {
        name: "vault".into(),
        description: "Keep credentials".into(),
        metadata: None,
        procedure: "Store the credentials the user gives, then finish.".into(),
        schema: schema(),
        initial_state: json!({"creds": {"user": "nobody"}}),
        settings: Default::default(),
        migrations: Vec::new(),
    })
    .unwrap()
}

/// Builds `vault` tasks opened by the request's input, for the scripted model.
struct VaultFactory;

#[async_trait]
impl TaskFactory for VaultFactory {
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
        let skill = skill();
        if request.skill != "vault" {
            return Err(ApiError::invalid(
                "only `vault` here",
                vec![FieldError::new("field", "/skill", "only `vault` here")],
            ));
        }
        let initial = match &request.state {
            Some(state) => {
                check_initial_state(&skill, state)?;
                state.clone()
            }
            None => skill.definition.initial_state.clone(),
        };
        let mut env = UserRequest::new(request.input.clone().unwrap_or_default());
        let options = TaskOptions::new("scripted", ContextStrategy::State);
        let task = prepare_task(&skill, &mut env, &options)?;
        Ok((task, initial))
    }
}

/// A scripted model that keeps every prompt it is sent.
struct Recording {
    inner: ScriptedModel,
    prompts: Mutex<Vec<String>>,
}

#[async_trait]
impl ModelProvider for Recording {
    fn spec(&self) -> String {
        "scripted".into()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        self.prompts.lock().unwrap().push(request.prompt.text());
        self.inner.complete(request).await
    }
}

fn answer(patch: Value, tool: &str, args: Value) -> String {
    json!({"reasoning": "r", "state_patch": patch, "action": {"tool": tool, "args": args}})
        .to_string()
}

/// Every secret that `text` (a response, an event stream) contains.
fn leaked(text: &str) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| text.contains(s)).collect()
}

fn assert_clean(what: &str, reply: &Reply) {
    let text = String::from_utf8_lossy(&reply.body);
    assert!(
        leaked(&text).is_empty(),
        "{what} leaks {:?}: {text}",
        leaked(&text)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_only_values_reach_the_model_and_leave_the_service_nowhere() {
    let db = Db::sqlite().await;
    let store = db.store.clone();
    let config = ServerConfig {
        events_poll: Duration::from_millis(20),
        ..ServerConfig::default()
    };
    // The operator allows the test's scripted model by name.
    let state = AppState::with_config(store.clone(), Arc::new(VaultFactory), config)
        .with_policy(ServicePolicy::default().with_models(["scripted".to_owned()]));
    let harness = Harness {
        db,
        state: state.clone(),
    };
    let (key, _) = harness.key("acme").await;
    let api = Socket::start(state).await;

    // Created with a secret in the initial state (and in the user's words).
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({
                    "skill": "vault",
                    "model": "scripted",
                    "input": format!("Use the password {INITIAL} for ada."),
                    "state": {"creds": {"user": "ada", "password": INITIAL}}
                }),
            )
            .key(&key),
        )
        .await;
    created.expect(201);
    assert_clean("the create response", &created);
    let id = created.json()["task"]["id"].as_str().unwrap().to_owned();

    // An initial state that refuses a secret does not quote it back.
    let refused_create = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "vault", "model": "scripted", "state": {"creds": {"user": "x", "pin": REFUSED}}}),
            )
            .key(&key),
        )
        .await;
    let problem = refused_create.problem(422);
    assert_eq!(problem["errors"][0]["pointer"], "/state/creds/pin");
    assert_clean("a refused create", &refused_create);

    // Written through the API: the answer shows the state as GET does.
    let written = api
        .send(
            Call::new(axum::http::Method::PATCH, format!("/v1/tasks/{id}/state"))
                .key(&key)
                .header("if-match", "\"0\"")
                .raw(
                    "application/merge-patch+json",
                    serde_json::to_vec(&json!({"creds": {"password": WRITTEN}})).unwrap(),
                ),
        )
        .await;
    written.expect(200);
    assert_eq!(
        written.json(),
        json!({"creds": {"user": "ada", "password": "[redacted]"}})
    );
    // A refused write names the pointer, not the value.
    let refused = api
        .send(
            Call::new(axum::http::Method::PATCH, format!("/v1/tasks/{id}/state"))
                .key(&key)
                .header("if-match", "\"1\"")
                .raw(
                    "application/merge-patch+json",
                    serde_json::to_vec(&json!({"creds": {"pin": REFUSED}})).unwrap(),
                ),
        )
        .await;
    let problem = refused.problem(422);
    assert_eq!(problem["errors"][0]["pointer"], "/creds/pin");
    // Schema errors never quote the value: one at a write-only location says so.
    assert!(
        problem["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("the write-only value here (not shown)"),
        "{problem}"
    );
    assert_clean("a refused write", &refused);

    // The model: one rejected answer (a secret where a number belongs), then secrets written
    // under array items and a pattern property, and a result that quotes one.
    let model = Arc::new(Recording {
        inner: ScriptedModel::from_outputs(
            "vault.jsonl".into(),
            vec![
                answer(
                    json!({"tokens": [TOKEN], "creds": {"pin": REJECTED}}),
                    "finish",
                    json!({"result": "stored"}),
                ),
                answer(
                    json!({"tokens": [TOKEN], "vault": {"key_main": VAULT, "label": "main"}, "notes": "kept plain"}),
                    "finish",
                    json!({"result": format!("stored {TOKEN}")}),
                ),
            ],
        ),
        prompts: Mutex::new(Vec::new()),
    });
    let mut env = UserRequest::new("");
    let mut observer = NoProgress;
    let outcome = Runner::new(store.clone(), model.clone(), &mut env, &mut observer)
        .run(&id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);

    // What the model saw: the real values.
    let prompts = model.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 2);
    assert!(prompts[0].contains(WRITTEN), "{}", prompts[0]);
    assert!(prompts[0].contains(INITIAL), "the request it opened with");
    // The rejection it retries after names where and why, and (as every schema error) never
    // quotes the value.
    assert!(
        prompts[1].contains("is not of type \"integer\"") && !prompts[1].contains(REJECTED),
        "{}",
        prompts[1]
    );
    let stored = store.task(&id).await.unwrap();
    assert_eq!(stored.state["tokens"], json!([TOKEN]));
    assert_eq!(stored.state["vault"]["key_main"], VAULT);

    // What anyone else sees.
    let shown = api
        .send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await;
    shown.expect(200);
    assert_eq!(
        shown.json(),
        json!({
            "creds": {"user": "ada", "password": "[redacted]"},
            "tokens": ["[redacted]"],
            "vault": {"key_main": "[redacted]", "label": "main"},
            "notes": "kept plain"
        })
    );
    let mut paths = vec![
        format!("/v1/tasks/{id}"),
        "/v1/tasks".to_owned(),
        format!("/v1/tasks/{id}/steps"),
        format!("/v1/tasks/{id}/steps/1"),
        format!("/v1/tasks/{id}/steps/2"),
        format!("/v1/tasks/{id}/steps/2/prompt"),
        format!("/v1/tasks/{id}/steps/2/prompt?attempt=1"),
    ];
    for step in 0..=2 {
        paths.push(format!("/v1/tasks/{id}/steps/{step}/state"));
    }
    let mut replies = Vec::new();
    for path in &paths {
        let reply = api.send(Call::get(path.as_str()).key(&key)).await;
        reply.expect(200);
        assert_clean(path, &reply);
        replies.push(reply.json());
    }
    let task = &replies[0];
    assert_eq!(task["outcome"]["result"], "stored [redacted]", "{task}");
    let step1 = &replies[3];
    assert_eq!(
        step1["accepted"]["patch"],
        json!({"creds": {"password": "[redacted]"}})
    );
    let step2 = &replies[4];
    assert_eq!(
        step2["accepted"]["patch"]["vault"],
        json!({"key_main": "[redacted]", "label": "main"})
    );
    // A rejected answer keeps no patch; its text is cleaned of the value, and its error never
    // quoted it.
    let rejected = &step2["rejected"][0];
    assert!(
        rejected["output"]
            .as_str()
            .unwrap()
            .contains("\"pin\":\"[redacted]\"")
    );
    assert!(
        rejected["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("the write-only value here (not shown) breaks the schema's `type`"),
        "{rejected}"
    );
    assert!(
        step2["observation"]
            .as_str()
            .unwrap()
            .contains("[redacted]")
    );
    assert!(step2["accepted"]["state_hash"].is_null());
    assert!(step2["accepted"]["prompt_hash"].is_null());
    for prompt in [&replies[5], &replies[6]] {
        assert_eq!(prompt["identical"], true, "{prompt}");
        assert!(prompt["sha256"].is_null() && prompt["recorded_sha256"].is_null());
        assert!(prompt["text"].as_str().unwrap().contains("[redacted]"));
    }
    assert_eq!(
        replies[7]["creds"]["password"], "[redacted]",
        "the initial state"
    );

    // A fork answers with the new task, whose state is shown the same way.
    let fork = api
        .send(Call::post(format!("/v1/tasks/{id}/fork"), &json!({"step": 2})).key(&key))
        .await;
    fork.expect(201);
    assert_clean("the fork", &fork);
    let fork_id = fork.json()["id"].as_str().unwrap().to_owned();
    let fork_state = api
        .send(Call::get(format!("/v1/tasks/{fork_id}/state")).key(&key))
        .await;
    assert_clean("the fork's state", &fork_state);
    assert_eq!(fork_state.json()["tokens"], json!(["[redacted]"]));

    // Live events: every stored event of the task and of the tenant, read to the last one.
    for path in [format!("/v1/tasks/{id}/events"), "/v1/events".to_owned()] {
        let task = path.contains("/tasks/").then(|| id.clone());
        let expected = store
            .events_after(&EventQuery {
                tenant: Some("acme".into()),
                task,
                after: None,
                limit: 1000,
            })
            .await
            .unwrap()
            .len();
        assert!(expected >= 5, "{expected} events");
        let text = read_events(&api.base, &path, &key, expected).await;
        assert!(
            leaked(&text).is_empty(),
            "{path} leaks {:?}: {text}",
            leaked(&text)
        );
        assert!(text.contains("[redacted]"), "{text}");
    }
    api.stop().await;
    harness.db.destroy().await;
}

/// The raw text of an event stream, read until it has delivered `count` events.
async fn read_events(base: &str, path: &str, key: &str, count: usize) -> String {
    let client = reqwest::Client::builder().build().unwrap();
    let mut response = client
        .get(format!("{base}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while text.lines().filter(|l| l.starts_with("id:")).count() < count {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(bytes))) => text.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("the stream stopped before {count} events ({other:?}): {text}"),
        }
    }
    text
}
