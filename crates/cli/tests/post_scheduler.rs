//! The admin-panel agent (`skills/post-scheduler`) end to end on the real binary and a real
//! SQLite file, with the scripted demo and with the oracle: the run pauses for confirmation
//! before saving, nothing reaches the panel until the user approves, a message moves the
//! publication by changing one field of the state, and afterwards the old date is nowhere in
//! the prompt.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::skillstate;
use serde_json::Value;
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous, TaskStatus};

const SKILL: &str = "skills/post-scheduler";
const DEMO: &str = "scripted:skills/post-scheduler/examples/demo.jsonl";
const REQUEST: &str =
    "Prepare a post about the launch of the new product and schedule it for October 15";
const MOVE: &str = "Let's move the publication to October 20";
const FIRST: &str = "2026-10-15T09:00:00Z";
const SECOND: &str = "2026-10-20T09:00:00Z";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `skillstate args…`, requiring success; returns stdout.
fn ok(db: &Path, args: &[&str]) -> String {
    let out = skillstate(db, args);
    assert!(
        out.status.success(),
        "skillstate {args:?} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

struct Seen {
    status: TaskStatus,
    version: u64,
    state: Value,
    /// The posts the agent saved or rescheduled, as the panel stores them.
    saved: Vec<Value>,
}

/// The task as stored, and the panel's posts from the environment checkpoint stored with it.
fn look(db: &Path, id: &str) -> Seen {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap();
        let task = store.task(id).await.unwrap();
        let checkpoint = task.env_checkpoint.clone().unwrap();
        let saved = checkpoint["posts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["touched"] == true)
            .cloned()
            .collect();
        Seen {
            status: task.status,
            version: task.version,
            state: task.state,
            saved,
        }
    })
}

fn task_id(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("task "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned()
}

/// The user's journey: request → pause → approve → scheduled for the 15th → message → pause →
/// approve → scheduled for the 20th. Returns the task id.
fn journey(db: &Path, model: &str) -> String {
    let run = ok(db, &["run", SKILL, "--model", model, "--input", REQUEST]);
    assert!(run.contains("awaiting_approval"), "{run}");
    let id = task_id(&run);

    // Paused before saving: the agent recorded what waits for confirmation; the panel holds
    // nothing new.
    let before = look(db, &id);
    assert_eq!(before.status, TaskStatus::AwaitingApproval);
    let pending = &before.state["pendingConfirmation"];
    assert_eq!(pending["action"], "save_post", "{}", before.state);
    assert_eq!(pending["payload"]["values"]["publishAt"], FIRST);
    assert_eq!(before.state["post"]["publishAt"], FIRST);
    assert_eq!(before.state["post"]["id"], Value::Null);
    assert!(
        before.saved.is_empty(),
        "saved before confirmation: {:?}",
        before.saved
    );
    let listed = ok(db, &["pending"]);
    assert!(
        listed.contains(&id) && listed.contains("approval of save_post"),
        "{listed}"
    );

    // Yes: the save runs once, the post is scheduled for the 15th.
    let approved = ok(db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    let first = look(db, &id);
    assert_eq!(first.saved.len(), 1, "{:?}", first.saved);
    let post = &first.saved[0];
    assert_eq!(post["status"], "scheduled");
    assert_eq!(post["publish_at"], FIRST);
    assert_eq!(first.state["post"]["id"], post["id"]);
    assert_eq!(first.state["post"]["status"], "scheduled");
    assert_eq!(first.state["pendingConfirmation"], Value::Null);
    let message_step = first.version + 1;

    // The follow-up: the message reopens the task; the agent changes publishAt and asks again.
    // Until the user confirms, the panel keeps the 15th.
    let said = ok(db, &["say", &id, MOVE]);
    assert!(said.contains("awaiting_approval"), "{said}");
    let asked = look(db, &id);
    assert_eq!(asked.state["post"]["publishAt"], SECOND);
    assert_eq!(
        asked.state["pendingConfirmation"]["action"],
        "schedule_post"
    );
    assert_eq!(
        asked.state["pendingConfirmation"]["payload"]["publishAt"],
        SECOND
    );
    assert_eq!(
        asked.saved[0]["publish_at"], FIRST,
        "moved without confirmation"
    );
    let listed = ok(db, &["pending"]);
    assert!(listed.contains("approval of schedule_post"), "{listed}");

    let approved = ok(db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    let second = look(db, &id);
    assert_eq!(second.saved.len(), 1, "the same post, not a new one");
    assert_eq!(second.saved[0]["publish_at"], SECOND);
    assert_eq!(second.saved[0]["id"], post["id"]);

    // One field of the state changed between the two confirmed states: post.publishAt.
    let mut expected = first.state.clone();
    expected["post"]["publishAt"] = Value::String(SECOND.into());
    assert_eq!(second.state, expected);

    // The step that read the message still saw the old date (in the state) …
    let reading = ok(
        db,
        &["show", &id, "--step", &message_step.to_string(), "--prompt"],
    );
    assert!(
        reading.contains(&format!("Message from the user: {MOVE}")),
        "{reading}"
    );
    assert!(reading.contains(FIRST), "{reading}");
    // … the prompt after the change holds only the new one: the old date exists nowhere in it.
    let last = ok(
        db,
        &[
            "show",
            &id,
            "--step",
            &second.version.to_string(),
            "--prompt",
        ],
    );
    assert!(last.contains(SECOND), "{last}");
    for old in ["2026-10-15", "10-15", "October 15", "Oct 15", "15 October"] {
        assert!(
            !last.contains(old),
            "`{old}` is still in the prompt:\n{last}"
        );
    }
    id
}

#[test]
fn the_scripted_demo_pauses_for_confirmation_and_takes_the_follow_up() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("demo.db");
    journey(&db, DEMO);
}

#[test]
fn the_oracle_does_the_same_and_a_refusal_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("oracle.db");
    let id = journey(&db, "oracle");

    // No: a rejected reschedule leaves the panel as it was; the agent reads the stored time back.
    let said = ok(&db, &["say", &id, "Make it October 22 instead"]);
    assert!(said.contains("awaiting_approval"), "{said}");
    assert_eq!(
        look(&db, &id).state["post"]["publishAt"],
        "2026-10-22T09:00:00Z"
    );
    let rejected = ok(&db, &["reject", &id, "--reason", "keep the date"]);
    assert!(rejected.contains("completed"), "{rejected}");
    let after = look(&db, &id);
    assert_eq!(after.saved[0]["publish_at"], SECOND);
    assert_eq!(after.state["post"]["publishAt"], SECOND);
    assert_eq!(after.state["pendingConfirmation"], Value::Null);

    // A message written while a save waits is not a confirmation: the save does not run.
    let said = ok(&db, &["say", &id, "Move it to October 25"]);
    assert!(said.contains("awaiting_approval"), "{said}");
    let written = ok(&db, &["say", &id, "yes"]);
    let seen = look(&db, &id);
    assert_eq!(
        seen.saved[0]["publish_at"], SECOND,
        "a written yes ran the action"
    );
    // The agent proposes it again, and it waits for an approval once more.
    assert!(written.contains("awaiting_approval"), "{written}");
    assert_eq!(seen.status, TaskStatus::AwaitingApproval);
    let approved = ok(&db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    assert_eq!(
        look(&db, &id).saved[0]["publish_at"],
        "2026-10-25T09:00:00Z"
    );
}

#[test]
fn a_built_in_environment_without_a_request_says_to_pass_one() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("none.db");
    let out = skillstate(&db, &["run", SKILL, "--model", "oracle"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("opens with the user's request: pass --input"),
        "{}",
        text(&out.stderr)
    );
    // Listing the tools needs no request; saving and scheduling need approval.
    let listed = ok(&db, &["tools", SKILL]);
    for tool in ["navigate", "fill_form", "save_post", "schedule_post"] {
        let line = listed.lines().find(|l| l.starts_with(tool)).unwrap();
        // TOOL  SOURCE  SIDE EFFECT  APPROVAL  INPUT SCHEMA
        let approval = line.split_whitespace().nth(3).unwrap();
        let expected = if tool.ends_with("_post") {
            "required"
        } else {
            "-"
        };
        assert_eq!(approval, expected, "{tool}: {line}");
    }
    // Other built-in environments still refuse --input.
    let out = skillstate(
        &db,
        &[
            "run",
            "skills/warehouse",
            "--model",
            "oracle",
            "--input",
            "x",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("drop --input"),
        "{}",
        text(&out.stderr)
    );
}

/// A running `skillstate serve` with embedded workers, killed when dropped.
struct Server {
    child: std::process::Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(db: &Path) -> Server {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(common::binary())
        .current_dir(common::repo_root())
        .env("SKILLSTATE_DB", db)
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--skills",
            "skills",
            "--workers",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("serving ") {
                let base = rest.split_whitespace().next().unwrap_or_default();
                let _ = sender.send(base.to_owned());
            }
        }
    });
    let base = receiver
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the server says where it listens");
    Server { child, base }
}

/// The same journey through the service: the task created over HTTP with its request as an
/// `environment` parameter, decided with the approve route, moved with the messages route.
#[test]
fn the_service_takes_the_same_journey_through_its_routes() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("service.db");
    let key = ok(
        &db,
        &["keys", "create", "--tenant", "acme", "--label", "test"],
    )
    .trim()
    .to_owned();
    let server = serve(&db);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| -> Value {
        let mut request = http
            .request(method, format!("{}{path}", server.base))
            .bearer_auth(&key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        runtime.block_on(async {
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {body}");
            body
        })
    };
    let wait_for = |id: &str, status: &str| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let task = call(reqwest::Method::GET, &format!("/v1/tasks/{id}"), None);
            if task["status"] == status {
                return task;
            }
            assert!(Instant::now() < deadline, "never {status}: {task}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let created = call(
        reqwest::Method::POST,
        "/v1/tasks",
        Some(
            serde_json::json!({"skill": "post-scheduler", "model": "oracle", "environment": {"request": REQUEST}}),
        ),
    );
    let id = created["task"]["id"].as_str().unwrap().to_owned();
    wait_for(&id, "awaiting_approval");
    assert!(look(&db, &id).saved.is_empty(), "saved before confirmation");

    call(
        reqwest::Method::POST,
        &format!("/v1/tasks/{id}/approve"),
        Some(serde_json::json!({})),
    );
    wait_for(&id, "completed");
    assert_eq!(look(&db, &id).saved[0]["publish_at"], FIRST);

    call(
        reqwest::Method::POST,
        &format!("/v1/tasks/{id}/messages"),
        Some(serde_json::json!({"text": MOVE})),
    );
    wait_for(&id, "awaiting_approval");
    let asked = look(&db, &id);
    assert_eq!(asked.state["post"]["publishAt"], SECOND);
    assert_eq!(
        asked.saved[0]["publish_at"], FIRST,
        "moved without confirmation"
    );

    call(
        reqwest::Method::POST,
        &format!("/v1/tasks/{id}/approve"),
        Some(serde_json::json!({})),
    );
    let done = wait_for(&id, "completed");
    assert_eq!(look(&db, &id).saved[0]["publish_at"], SECOND);
    let version = done["version"].as_u64().unwrap();
    let prompt = call(
        reqwest::Method::GET,
        &format!("/v1/tasks/{id}/steps/{version}/prompt"),
        None,
    )
    .to_string();
    assert!(prompt.contains(SECOND), "{prompt}");
    assert!(!prompt.contains("2026-10-15"), "{prompt}");
    assert!(!prompt.contains("October 15"), "{prompt}");
}
