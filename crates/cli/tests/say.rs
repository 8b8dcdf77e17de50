//! `skillstate say` on the real binary: a message answers a task's question and reopens a
//! finished task, each shown to the model as its next observation; `--no-run` only posts it
//! (`resume` then delivers what waits); a cancelled task takes none.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::skillstate;
use serde_json::json;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A skill with no tools of its own: notes the model keeps from what the user says.
fn notes_skill(root: &Path) -> std::path::PathBuf {
    let dir = root.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: notes\ndescription: Keep the notes the user dictates.\n---\nWrite down what the user says; ask when unsure; finish when told.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("state.schema.json"),
        json!({"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}}, "required": ["notes"]}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("state.init.json"), r#"{"notes": []}"#).unwrap();
    dir
}

fn answer(notes: &[&str], tool: &str, args: serde_json::Value) -> String {
    json!({"reasoning": "r", "state_patch": {"notes": notes}, "action": {"tool": tool, "args": args}})
        .to_string()
}

#[test]
fn say_answers_a_question_reopens_a_finished_task_and_posts_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let skill = notes_skill(tmp.path());
    let script = tmp.path().join("answers.jsonl");
    std::fs::write(
        &script,
        [
            answer(&[], "ask_user", json!({"question": "What should I note?"})),
            answer(&["milk"], "finish", json!({"result": "noted milk"})),
            answer(
                &["milk", "bread"],
                "finish",
                json!({"result": "noted bread"}),
            ),
        ]
        .join("\n"),
    )
    .unwrap();
    let db = tmp.path().join("notes.db");
    let model = format!("scripted:{}", script.display());
    let run = skillstate(
        &db,
        &[
            "run",
            skill.to_str().unwrap(),
            "--model",
            &model,
            "--input",
            "Take notes.",
        ],
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("awaiting_input"),
        "{}",
        text(&run.stdout)
    );
    let tasks = skillstate(&db, &["tasks"]);
    let id = text(&tasks.stdout)
        .lines()
        .find_map(|l| l.split_whitespace().next().filter(|w| w.len() == 36))
        .unwrap()
        .to_owned();

    // The message answers the question; the task runs on and finishes.
    let said = skillstate(&db, &["say", &id, "milk"]);
    assert!(said.status.success(), "{}", text(&said.stderr));
    assert!(
        text(&said.stdout).contains("completed"),
        "{}",
        text(&said.stdout)
    );
    let step2 = skillstate(&db, &["show", &id, "--step", "2", "--prompt"]);
    assert!(
        text(&step2.stdout).contains("The user answered: milk"),
        "{}",
        text(&step2.stdout)
    );

    // --no-run only posts; resume delivers it, reopening the finished task.
    let posted = skillstate(&db, &["say", &id, "also bread", "--no-run"]);
    assert!(posted.status.success(), "{}", text(&posted.stderr));
    assert!(
        text(&posted.stderr).contains("posted"),
        "{}",
        text(&posted.stderr)
    );
    let shown = skillstate(&db, &["show", &id]);
    assert!(
        text(&shown.stdout).contains("completed"),
        "{}",
        text(&shown.stdout)
    );
    let posted = skillstate(&db, &["say", &id, "that's all", "--no-run"]);
    assert!(posted.status.success(), "{}", text(&posted.stderr));
    let resumed = skillstate(&db, &["resume", &id]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stdout).contains("completed after 3 step(s)"),
        "{}",
        text(&resumed.stdout)
    );
    // Nothing waits any more: a plain resume of the completed task refuses, saying why.
    let again = skillstate(&db, &["resume", &id]);
    assert!(!again.status.success(), "resume refuses a completed task");
    assert!(text(&again.stderr).contains("nothing to resume"));
    let step3 = skillstate(&db, &["show", &id, "--step", "3", "--prompt"]);
    let prompt = text(&step3.stdout);
    assert!(
        prompt.contains("Message from the user: also bread\nMessage from the user: that's all"),
        "{prompt}"
    );

    // An empty message is refused, naming what to do.
    let empty = skillstate(&db, &["say", &id, " "]);
    assert!(!empty.status.success());
    assert!(text(&empty.stderr).contains("the message is empty"));
}
