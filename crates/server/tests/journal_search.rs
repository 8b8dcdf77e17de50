//! Searching a task's journal over HTTP (`GET /v1/tasks/{id}/journal?q=…`): real warehouse runs
//! (the oracle) on a SQLite file and on PostgreSQL, asked through the router in-process and over
//! a real socket on 127.0.0.1; a task whose schema has write-only values, run by a scripted
//! model, whose secrets no search shows.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::{ContextStrategy, Skill, SkillDefinition};
use skillstate_providers::ScriptedModel;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, prepare_task};
use skillstate_server::{
    ApiError, AppState, FieldError, ResolvedRequest, ServerConfig, ServicePolicy, TaskFactory,
    check_initial_state, hash_secret, new_key_secret,
};
use skillstate_store::{NewKey, NewTask, TaskStatus};
use skillstate_tools::UserRequest;
use support::*;

async fn create(api: &dyn Transport, key: &str, body: Value) -> String {
    let created = api.send(Call::post("/v1/tasks", &body).key(key)).await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn get(api: &dyn Transport, key: &str, path: &str) -> Value {
    api.send(Call::get(path).key(key)).await.expect(200).json()
}

/// `text` made safe for a query string.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Every hit of a search, page by page (`limit` a page), following `next_cursor`; and how
/// many pages it took.
async fn all_pages(
    api: &dyn Transport,
    key: &str,
    search: &str,
    limit: u32,
) -> (Vec<Value>, usize) {
    let mut hits = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("{search}&limit={limit}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={}", encoded(cursor)));
        }
        let page = get(api, key, &path).await;
        pages += 1;
        let list = page["hits"].as_array().unwrap();
        assert!(list.len() <= limit as usize, "{page}");
        hits.extend(list.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 200, "the cursor does not end");
    }
    (hits, pages)
}

fn steps_of(hits: &[Value]) -> Vec<u64> {
    hits.iter().map(|h| h["step"].as_u64().unwrap()).collect()
}

/// A word of `text` with a digit in it (an order, an item, a shelf), as written.
fn numbered_word(text: &str) -> String {
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .find(|w| w.len() >= 3 && w.chars().any(|c| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no numbered word in {text}"))
        .to_owned()
}

/// The search routes of one backend, through `api`.
async fn search_a_warehouse_run(harness: &Harness, api: &dyn Transport) {
    let (key, _) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let id = create(
        api,
        &key,
        json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 11, "events": 8}}),
    )
    .await;
    run_to_end(harness.store(), &id).await;
    let task = get(api, &key, &format!("/v1/tasks/{id}")).await;
    let version = task["version"].as_u64().unwrap();
    assert!(version >= 8, "{task}");

    // A committed step's observation is found by a word of it, with its step number.
    let step = version / 2;
    let detail = get(api, &key, &format!("/v1/tasks/{id}/steps/{step}")).await;
    let observation = detail["observation"].as_str().unwrap();
    let word = numbered_word(observation);
    let found = get(
        api,
        &key,
        &format!(
            "/v1/tasks/{id}/journal?q={}&kind=observation",
            encoded(&word)
        ),
    )
    .await;
    let hits = found["hits"].as_array().unwrap();
    let hit = hits
        .iter()
        .find(|h| h["step"] == step)
        .unwrap_or_else(|| panic!("step {step}'s observation is not found by `{word}`: {found}"));
    assert_eq!(hit["kind"], "observation");
    assert!(hit["pointer"].is_null());
    assert!(
        hit["text"].as_str().unwrap().contains(&word),
        "{hit} lacks {word}"
    );
    assert!(observation.starts_with(hit["text"].as_str().unwrap().trim_end_matches('…')));
    for hit in hits {
        assert!(
            hit["text"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains(&word.to_lowercase()),
            "{hit} does not match {word}"
        );
    }

    // Every state write, newest first, page by page: the same hits as in one page, none twice.
    let search = format!("/v1/tasks/{id}/journal?pointer=");
    let whole = get(api, &key, &format!("{search}&limit=50")).await;
    let whole = whole["hits"].as_array().unwrap().clone();
    assert!(whole.len() >= 4, "{whole:?}");
    assert!(whole.iter().all(|h| {
        h["kind"] == "state"
            && h["pointer"].is_string()
            && h["text"]
                .as_str()
                .unwrap()
                .starts_with(h["pointer"].as_str().unwrap())
    }));
    let steps = steps_of(&whole);
    assert!(steps.windows(2).all(|w| w[0] >= w[1]), "{steps:?}");
    assert!(steps[0] > *steps.last().unwrap(), "{steps:?}");
    if whole.len() < 50 {
        let (paged, pages) = all_pages(api, &key, &search, 3).await;
        assert!(pages >= 2, "{pages} pages");
        assert_eq!(paged, whole);
    }
    // Oldest first: the same hits the other way round.
    let (oldest, _) = all_pages(api, &key, &format!("{search}&order=oldest"), 4).await;
    let mut reversed = whole.clone();
    reversed.reverse();
    assert_eq!(steps_of(&oldest), steps_of(&reversed));
    // A step range.
    let ranged = get(
        api,
        &key,
        &format!("{search}&from_step=2&to_step=3&limit=50"),
    )
    .await;
    let ranged = steps_of(ranged["hits"].as_array().unwrap());
    assert!(!ranged.is_empty() && ranged.iter().all(|s| (2..=3).contains(s)));
    // A cursor of one order is refused in the other, naming it.
    let first = get(api, &key, &format!("{search}&limit=1")).await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let crossed = api
        .send(Call::get(format!("{search}&order=oldest&cursor={}", encoded(cursor))).key(&key))
        .await;
    assert_eq!(crossed.problem(422)["errors"][0]["pointer"], "/cursor");

    // Bad parameters: each a 422 naming it.
    for (query, parameter) in [
        ("", "/q"),
        ("q=%20", "/q"),
        ("q=a&limit=51", "/limit"),
        ("q=a&limit=x", "/limit"),
        ("q=a&kind=thought", "/kind"),
        ("pointer=inventory", "/pointer"),
        ("q=a&from_step=9&to_step=2", "/from_step"),
        ("q=a&order=sideways", "/order"),
        ("q=a&cursor=nope", "/cursor"),
        ("q=a&sort=asc", "/sort"),
    ] {
        let refused = api
            .send(Call::get(format!("/v1/tasks/{id}/journal?{query}")).key(&key))
            .await;
        let problem = refused.problem(422);
        assert_eq!(
            problem["errors"][0]["pointer"], parameter,
            "{query}: {problem}"
        );
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains(parameter.trim_start_matches('/')),
            "{problem}"
        );
    }

    // Another tenant's task is a 404, as a missing one is; no key is a 401.
    let elsewhere = api
        .send(Call::get(format!("/v1/tasks/{id}/journal?q={}", encoded(&word))).key(&other))
        .await;
    let elsewhere = elsewhere.problem(404);
    let missing = api
        .send(
            Call::get(format!(
                "/v1/tasks/{}/journal?q={}",
                uuid_like(),
                encoded(&word)
            ))
            .key(&other),
        )
        .await;
    let missing = missing.problem(404);
    assert_eq!(elsewhere["type"], missing["type"]);
    assert_eq!(elsewhere["title"], missing["title"]);
    api.send(Call::get(format!("/v1/tasks/{id}/journal?q=a")))
        .await
        .problem(401);
    // A key of the same tenant limited to board pointers is refused, as on every task route.
    let limited = new_key_secret();
    harness
        .store()
        .create_key(&NewKey {
            tenant: "acme".into(),
            label: "boards only".into(),
            secret_hash: hash_secret(&limited),
            scopes: Some(json!({"board": {"reads": ["/plan"], "writes": []}})),
        })
        .await
        .unwrap();
    for path in [
        format!("/v1/tasks/{id}/journal?q={}", encoded(&word)),
        format!("/v1/tasks/{id}/state/provenance?pointer=/inventory"),
    ] {
        api.send(Call::get(path).key(&limited)).await.problem(403);
    }
}

/// A task id no task has.
fn uuid_like() -> String {
    "01900000-0000-7000-8000-000000000000".to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_on_sqlite_through_the_router_and_a_socket() {
    let harness = Harness::new(Db::sqlite().await).await;
    search_a_warehouse_run(&harness, &InProcess(harness.router())).await;
    let api = Socket::start(harness.state.clone()).await;
    search_a_warehouse_run(&harness, &api).await;
    api.stop().await;
    harness.db.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_on_postgres_over_a_socket() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let api = Socket::start(harness.state.clone()).await;
    search_a_warehouse_run(&harness, &api).await;
    api.stop().await;
    harness.db.destroy().await;
}

// ---------------------------------------------------------------- write-only values

/// The password the user gives in the opening request.
const PASSWORD: &str = "pw-Kq7Zt2Vx";
/// The token the model writes to a write-only location and quotes in its reasoning.
const TOKEN: &str = "tok-Zx5Wn7Gk";

fn vault_skill() -> Skill {
    Skill::from_definition(SkillDefinition {
        name: "vault".into(),
        description: "Keep credentials".into(),
        metadata: None,
        procedure: "Store the credentials the user gives, then finish.".into(),
        schema: json!({
            "type": "object",
            "properties": {
                "creds": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "password": {"type": "string", "writeOnly": true},
                        "token": {"type": "string", "writeOnly": true}
                    }
                },
                "notes": {"type": "string"}
            }
        }),
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
        let skill = vault_skill();
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
        Ok((prepare_task(&skill, &mut env, &options)?, initial))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_only_values_are_never_found_nor_shown() {
    let db = Db::sqlite().await;
    let store = db.store.clone();
    let state = AppState::with_config(
        store.clone(),
        Arc::new(VaultFactory),
        ServerConfig::default(),
    )
    .with_policy(ServicePolicy::default().with_models(["scripted".to_owned()]));
    let harness = Harness {
        db,
        state: state.clone(),
    };
    let (key, _) = harness.key("acme").await;
    let api = Socket::start(state).await;
    let id = create(
        &api,
        &key,
        json!({"skill": "vault", "model": "scripted",
               "input": format!("Keep the password {PASSWORD} for ada-lovelace.")}),
    )
    .await;
    let answer = json!({
        "reasoning": format!("ada-lovelace gets token {TOKEN}"),
        "state_patch": {"creds": {"user": "ada-lovelace", "password": PASSWORD, "token": TOKEN},
                        "notes": "saved for ada-lovelace"},
        "action": {"tool": "finish", "args": {"result": "stored"}}
    });
    let model = Arc::new(ScriptedModel::from_outputs(
        "vault.jsonl".into(),
        vec![answer.to_string()],
    ));
    let mut env = UserRequest::new("");
    let mut observer = NoProgress;
    let outcome = Runner::new(store.clone(), model, &mut env, &mut observer)
        .run(&id)
        .await
        .unwrap();
    assert_eq!(outcome.status, TaskStatus::Completed);

    // The secrets themselves find nothing: every entry that holds one matched only through it.
    for secret in [PASSWORD, TOKEN] {
        let found = get(
            &api,
            &key,
            &format!("/v1/tasks/{id}/journal?q={}", encoded(secret)),
        )
        .await;
        assert_eq!(found["hits"], json!([]), "{secret}: {found}");
    }
    // Entries found by other words show every secret as `[redacted]`.
    let found = api
        .send(Call::get(format!("/v1/tasks/{id}/journal?q=ada-lovelace&limit=50")).key(&key))
        .await;
    let text = String::from_utf8_lossy(&found.body).into_owned();
    assert!(
        !text.contains(PASSWORD) && !text.contains(TOKEN),
        "a search leaks a secret: {text}"
    );
    let hits = found.expect(200).json()["hits"].as_array().unwrap().clone();
    let kinds: Vec<&str> = hits.iter().map(|h| h["kind"].as_str().unwrap()).collect();
    for kind in ["observation", "reasoning", "state"] {
        assert!(kinds.contains(&kind), "no {kind} hit: {text}");
    }
    assert!(text.contains("[redacted]"), "{text}");
    // The writes under /creds: the user's name, never a write-only location.
    let writes = get(
        &api,
        &key,
        &format!("/v1/tasks/{id}/journal?pointer=/creds"),
    )
    .await;
    let pointers: Vec<&str> = writes["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["pointer"].as_str().unwrap())
        .collect();
    assert_eq!(pointers, vec!["/creds/user"], "{writes}");
    // Where the password came from: the step, never the value.
    let found = api
        .send(
            Call::get(format!(
                "/v1/tasks/{id}/state/provenance?pointer=/creds&all=true"
            ))
            .key(&key),
        )
        .await;
    let text = String::from_utf8_lossy(&found.body).into_owned();
    assert!(
        !text.contains(PASSWORD) && !text.contains(TOKEN),
        "provenance leaks a secret: {text}"
    );
    let found = found.expect(200).json();
    assert_eq!(found["current"]["password"], "[redacted]", "{found}");
    assert_eq!(found["writes"][0]["step"], 1);
    assert_eq!(found["writes"][0]["patch"]["creds"]["token"], "[redacted]");
    api.stop().await;
    harness.db.destroy().await;
}
