//! Secrets in state, end to end: a skill whose state schema marks values `"writeOnly": true`
//! (an object property under `$defs`/`$ref`, array items, a pattern property), served by a real
//! `skillstate serve` process with debug logging; a secret set in the initial state, by the
//! scripted model's patch and through the API's PATCH. Not one of them appears in any API
//! response, event stream, `skillstate show` output or line the server logged — while the
//! prompt the model received (rebuilt from the journal, byte-identical) holds them.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{binary, skillstate};
use serde_json::{Value, json};
use skillstate_core::json::text_hash;
use skillstate_runtime::rebuild_prompt;
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous, TaskStatus};

const INITIAL: &str = "init-pw-Kq7Zt2Vx";
const WRITTEN: &str = "api-pw-Hw3Lp9Ds";
const REFUSED: &str = "bad-pin-Yt6Rc1Nm";
const REJECTED: &str = "rej-pin-Qa8Ue4Jb";
const TOKEN: &str = "model-token-Zx5Wn7Gk";
const VAULT: &str = "vault-key-Pm2Kd8Sv";
const SECRETS: [&str; 6] = [INITIAL, WRITTEN, REFUSED, REJECTED, TOKEN, VAULT];

fn leaked(text: &str) -> Vec<&'static str> {
    SECRETS.into_iter().filter(|s| text.contains(s)).collect()
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    assert!(
        leaked(text).is_empty(),
        "{what} leaks {:?}:\n{text}",
        leaked(text)
    );
}

/// A `vault` skill in `root/skills`, and the scripted answers for it.
fn vault_skill(root: &Path) -> (PathBuf, PathBuf) {
    let skills = root.join("skills");
    let dir = skills.join("vault");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: vault\ndescription: Keep the credentials the user gives.\n---\nStore the credentials the user gives in the state, then finish.\n",
    )
    .unwrap();
    let schema = json!({
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
    });
    std::fs::write(dir.join("state.schema.json"), schema.to_string()).unwrap();
    std::fs::write(
        dir.join("state.init.json"),
        r#"{"creds": {"user": "nobody"}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("skill.toml"), "[run]\nmax_steps = 5\n").unwrap();
    let answer = |patch: Value, result: String| {
        json!({"reasoning": "r", "state_patch": patch, "action": {"tool": "finish", "args": {"result": result}}})
            .to_string()
    };
    let script = root.join("vault.jsonl");
    let lines = [
        answer(
            json!({"tokens": [TOKEN], "creds": {"pin": REJECTED}}),
            "stored".into(),
        ),
        answer(
            json!({"tokens": [TOKEN], "vault": {"key_main": VAULT, "label": "main"}, "notes": "kept plain"}),
            format!("stored {TOKEN}"),
        ),
    ];
    // Each line a JSON string: the raw text the model returned.
    let text: Vec<String> = lines
        .iter()
        .map(|l| serde_json::to_string(l).unwrap())
        .collect();
    std::fs::write(&script, text.join("\n")).unwrap();
    (skills, script)
}

/// `skillstate serve` at debug level, its whole stderr kept.
struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(db: &Path, skills: &Path) -> Server {
    let mut child = Command::new(binary())
        .env("SKILLSTATE_DB", db)
        .env("SKILLSTATE_LOG", "debug")
        .env("RUST_LOG", "debug")
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--skills",
        ])
        .arg(skills)
        // The scripted answers lie beside the skills directory (`vault_skill`).
        .arg("--scripted-dir")
        .arg(skills.parent().unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let kept = log.clone();
    let reader = std::thread::spawn(move || {
        let mut buffer = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut buffer) {
            if n == 0 {
                break;
            }
            kept.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let base = loop {
        let found = log.lock().unwrap().lines().find_map(|line| {
            let rest = line.strip_prefix("serving ")?;
            Some(rest.split_whitespace().next()?.to_owned())
        });
        if let Some(base) = found {
            break base;
        }
        assert!(
            Instant::now() < deadline,
            "serve never said where it listens"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    Server {
        child,
        base,
        log,
        reader: Some(reader),
    }
}

impl Server {
    /// SIGTERM, the exit, and everything it wrote to stderr.
    fn stop(mut self) -> String {
        let pid = self.child.id();
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "{status:?}");
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.log.lock().unwrap().clone()
    }
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The status and body of a GET.
async fn get(http: &reqwest::Client, url: String, key: &str) -> (u16, String) {
    let response = http.get(url).bearer_auth(key).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn patch(
    http: &reqwest::Client,
    url: String,
    key: &str,
    if_match: &str,
    body: &Value,
) -> (u16, String) {
    let response = http
        .patch(url)
        .bearer_auth(key)
        .header("if-match", if_match)
        .header("content-type", "application/merge-patch+json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// An event stream's raw text, read until it has delivered `count` events.
async fn events(http: &reqwest::Client, url: String, key: &str, count: usize) -> String {
    let mut response = http.get(url).bearer_auth(key).send().await.unwrap();
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

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_only_values_never_leave_serve_show_or_the_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("service.db");
    let (skills, script) = vault_skill(tmp.path());
    let keys = skillstate(&db, &["keys", "create", "--tenant", "acme"]);
    assert!(keys.status.success(), "{}", output_text(&keys));
    let key = String::from_utf8(keys.stdout).unwrap().trim().to_owned();
    let server = serve(&db, &skills);
    let http = client();
    let base = server.base.clone();

    let created = http
        .post(format!("{base}/v1/tasks"))
        .bearer_auth(&key)
        .json(&json!({
            "skill": "vault",
            "model": format!("scripted:{}", script.file_name().unwrap().to_string_lossy()),
            "input": format!("Use the password {INITIAL} for ada."),
            "state": {"creds": {"user": "ada", "password": INITIAL}}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created = created.text().await.unwrap();
    assert_clean("the create response", &created);
    let id = serde_json::from_str::<Value>(&created).unwrap()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The embedded worker runs the scripted model to its end.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, task) = get(&http, format!("{base}/v1/tasks/{id}"), &key).await;
        let task: Value = serde_json::from_str(&task).unwrap();
        if task["status"] != "running" {
            assert_eq!(task["status"], "completed", "{task}");
            break;
        }
        assert!(Instant::now() < deadline, "the task never finished: {task}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Written through the API after the run; a refused write.
    let (status, written) = patch(
        &http,
        format!("{base}/v1/tasks/{id}/state"),
        &key,
        "\"1\"",
        &json!({"creds": {"password": WRITTEN}}),
    )
    .await;
    assert_eq!(status, 200, "{written}");
    assert_clean("the PATCH response", &written);
    let written: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(written["creds"]["password"], "[redacted]");
    assert_eq!(written["tokens"], json!(["[redacted]"]));
    let (status, refused) = patch(
        &http,
        format!("{base}/v1/tasks/{id}/state"),
        &key,
        "\"2\"",
        &json!({"creds": {"pin": REFUSED}}),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert_clean("the refused PATCH", &refused);

    let mut paths = vec![
        format!("/v1/tasks/{id}/state"),
        format!("/v1/tasks/{id}"),
        "/v1/tasks".to_owned(),
        format!("/v1/tasks/{id}/steps"),
        format!("/v1/tasks/{id}/steps/1"),
        format!("/v1/tasks/{id}/steps/2"),
        format!("/v1/tasks/{id}/steps/1/prompt"),
        format!("/v1/tasks/{id}/steps/1/prompt?attempt=1"),
    ];
    for step in 0..=2 {
        paths.push(format!("/v1/tasks/{id}/steps/{step}/state"));
    }
    for path in &paths {
        let (status, body) = get(&http, format!("{base}{path}"), &key).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_clean(path, &body);
    }
    let (_, state) = get(&http, format!("{base}/v1/tasks/{id}/state"), &key).await;
    assert_eq!(
        serde_json::from_str::<Value>(&state).unwrap(),
        json!({
            "creds": {"user": "ada", "password": "[redacted]"},
            "tokens": ["[redacted]"],
            "vault": {"key_main": "[redacted]", "label": "main"},
            "notes": "kept plain"
        })
    );
    // created, rejected, step, status (completed), step (the API's write): at least five.
    for path in [format!("/v1/tasks/{id}/events"), "/v1/events".to_owned()] {
        let text = events(&http, format!("{base}{path}"), &key, 5).await;
        assert_clean(&path, &text);
        assert!(text.contains("[redacted]"), "{text}");
    }
    let log = server.stop();
    assert!(log.contains("DEBUG"), "debug logging was on: {log}");
    assert_clean("the server's log", &log);

    // The CLI shows the task the same way.
    for args in [
        vec!["show", id.as_str()],
        vec!["show", id.as_str(), "--step", "1", "--prompt"],
        vec![
            "show",
            id.as_str(),
            "--step",
            "1",
            "--prompt",
            "--attempt",
            "1",
        ],
        vec!["show", id.as_str(), "--step", "1", "--observation"],
        vec!["show", id.as_str(), "--step", "0"],
        vec!["show", id.as_str(), "--step", "2"],
    ] {
        let out = skillstate(&db, &args);
        let text = output_text(&out);
        assert!(out.status.success(), "{args:?}: {text}");
        assert_clean(&format!("skillstate {}", args.join(" ")), &text);
        assert!(text.contains("[redacted]"), "{args:?}: {text}");
    }

    // What the model received held the secrets: the prompt rebuilt from the journal is the
    // one whose hash was recorded when the model was called.
    let store = SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
        .await
        .unwrap();
    let task = store.task(&id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    for attempt in [1, 2] {
        let (prompt, recorded) = rebuild_prompt(&store, &task, 1, attempt).await.unwrap();
        let text = prompt.text();
        assert_eq!(text_hash(&text), recorded);
        assert!(text.contains(INITIAL), "attempt {attempt}: {text}");
    }
    let (retry, _) = rebuild_prompt(&store, &task, 1, 2).await.unwrap();
    // The rejection it retried after names the place and the rule; no schema error quotes the
    // value it judged.
    assert!(
        retry.text().contains("[schema]") && !retry.text().contains(REJECTED),
        "the rejection it retried after: {}",
        retry.text()
    );
}
