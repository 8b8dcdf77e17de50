//! The admin-panel agent (`skills/post-scheduler`) end to end on the real binary and a real
//! SQLite file, with the scripted demo and with the oracle: the run pauses for confirmation
//! before saving, nothing reaches the panel until the user approves, a message moves the
//! publication by changing one field of the state, and afterwards the old date is nowhere in
//! the prompt. A user's message comes first in every order it can arrive in — with the
//! request, with the approval, instead of the approval, after the post was scheduled — and
//! each test checks what the panel holds at the end (the post's time, whether it is
//! scheduled, which approvals were asked for and which ran), not only the task's status.
//! The same orders through the service are in `post_scheduler/service.rs`; the guide's
//! walk-through, with its printed output, in `post_scheduler/walk_through.rs`.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "post_scheduler/service.rs"]
mod service;
#[path = "post_scheduler/walk_through.rs"]
mod walk_through;

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

/// One request for approval the agent made: the tool, the publication time it carried and
/// what became of it (`Some(true)`: it ran; `Some(false)`: it did not run, or failed; `None`:
/// it still waits).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Asked {
    tool: String,
    publish_at: String,
    ok: Option<bool>,
}

fn asked(tool: &str, publish_at: &str, ok: Option<bool>) -> Asked {
    Asked {
        tool: tool.into(),
        publish_at: publish_at.into(),
        ok,
    }
}

struct Seen {
    status: TaskStatus,
    version: u64,
    state: Value,
    /// The posts the agent saved or rescheduled, as the panel stores them.
    saved: Vec<Value>,
    /// Saves and schedules the panel carried out.
    changes: u64,
    /// Every save and schedule the agent asked the user to approve, in order.
    asked: Vec<Asked>,
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
        let asked = store
            .intents(id)
            .await
            .unwrap()
            .into_iter()
            .filter(|i| i.tool == "save_post" || i.tool == "schedule_post")
            .map(|i| {
                let at = i.args["publishAt"]
                    .as_str()
                    .or_else(|| i.args["values"]["publishAt"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                Asked {
                    tool: i.tool,
                    publish_at: at,
                    ok: i.ok,
                }
            })
            .collect();
        Seen {
            status: task.status,
            version: task.version,
            state: task.state,
            saved,
            changes: checkpoint["changes"].as_u64().unwrap(),
            asked,
        }
    })
}

/// The task paused for the user's approval of `wanted`, with nothing saved by the agent yet
/// unless `saved_at` names the time the panel holds; the state names no other date than the
/// one `wanted` carries.
fn assert_waiting(seen: &Seen, wanted: &Asked, saved_at: Option<&str>) {
    assert_eq!(seen.status, TaskStatus::AwaitingApproval, "{}", seen.state);
    assert_eq!(seen.asked.last(), Some(wanted), "{:?}", seen.asked);
    let pending = &seen.state["pendingConfirmation"];
    assert_eq!(pending["action"], wanted.tool.as_str(), "{}", seen.state);
    assert_eq!(seen.state["post"]["publishAt"], wanted.publish_at.as_str());
    match saved_at {
        None => assert!(
            seen.saved.is_empty(),
            "saved before approval: {:?}",
            seen.saved
        ),
        Some(at) => assert_eq!(seen.saved[0]["publish_at"], at, "moved before approval"),
    }
    assert_one_date(&seen.state, &wanted.publish_at);
}

/// The date lives in `post.publishAt` only (and in the call that waits for approval, if one
/// does): no other day appears anywhere in the state, and the form keeps no values.
fn assert_one_date(state: &Value, at: &str) {
    let shown = state.to_string();
    for old in [
        FIRST,
        SECOND,
        "2026-10-22T09:00:00Z",
        "2026-10-25T09:00:00Z",
    ] {
        if old != at {
            assert!(
                !shown.contains(&old[..10]),
                "{old} is still in the state: {state}"
            );
        }
    }
    let copies = shown.matches(&at[..10]).count();
    let waiting = usize::from(!state["pendingConfirmation"].is_null());
    assert_eq!(copies, 1 + waiting, "the date is copied: {state}");
    assert!(state["form"].get("values").is_none(), "{state}");
}

/// The task completed with the post stored at `at`, scheduled, after exactly the approvals
/// `asks` (those that ran are the panel's only changes).
fn assert_settled(seen: &Seen, at: &str, asks: &[Asked]) {
    assert_eq!(seen.status, TaskStatus::Completed, "{}", seen.state);
    assert_eq!(seen.saved.len(), 1, "one post: {:?}", seen.saved);
    let post = &seen.saved[0];
    assert_eq!(post["publish_at"], at, "{post}");
    assert_eq!(post["status"], "scheduled", "{post}");
    assert_eq!(seen.state["post"]["id"], post["id"]);
    assert_eq!(seen.state["post"]["publishAt"], at);
    assert_eq!(seen.state["post"]["status"], "scheduled");
    assert_eq!(seen.state["pendingConfirmation"], Value::Null);
    assert_eq!(seen.asked, asks);
    let ran = asks.iter().filter(|a| a.ok == Some(true)).count() as u64;
    assert_eq!(seen.changes, ran, "the panel changed without an approval");
    assert_one_date(&seen.state, at);
}

/// The latest observation of `step`'s prompt.
fn latest_observation(db: &Path, id: &str, step: u64) -> String {
    let prompt = ok(db, &["show", id, "--step", &step.to_string(), "--prompt"]);
    prompt
        .split_once("# Latest observation\n")
        .map(|(_, latest)| latest.to_owned())
        .unwrap_or_else(|| panic!("no latest observation in {prompt}"))
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
    assert_waiting(&before, &asked("save_post", FIRST, None), None);
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

    assert_waiting(
        &asked,
        &self::asked("schedule_post", SECOND, None),
        Some(FIRST),
    );

    let approved = ok(db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    let second = look(db, &id);
    assert_eq!(second.saved.len(), 1, "the same post, not a new one");
    assert_eq!(second.saved[0]["publish_at"], SECOND);
    assert_eq!(second.saved[0]["id"], post["id"]);
    // The panel's final state: the one post, moved to the 20th, after two approvals, each
    // for what it carried.
    assert_settled(
        &second,
        SECOND,
        &[
            self::asked("save_post", FIRST, Some(true)),
            self::asked("schedule_post", SECOND, Some(true)),
        ],
    );

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
        reading.contains(&format!(
            "# Latest observation\nMessage from the user: {MOVE}\n"
        )),
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

/// `run` with the oracle until the save waits for approval; returns the task id and the step
/// that paused.
fn paused_save(db: &Path) -> (String, u64) {
    let run = ok(db, &["run", SKILL, "--model", "oracle", "--input", REQUEST]);
    let id = task_id(&run);
    let seen = look(db, &id);
    assert_waiting(&seen, &asked("save_post", FIRST, None), None);
    (id, seen.version)
}

/// A correction written while the save waits, then the approval (`say --no-run`, `approve`):
/// the message comes first, so the approval does not save the old date; the agent changes
/// `post.publishAt`, fills the form and asks again; only the second approval saves.
#[test]
fn a_correction_sent_with_the_approval_is_applied_before_anything_is_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("with-approval.db");
    let (id, paused) = paused_save(&db);

    let out = skillstate(&db, &["say", &id, MOVE, "--no-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(look(&db, &id).status, TaskStatus::AwaitingApproval);
    let approved = ok(&db, &["approve", &id]);
    assert!(
        approved.contains("awaiting_approval") && approved.contains(SECOND),
        "{approved}"
    );
    let seen = look(&db, &id);
    assert_waiting(&seen, &asked("save_post", SECOND, None), None);
    assert_eq!(seen.asked[0], asked("save_post", FIRST, Some(false)));
    let shown = latest_observation(&db, &id, paused + 1);
    assert!(
        shown.starts_with(&format!(
            "Message from the user: {MOVE}\n\n`save_post` with args "
        )) && shown.contains("was not run: a message from the user came with the approval"),
        "{shown}"
    );

    let approved = ok(&db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    assert_settled(
        &look(&db, &id),
        SECOND,
        &[
            asked("save_post", FIRST, Some(false)),
            asked("save_post", SECOND, Some(true)),
        ],
    );
}

/// A correction written instead of the approval (`say` while the save waits): nothing is
/// saved; the agent changes the date in the form and asks again. Posted only
/// (`say --no-run`), `resume` delivers it as a worker would.
#[test]
fn a_correction_instead_of_the_approval_asks_again_with_the_new_date() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("instead.db");
    let (id, paused) = paused_save(&db);

    let posted = skillstate(&db, &["say", &id, MOVE, "--no-run"]);
    assert!(
        text(&posted.stderr).contains(&format!("skillstate resume {id}")),
        "{}",
        text(&posted.stderr)
    );
    let said = ok(&db, &["resume", &id]);
    assert!(said.contains("awaiting_approval"), "{said}");
    let seen = look(&db, &id);
    assert_waiting(&seen, &asked("save_post", SECOND, None), None);
    let shown = latest_observation(&db, &id, paused + 1);
    assert!(
        shown.starts_with(&format!("Message from the user: {MOVE}\n\n`save_post`"))
            && shown.contains("was not run: a human wrote instead of approving it."),
        "{shown}"
    );
    // The step after the change shows the editor with the new time; the state holds only it.
    let next = latest_observation(&db, &id, paused + 2);
    assert!(next.starts_with("Page: editor (new post)"), "{next}");
    assert!(!next.contains("2026-10-15"), "{next}");

    let approved = ok(&db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    assert_settled(
        &look(&db, &id),
        SECOND,
        &[
            asked("save_post", FIRST, Some(false)),
            asked("save_post", SECOND, Some(true)),
        ],
    );
}

/// A correction in the same observation as the request: a task queued with its request
/// (`batch submit`) gets a message before its first step (`say`). The message comes first:
/// the post is prepared, and saved, for the message's date; the request's is never used.
#[test]
fn a_correction_with_the_request_is_applied_before_anything_is_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("with-request.db");
    let inputs = tmp.path().join("requests.jsonl");
    std::fs::write(
        &inputs,
        format!(
            "{}\n",
            serde_json::json!({"environment": {"request": REQUEST}})
        ),
    )
    .unwrap();
    let batch = tmp.path().join("batch.yaml");
    std::fs::write(
        &batch,
        format!(
            "skill: {}\nmodel: oracle\ninputs: {}\nstore: {}\n",
            common::repo_root().join(SKILL).display(),
            inputs.display(),
            db.display()
        ),
    )
    .unwrap();
    ok(&db, &["batch", "submit", batch.to_str().unwrap()]);
    let listed = ok(&db, &["tasks"]);
    let id = listed
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned();
    assert_eq!(look(&db, &id).version, 0, "{listed}");

    let said = ok(&db, &["say", &id, "Make it October 20 instead"]);
    assert!(
        said.contains("awaiting_approval") && said.contains(SECOND),
        "{said}"
    );
    let seen = look(&db, &id);
    assert_waiting(&seen, &asked("save_post", SECOND, None), None);
    assert_eq!(seen.asked.len(), 1, "{:?}", seen.asked);
    assert_eq!(
        seen.state["goal"],
        "Prepare a post about the launch of the new product and schedule it"
    );
    let shown = latest_observation(&db, &id, 1);
    assert!(
        shown.starts_with("Message from the user: Make it October 20 instead\n\nAdmin panel of ")
            && shown.contains(&format!("Request from the user: {REQUEST}")),
        "{shown}"
    );

    let approved = ok(&db, &["approve", &id]);
    assert!(approved.contains("completed"), "{approved}");
    assert_settled(
        &look(&db, &id),
        SECOND,
        &[asked("save_post", SECOND, Some(true))],
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
