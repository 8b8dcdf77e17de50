//! Talking to a task through the API: messages, approve / reject / reply, resume. Each route
//! posts to the task's inbox; the task then runs as a worker would run it (the runtime with the
//! oracle in the real warehouse environment) and the entry shows up where it belongs — the next
//! step's observation, the paused action's result — with the step it was delivered at. Through
//! the router in-process and over a real socket, on a SQLite file and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_server::{ApiError, ResolvedRequest, TaskFactory};
use skillstate_store::{NewTask, TaskRecord, TaskStatus};
use skillstate_tools::Environment;
use support::*;

/// The warehouse as `EnvFactory` builds it, with every environment tool needing approval.
struct Gated(EnvFactory);

#[async_trait]
impl TaskFactory for Gated {
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
        let (mut task, state) = self.0.prepare(request).await?;
        for spec in task.tools.iter_mut().filter(|s| s.source != "runtime") {
            spec.needs_approval = true;
        }
        Ok((task, state))
    }

    async fn fork_world(
        &self,
        task: &TaskRecord,
    ) -> Result<Option<Box<dyn Environment>>, ApiError> {
        self.0.fork_world(task).await
    }
}

fn gated(db: Db) -> Harness {
    Harness::with_factory(
        db,
        Arc::new(Gated(EnvFactory {
            skills_dir: skills_dir(),
        })),
    )
}

async fn create(api: &dyn Transport, key: &str) -> String {
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": 4}}),
            )
            .key(key),
        )
        .await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn messages(api: &dyn Transport, key: &str, id: &str) -> Vec<Value> {
    let list = api
        .send(Call::get(format!("/v1/tasks/{id}/messages")).key(key))
        .await;
    list.expect(200).json()["messages"]
        .as_array()
        .unwrap()
        .clone()
}

async fn observation(api: &dyn Transport, key: &str, id: &str, step: u64) -> String {
    let detail = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/{step}")).key(key))
        .await;
    detail.expect(200).json()["observation"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn messages_in_process_on_a_sqlite_file() {
    let harness = Harness::new(Db::sqlite().await).await;
    messages_reach_the_next_step(&harness, &InProcess(harness.router())).await;
}

#[tokio::test]
async fn messages_over_a_socket_on_postgres() {
    let Some(db) = Db::postgres().await.unwrap() else {
        return;
    };
    let harness = Harness::new(db).await;
    let socket = Socket::start(harness.state.clone()).await;
    messages_reach_the_next_step(&harness, &socket).await;
    socket.stop().await;
    harness.db.destroy().await;
}

async fn messages_reach_the_next_step(harness: &Harness, api: &dyn Transport) {
    let store = harness.store();
    let (key, key_id) = harness.key("acme").await;
    let (other, _) = harness.key("globex").await;
    let id = create(api, &key).await;

    // Malformed and misdirected messages change nothing.
    let empty = api
        .send(Call::post(format!("/v1/tasks/{id}/messages"), &json!({"text": "  "})).key(&key))
        .await;
    assert_eq!(empty.problem(422)["errors"][0]["pointer"], "/text");
    api.send(Call::post(format!("/v1/tasks/{id}/messages"), &json!({"txt": "hi"})).key(&key))
        .await
        .problem(422);
    let long = "x".repeat(64 * 1024 + 1);
    api.send(Call::post(format!("/v1/tasks/{id}/messages"), &json!({"text": long})).key(&key))
        .await
        .problem(422);
    api.send(Call::post(format!("/v1/tasks/{id}/messages"), &json!({"text": "hi"})).key(&other))
        .await
        .problem(404);
    api.send(Call::get(format!("/v1/tasks/{id}/messages")).key(&other))
        .await
        .problem(404);
    // Decisions need a pause; a running task has none.
    for (route, body) in [
        ("approve", json!({})),
        ("reject", json!({"reason": "no"})),
        ("reply", json!({"text": "yes"})),
    ] {
        let refused = api
            .send(Call::post(format!("/v1/tasks/{id}/{route}"), &body).key(&key))
            .await;
        assert!(
            refused.problem(409)["detail"]
                .as_str()
                .unwrap()
                .contains("not awaiting"),
            "{route}"
        );
    }
    assert!(messages(api, &key, &id).await.is_empty());

    // A message before the first step joins step 1's observation.
    let sent = api
        .send(
            Call::post(
                format!("/v1/tasks/{id}/messages"),
                &json!({"text": "Shelf 7 is blocked today"}),
            )
            .key(&key),
        )
        .await;
    let sent = sent.expect(202).json();
    assert_eq!(sent["kind"], "message");
    assert_eq!(sent["author"], key_id.as_str());
    assert_eq!(sent["delivered_step"], Value::Null);
    run_to_end(store.clone(), &id).await;
    let listed = messages(api, &key, &id).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["delivered_step"], 1);
    // A user's message comes first: it opens the observation, before the opening events.
    let shown = observation(api, &key, &id, 1).await;
    assert!(
        shown.starts_with("Message from the user: Shelf 7 is blocked today\n\n"),
        "{shown}"
    );
    let prompt = api
        .send(Call::get(format!("/v1/tasks/{id}/steps/1/prompt")).key(&key))
        .await;
    assert!(
        prompt.expect(200).json()["text"]
            .as_str()
            .unwrap()
            .contains("Message from the user: Shelf 7 is blocked today")
    );

    // A completed task: resume says what to do instead; a message reopens it.
    let done = store.task(&id).await.unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    let resume = api
        .send(Call::post(format!("/v1/tasks/{id}/resume"), &json!({})).key(&key))
        .await;
    assert!(
        resume.problem(409)["detail"]
            .as_str()
            .unwrap()
            .contains("send it a message")
    );
    api.send(
        Call::post(
            format!("/v1/tasks/{id}/messages"),
            &json!({"text": "one more check"}),
        )
        .key(&key),
    )
    .await
    .expect(202);
    let claimed = store
        .claim_task(&claim("worker"), 60_000, None)
        .await
        .unwrap()
        .expect("the message queued the task");
    assert_eq!(claimed.task_id, id);
    store
        .settle_claim(&id, "worker", &skillstate_store::Settle::Done, None)
        .await
        .unwrap();
    // Settled without delivering: still queued for the next worker.
    assert!(
        store
            .claim_task(&claim("worker-2"), 60_000, None)
            .await
            .unwrap()
            .is_some()
    );
    store.release_lease(&id, "worker-2").await.unwrap();
    run_to_end(store.clone(), &id).await;
    // The warehouse's episode is over, so the reopened task completes again at once; the
    // message opens the observation its next step would have started from (the last action's
    // result follows it).
    let reopened = done.version + 1;
    let shown = store.observation(&id, reopened).await.unwrap().unwrap();
    assert!(
        shown.starts_with("Message from the user: one more check\n\n"),
        "{shown}"
    );
    assert_eq!(store.task(&id).await.unwrap().status, TaskStatus::Completed);
    assert_eq!(
        messages(api, &key, &id).await[1]["delivered_step"],
        reopened
    );

    // A cancelled task takes no messages.
    let cancelled = create(api, &key).await;
    api.send(Call::post(format!("/v1/tasks/{cancelled}/cancel"), &json!({})).key(&key))
        .await
        .expect(200);
    api.send(
        Call::post(
            format!("/v1/tasks/{cancelled}/messages"),
            &json!({"text": "hi"}),
        )
        .key(&key),
    )
    .await
    .problem(409);
    api.send(Call::post(format!("/v1/tasks/{cancelled}/resume"), &json!({})).key(&key))
        .await
        .problem(409);
}

fn claim(token: &str) -> skillstate_store::LeaseClaim {
    skillstate_store::LeaseClaim {
        token: token.into(),
        holder: format!("test {token}"),
        process: "test".into(),
    }
}

#[tokio::test]
async fn decisions_in_process_on_a_sqlite_file() {
    let harness = gated(Db::sqlite().await);
    decisions_settle_the_pause(&harness, &InProcess(harness.router())).await;
}

#[tokio::test]
async fn decisions_over_a_socket_on_a_sqlite_file() {
    let harness = gated(Db::sqlite().await);
    let socket = Socket::start(harness.state.clone()).await;
    decisions_settle_the_pause(&harness, &socket).await;
    socket.stop().await;
}

async fn decisions_settle_the_pause(harness: &Harness, api: &dyn Transport) {
    let store = harness.store();
    let (key, _) = harness.key("acme").await;
    let id = create(api, &key).await;
    run_to_end(store.clone(), &id).await;
    let paused = store.task(&id).await.unwrap();
    assert_eq!(paused.status, TaskStatus::AwaitingApproval);
    assert_eq!(paused.version, 1);

    // Approve: once; a second decision waits behind it and is refused.
    let approved = api
        .send(Call::post(format!("/v1/tasks/{id}/approve"), &json!({})).key(&key))
        .await;
    assert_eq!(approved.expect(202).json()["kind"], "approve");
    let again = api
        .send(Call::post(format!("/v1/tasks/{id}/reject"), &json!({"reason": "no"})).key(&key))
        .await;
    assert!(
        again.problem(409)["detail"]
            .as_str()
            .unwrap()
            .contains("already waiting")
    );
    api.send(Call::post(format!("/v1/tasks/{id}/reply"), &json!({"text": "ok"})).key(&key))
        .await
        .problem(409);
    run_to_end(store.clone(), &id).await;
    let intents = store.intents(&id).await.unwrap();
    assert!(intents[0].done, "the approved action ran");
    let second = store.task(&id).await.unwrap();
    assert_eq!(
        (second.status, second.version),
        (TaskStatus::AwaitingApproval, 2),
        "the next action waits for its own approval"
    );
    assert_eq!(messages(api, &key, &id).await[0]["delivered_step"], 2);

    // Reject: the action never runs; the reason is the next observation.
    api.send(
        Call::post(
            format!("/v1/tasks/{id}/reject"),
            &json!({"reason": "shelf 7 is blocked"}),
        )
        .key(&key),
    )
    .await
    .expect(202);
    run_to_end(store.clone(), &id).await;
    let refused = observation(api, &key, &id, 3).await;
    assert!(
        refused.starts_with("A human rejected `") && refused.contains(": shelf 7 is blocked\n"),
        "{refused}"
    );
    let intents = store.intents(&id).await.unwrap();
    assert_eq!(intents[1].ok, Some(false));

    // A message instead of a decision refuses the action and shows the message.
    api.send(
        Call::post(
            format!("/v1/tasks/{id}/messages"),
            &json!({"text": "wait for the audit"}),
        )
        .key(&key),
    )
    .await
    .expect(202);
    run_to_end(store.clone(), &id).await;
    let shown = observation(api, &key, &id, 4).await;
    assert!(
        shown.starts_with("Message from the user: wait for the audit\n\n")
            && shown.contains("was not run"),
        "{shown}"
    );
    let listed = messages(api, &key, &id).await;
    assert_eq!(
        listed
            .iter()
            .map(|m| m["delivered_step"].clone())
            .collect::<Vec<_>>(),
        vec![json!(2), json!(3), json!(4)]
    );
}

#[tokio::test]
async fn resume_queues_a_task_a_retry_can_continue() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let store = harness.store();
    let (key, _) = harness.key("acme").await;
    let id = create(&api, &key).await;
    // Claimed and settled (nothing queued), then failed for a reason a retry can fix.
    let first = store.claim_task(&claim("w"), 60_000, None).await.unwrap();
    assert_eq!(first.map(|c| c.task_id), Some(id.clone()));
    store
        .settle_claim(&id, "w", &skillstate_store::Settle::Done, None)
        .await
        .unwrap();
    store
        .set_status(
            &id,
            TaskStatus::Failed,
            Some(&json!({"reason": "provider", "message": "connection refused"})),
        )
        .await
        .unwrap();
    assert!(
        store
            .claim_task(&claim("w2"), 60_000, None)
            .await
            .unwrap()
            .is_none()
    );
    let resumed = api
        .send(Call::post(format!("/v1/tasks/{id}/resume"), &json!({})).key(&key))
        .await;
    assert_eq!(resumed.expect(202).json()["id"], id.as_str());
    let claimed = store.claim_task(&claim("w3"), 60_000, None).await.unwrap();
    assert_eq!(claimed.map(|c| c.task_id), Some(id.clone()));
    store.release_lease(&id, "w3").await.unwrap();

    // A failure a retry cannot change points to fork.
    store
        .set_status(
            &id,
            TaskStatus::Failed,
            Some(&json!({"reason": "max_steps", "message": "stopped"})),
        )
        .await
        .unwrap();
    let refused = api
        .send(Call::post(format!("/v1/tasks/{id}/resume"), &json!({})).key(&key))
        .await;
    assert!(
        refused.problem(409)["detail"]
            .as_str()
            .unwrap()
            .contains("fork")
    );
}
