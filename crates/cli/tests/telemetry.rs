//! OpenTelemetry traces end to end, against a real OTLP/HTTP receiver
//! (test-support/otel_receiver.py, on the official `opentelemetry-proto` package; scripts/test
//! installs its venv into target/otel-receiver): a `skillstate serve` process (no embedded
//! workers) and a separate `skillstate worker` process on one SQLite file. Tasks are created
//! over HTTP with a W3C `traceparent`; the worker, another process, continues that trace from
//! the context stored with each task. The receiver's spans must form one trace per request
//! (the caller's trace id), linked HTTP request → task run → steps → model and tool calls,
//! carry the GenAI attributes, and hold no secret and no write-only value in any attribute —
//! with `capture_content = true`, so prompts and answers are exported where allowed.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{binary, repo_root, skillstate, skip};
use serde_json::{Value, json};

/// An operator secret (`[secrets] env`) that every warehouse prompt holds: a phrase of the
/// skill's procedure. Captured prompts must carry it redacted.
const SECRET: &str = "automated warehouse with 500 shelves";
/// Values the vault task's scripted model writes at write-only locations.
const TOKEN: &str = "model-token-Zx5Wn7Gk";
const VAULT: &str = "vault-key-Pm2Kd8Sv";
const REJECTED: &str = "rej-pin-Qa8Ue4Jb";

const WAREHOUSE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const WAREHOUSE_PARENT: &str = "00f067aa0ba902b7";
const VAULT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const VAULT_PARENT: &str = "b7ad6b7169203331";

/// The receiver's interpreter: `SKILLSTATE_TEST_OTEL_PYTHON`, else scripts/test's venv.
fn receiver_python() -> PathBuf {
    std::env::var_os("SKILLSTATE_TEST_OTEL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/otel-receiver/bin/python"))
}

/// A child process killed when the test ends, whatever its outcome.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_receiver(dir: &Path) -> Option<(Killed, u16, PathBuf)> {
    let python = receiver_python();
    if !python.exists() {
        skip::skip_test(
            &format!(
                "the OTLP receiver's Python ({}) is missing",
                python.display()
            ),
            "run scripts/test (it installs opentelemetry-proto into target/otel-receiver), or set SKILLSTATE_TEST_OTEL_PYTHON",
        );
        return None;
    }
    let port_file = dir.join("receiver.port");
    let out = dir.join("spans.jsonl");
    let child = Command::new(python)
        .arg(repo_root().join("test-support/otel_receiver.py"))
        .arg("--port-file")
        .arg(&port_file)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = Killed(child);
    let port = wait_for("the receiver's port", Duration::from_secs(30), || {
        std::fs::read_to_string(&port_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    Some((child, port, out))
}

/// The vault skill (write-only state values) and its scripted answers: one rejected (a pin of
/// the wrong type), one that stores values at write-only locations and finishes.
fn vault_skill(skills: &Path, scripts: &Path) {
    let dir = skills.join("vault");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("SKILL.md"),
        "---\nname: vault\ndescription: Keep the credentials the user gives.\n---\nStore the credentials the user gives in the state, then finish.\n",
    )
    .unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "creds": {
                "type": "object",
                "properties": {
                    "user": {"type": "string"},
                    "pin": {"type": "integer", "writeOnly": true}
                }
            },
            "tokens": {"type": "array", "items": {"type": "string", "writeOnly": true}},
            "vault": {"type": "object", "patternProperties": {"^key_": {"type": "string", "writeOnly": true}}}
        },
        "required": ["creds"]
    });
    std::fs::write(dir.join("state.schema.json"), schema.to_string()).unwrap();
    std::fs::write(
        dir.join("state.init.json"),
        r#"{"creds": {"user": "nobody"}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("skill.toml"), "[run]\nmax_steps = 5\n").unwrap();
    let answer = |patch: Value| {
        let text = json!({"reasoning": "r", "state_patch": patch, "action": {"tool": "finish", "args": {"result": "stored"}}}).to_string();
        serde_json::to_string(&text).unwrap()
    };
    let lines = [
        answer(json!({"tokens": [TOKEN], "creds": {"pin": REJECTED}})),
        answer(json!({"tokens": [TOKEN], "vault": {"key_main": VAULT}})),
    ];
    std::fs::write(scripts.join("vault.jsonl"), lines.join("\n")).unwrap();
}

/// Spans as the receiver wrote them.
fn read_spans(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"].get(key)
}

fn attr_str<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    attr(span, key).and_then(Value::as_str)
}

fn named<'a>(spans: &'a [Value], trace: &str, name: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| {
            s["trace_id"] == trace && s["name"].as_str().is_some_and(|n| n.starts_with(name))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_queued_by_a_traced_request_is_traced_by_the_worker_that_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let db = root.join("traces.db").display().to_string();
    traced_through_the_queue(&root, &db).await;
}

/// The same on PostgreSQL (a schema of its own on the test server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_queued_on_postgresql_by_a_traced_request_is_traced_by_its_worker() {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if url == "off" {
        skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
        );
        return;
    }
    let schema = "telemetry_queue";
    let reset = |statement: String| {
        let url = url.clone();
        async move {
            use sqlx::Connection;
            let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut connection)
                .await
                .unwrap();
        }
    };
    reset(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    reset(format!("CREATE SCHEMA {schema}")).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let db = format!("{url}?options=-c%20search_path%3D{schema}");
    traced_through_the_queue(&root, &db).await;
    reset(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
}

async fn traced_through_the_queue(root: &Path, db: &str) {
    let root = root.to_path_buf();
    let Some((_receiver, port, spans_file)) = start_receiver(&root) else {
        return;
    };
    let skills = root.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    common::warehouse_copy(&skills, 7, 4);
    vault_skill(&skills, &root);
    let config = root.join("skillstate.toml");
    // The endpoint comes from the standard variable; the rest from `[telemetry]`.
    std::fs::write(
        &config,
        "[secrets]\nenv = [\"TELEMETRY_TEST_SECRET\"]\n\n[telemetry]\nservice_name = \"skillstate-test\"\ncapture_content = true\ntimeout_ms = 5000\n",
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let traced = |command: &mut Command| {
        command
            .env("SKILLSTATE_DB", db)
            .env("SKILLSTATE_CONFIG", &config)
            .env("SKILLSTATE_DATA_DIR", root.join("data"))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("TELEMETRY_TEST_SECRET", SECRET)
            .current_dir(&root);
    };

    let key = {
        let out = skillstate(
            Path::new(db),
            &["keys", "create", "--tenant", "acme", "--label", "t"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };

    // The API only: tasks wait in the queue for the worker process.
    let mut serve = Command::new(binary());
    traced(&mut serve);
    serve
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--workers",
            "0",
            "--skills",
        ])
        .arg(&skills)
        .arg("--scripted-dir")
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut serve = Killed(serve.spawn().unwrap());
    let stderr = serve.0.stderr.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("serve: {line}");
            if let Some(rest) = line.strip_prefix("serving ") {
                let _ = sender.send(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                );
            }
        }
    });
    let base = receiver
        .recv_timeout(Duration::from_secs(120))
        .expect("serve says where it listens");

    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut created = HashMap::new();
    for (name, body, trace, parent) in [
        (
            "warehouse",
            json!({"skill": "warehouse", "model": "oracle", "environment": {"events": 4}}),
            WAREHOUSE_TRACE,
            WAREHOUSE_PARENT,
        ),
        (
            "vault",
            json!({"skill": "vault", "model": "scripted:vault.jsonl", "input": "Keep these credentials."}),
            VAULT_TRACE,
            VAULT_PARENT,
        ),
    ] {
        let response = http
            .post(format!("{base}/v1/tasks"))
            .bearer_auth(&key)
            .header("traceparent", format!("00-{trace}-{parent}-01"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, 201, "{text}");
        let view: Value = serde_json::from_str(&text).unwrap();
        created.insert(name, view["task"]["id"].as_str().unwrap().to_owned());
    }

    // Another process runs them, and exits once nothing is left (flushing its spans).
    let mut worker = Command::new(binary());
    traced(&mut worker);
    worker
        .args(["worker", "--until-idle"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut worker = Killed(worker.spawn().unwrap());
    let status = wait_for("the worker's exit", Duration::from_secs(180), || {
        worker.0.try_wait().unwrap()
    });
    assert!(status.success(), "worker: {status:?}");
    for (name, id) in &created {
        let task: Value = http
            .get(format!("{base}/v1/tasks/{id}"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(task["status"], "completed", "{name}: {task}");
    }
    // serve exports its request spans on its way out.
    Command::new("kill")
        .args(["-TERM", &serve.0.id().to_string()])
        .status()
        .unwrap();
    let status = wait_for("serve's exit", Duration::from_secs(60), || {
        serve.0.try_wait().unwrap()
    });
    assert!(status.success(), "serve: {status:?}");

    let spans = wait_for("the spans of both tasks", Duration::from_secs(30), || {
        let spans = read_spans(&spans_file);
        let done = [WAREHOUSE_TRACE, VAULT_TRACE].iter().all(|trace| {
            !named(&spans, trace, "POST /v1/tasks").is_empty()
                && !named(&spans, trace, "invoke_agent").is_empty()
        });
        done.then_some(spans)
    });
    // SKILLSTATE_TEST_OTEL_KEEP=<file> keeps what the receiver recorded, for a person to read.
    if let Some(keep) = std::env::var_os("SKILLSTATE_TEST_OTEL_KEEP") {
        std::fs::copy(&spans_file, keep).unwrap();
    }
    let by_id: HashMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["span_id"].as_str().unwrap(), s))
        .collect();
    let parent_of =
        |span: &Value| -> Option<&Value> { by_id.get(span["parent_span_id"].as_str()?).copied() };

    for (trace, caller, task) in [
        (WAREHOUSE_TRACE, WAREHOUSE_PARENT, &created["warehouse"]),
        (VAULT_TRACE, VAULT_PARENT, &created["vault"]),
    ] {
        let in_trace: Vec<&Value> = spans.iter().filter(|s| s["trace_id"] == trace).collect();
        // The HTTP request: the caller's span is its parent.
        let requests = named(&spans, trace, "POST /v1/tasks");
        assert_eq!(requests.len(), 1, "{requests:?}");
        let request = requests[0];
        assert_eq!(request["parent_span_id"], caller);
        assert_eq!(request["kind"], "SPAN_KIND_SERVER");
        assert_eq!(attr_str(request, "http.route"), Some("/v1/tasks"));
        assert_eq!(
            attr(request, "http.response.status_code"),
            Some(&json!(201))
        );
        // The task's run, in the worker process: a child of the request.
        let runs = named(&spans, trace, "invoke_agent");
        assert_eq!(runs.len(), 1, "{runs:?}");
        let run = runs[0];
        assert_eq!(run["parent_span_id"], request["span_id"], "{run}");
        assert_eq!(attr_str(run, "skillstate.task.id"), Some(task.as_str()));
        assert_eq!(attr_str(run, "gen_ai.operation.name"), Some("invoke_agent"));
        assert_eq!(attr_str(run, "skillstate.task.status"), Some("completed"));
        assert_eq!(run["service"], "skillstate-test");
        // Steps under the run; model calls and tool calls under their step.
        let steps = named(&spans, trace, "step ");
        assert!(!steps.is_empty());
        for step in &steps {
            assert_eq!(step["parent_span_id"], run["span_id"], "{step}");
            assert!(
                attr(step, "skillstate.step")
                    .and_then(Value::as_i64)
                    .is_some()
            );
        }
        let chats = named(&spans, trace, "chat ");
        assert!(chats.len() >= steps.len(), "a model call per step at least");
        for chat in &chats {
            let step = parent_of(chat).expect("a model call's parent is exported");
            assert!(
                step["name"].as_str().unwrap().starts_with("step "),
                "{chat}"
            );
            assert_eq!(attr(chat, "skillstate.step"), attr(step, "skillstate.step"));
            assert_eq!(chat["kind"], "SPAN_KIND_CLIENT");
            assert_eq!(attr_str(chat, "gen_ai.operation.name"), Some("chat"));
            assert!(attr_str(chat, "gen_ai.provider.name").is_some(), "{chat}");
            assert!(attr_str(chat, "gen_ai.request.model").is_some(), "{chat}");
            assert!(
                attr(chat, "gen_ai.usage.input_tokens")
                    .and_then(Value::as_i64)
                    .unwrap()
                    > 0
            );
            assert!(
                attr(chat, "gen_ai.usage.output_tokens")
                    .and_then(Value::as_i64)
                    .unwrap()
                    > 0
            );
            assert_eq!(
                attr(chat, "gen_ai.response.finish_reasons"),
                Some(&json!(["stop"]))
            );
            assert!(attr_str(chat, "skillstate.verdict").is_some(), "{chat}");
        }
        // Nothing of the task outside this one trace.
        for span in &spans {
            if attr_str(span, "skillstate.task.id") == Some(task.as_str()) {
                assert_eq!(span["trace_id"], trace, "{span}");
            }
        }
        // Every span of the trace reaches the request through exported parents.
        for span in &in_trace {
            let mut at = *span;
            let mut hops = 0;
            while at["span_id"] != request["span_id"] {
                at = parent_of(at).unwrap_or_else(|| panic!("{span} is cut off from the request"));
                hops += 1;
                assert!(hops < 10);
            }
        }
    }

    // The warehouse task: oracle model, built-in tools, contents captured (redacted).
    let chats = named(&spans, WAREHOUSE_TRACE, "chat ");
    for chat in &chats {
        assert_eq!(attr_str(chat, "gen_ai.provider.name"), Some("oracle"));
        let prompt = attr_str(chat, "gen_ai.input.messages").expect("captured prompt");
        assert!(
            prompt.contains("[redacted]"),
            "the secret phrase was in the prompt: {prompt}"
        );
        assert!(attr_str(chat, "gen_ai.output.messages").is_some());
    }
    let tools = named(&spans, WAREHOUSE_TRACE, "execute_tool ");
    assert!(!tools.is_empty(), "the oracle calls the warehouse's tools");
    for tool in &tools {
        let step = parent_of(tool).unwrap();
        assert!(
            step["name"].as_str().unwrap().starts_with("step "),
            "{tool}"
        );
        assert_eq!(
            attr_str(tool, "gen_ai.operation.name"),
            Some("execute_tool")
        );
        let name = attr_str(tool, "gen_ai.tool.name").unwrap();
        assert_eq!(tool["name"], format!("execute_tool {name}"));
        assert_eq!(attr_str(step, "skillstate.action"), Some(name));
        assert!(attr(tool, "gen_ai.tool.call.arguments").is_some());
    }

    // The vault task: a rejected answer's kind and pointer; contents withheld (write-only).
    let chats = named(&spans, VAULT_TRACE, "chat ");
    assert_eq!(chats.len(), 2, "{chats:?}");
    let rejected: Vec<_> = chats
        .iter()
        .filter(|c| attr_str(c, "skillstate.verdict") == Some("rejected"))
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(
        attr_str(rejected[0], "skillstate.rejection.pointer"),
        Some("/creds/pin")
    );
    assert!(attr_str(rejected[0], "skillstate.rejection.kind").is_some());
    for chat in &chats {
        assert_eq!(attr_str(chat, "gen_ai.provider.name"), Some("scripted"));
        assert_eq!(
            attr_str(chat, "skillstate.content_withheld"),
            Some("write_only")
        );
        assert!(attr(chat, "gen_ai.input.messages").is_none());
    }

    // No secret, no write-only value, no scripted file's path in any attribute of any span.
    for span in &spans {
        let text = span["attributes"].to_string();
        for secret in [SECRET, TOKEN, VAULT, REJECTED, "vault.jsonl"] {
            assert!(!text.contains(secret), "{secret} in {span}");
        }
    }
}
