//! Redaction comes before every cap: a secret placed at every offset around each cap of the
//! code base, pushed through the real entry point (a provider's body from an HTTP server on
//! 127.0.0.1, a real `sh` child's output, a real file read and searched, an MCP server's result),
//! leaves no piece in any output, SQLite row or log line.
//!
//! "No piece" is checked as: neither the secret's first 4 characters nor its last 4 appear
//! (every longer prefix or suffix contains them). Any 4-character window of the secret would be
//! a stronger check, but windows of a random secret collide by chance with the other text of a
//! database file; prefixes and suffixes are what a cut leaves, and the secret is drawn from an
//! alphabet (capitals) that the filler around it never uses, so a hit is a leak.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use proptest::prelude::*;
use serde_json::{Value, json};
use skillstate_core::Skill;
use skillstate_core::secrets::Redactor;
use skillstate_providers::{
    Constrain, ModelProvider, ModelRequest, OpenAiProvider, ProviderSettings,
};
use skillstate_runtime::{NoProgress, Runner, TaskOptions, start_task};
use skillstate_tools::builtin::{
    ProtectedPaths, Sandbox, ShellSettings, ShellTool, WorkDir, fs_tools,
};
use skillstate_tools::mcp::{McpServer, McpServerConfig};
use skillstate_tools::{CallContext, Environment, EnvironmentError, Tool};

/// Bytes of stdout and of stderr `shell.exec` keeps here (`[tools.shell] max_output_bytes`).
const SHELL_CAP: usize = 200;
/// fs.read's cap on one answer (`fs/paging.rs` MAX_READ_BYTES).
const READ_CAP: usize = 256 * 1024;

/// Where outside text enters and is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// A non-2xx body's message, quoted in the provider's error (`http.rs` MAX_ERROR_CHARS).
    ProviderError,
    /// A 5xx body retried: its message is logged with the retry, then quoted in the error.
    ProviderRetried,
    /// A 200 of the wrong shape, quoted in the protocol error (`client.rs` MAX_QUOTED_CHARS).
    ProviderWrongShape,
    /// `shell.exec` stdout past `max_output_bytes`.
    ShellStdout,
    /// `shell.exec` stderr past `max_output_bytes`.
    ShellStderr,
    /// `fs.read` of a single line longer than its cap.
    FsReadLine,
    /// A matching line of `fs.search` longer than MAX_HIT_CHARS.
    FsSearchHit,
    /// An MCP server's result: no cap in the tool, cut later by the observation budget.
    McpResult,
}

/// Every cap, with the unit it counts in.
struct Cap {
    name: &'static str,
    entry: Entry,
    /// Where the cut falls, in `chars` or bytes of the text the cap applies to.
    at: usize,
}

const CAPS: [Cap; 8] = [
    Cap {
        name: "provider error body (http.rs MAX_ERROR_CHARS, chars)",
        entry: Entry::ProviderError,
        at: 500,
    },
    Cap {
        name: "provider 5xx body retried and logged (http.rs MAX_ERROR_CHARS, chars)",
        entry: Entry::ProviderRetried,
        at: 500,
    },
    Cap {
        name: "provider 200 of the wrong shape (client.rs MAX_QUOTED_CHARS, chars)",
        entry: Entry::ProviderWrongShape,
        at: 300,
    },
    Cap {
        name: "shell.exec stdout (max_output_bytes, bytes)",
        entry: Entry::ShellStdout,
        at: SHELL_CAP,
    },
    Cap {
        name: "shell.exec stderr (max_output_bytes, bytes)",
        entry: Entry::ShellStderr,
        at: SHELL_CAP,
    },
    Cap {
        name: "fs.read single line (paging.rs MAX_READ_BYTES, bytes)",
        entry: Entry::FsReadLine,
        at: READ_CAP,
    },
    Cap {
        name: "fs.search hit (search.rs MAX_HIT_CHARS, chars)",
        entry: Entry::FsSearchHit,
        at: 300,
    },
    Cap {
        name: "MCP result (the observation budget, tokens: placed at 2,000 chars)",
        entry: Entry::McpResult,
        at: 2000,
    },
];

/// Filler: lower case, digits, spaces and punctuation, never a capital.
fn filler(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 .,:;";
    let mut state = seed | 1;
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Letters at both ends: nothing to trim.
            let pick = if i == 0 || i + 1 == len {
                26
            } else {
                ALPHABET.len()
            };
            ALPHABET[(state % pick as u64) as usize] as char
        })
        .collect()
}

/// `len` characters of filler with `secret` starting at character `at` (the filler is ASCII).
fn with_secret_at(seed: u64, len: usize, secret: &str, at: usize) -> String {
    let text = filler(seed, len);
    format!("{}{secret}{}", &text[..at], &text[at..])
}

/// The secret's first or last 4 characters, if `text` holds one of them.
fn piece_in(text: &str, secret: &str) -> Option<String> {
    let n = secret.len();
    [&secret[..4], &secret[n - 4..]]
        .into_iter()
        .find(|piece| text.contains(*piece))
        .map(str::to_owned)
}

fn assert_no_piece(what: &str, text: &str, secret: &str) {
    if let Some(piece) = piece_in(text, secret) {
        let at = text.find(&piece).unwrap_or(0);
        // From the start of its line (a log line names its level and target), or 40 before.
        let line = text[..at].rfind('\n').map_or(0, |i| i + 1);
        let near = text[..at]
            .char_indices()
            .rev()
            .nth(40)
            .map_or(0, |(i, _)| i);
        let head: String = text[line..].chars().take(80).collect();
        let start = near.max(line);
        let end = (at + 40).min(text.len());
        let end = (end..=text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        panic!(
            "{what}: `{piece}` of the secret `{secret}` survived: …{}… (in a line starting {head})",
            &text[start..end]
        );
    }
}

// ---- logs ------------------------------------------------------------------------------

/// Every event and span field the process logs at INFO or above (what an operator runs with;
/// the default is WARN), as text. Below INFO, dependencies trace their raw protocol traffic
/// (rmcp logs whole MCP messages at TRACE): those levels are a developer's tool, not checked.
fn logs() -> &'static Mutex<String> {
    static LOGS: OnceLock<Mutex<String>> = OnceLock::new();
    let logs = LOGS.get_or_init(|| Mutex::new(String::new()));
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let _ = tracing::subscriber::set_global_default(Capture);
    });
    logs
}

struct Capture;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let _ = write!(self.0, "{}={value} ", field.name());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Capture {
    fn keep(&self, fields: Fields) {
        let mut logs = logs().lock().unwrap_or_else(|p| p.into_inner());
        logs.push_str(&fields.0);
        logs.push('\n');
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        *meta.level() <= tracing::Level::INFO
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let meta = span.metadata();
        let mut fields = Fields(format!("[span {} {}] ", meta.level(), meta.target()));
        span.record(&mut fields);
        self.keep(fields);
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut fields = Fields(String::new());
        values.record(&mut fields);
        self.keep(fields);
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut fields = Fields(format!("[{} {}] ", meta.level(), meta.target()));
        event.record(&mut fields);
        self.keep(fields);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

// ---- a model server on 127.0.0.1 -------------------------------------------------------

/// Answers every request with the status and body set last; `retry-after: 0`.
struct ModelServer {
    url: String,
    answer: Arc<Mutex<(u16, String)>>,
}

impl ModelServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answer = Arc::new(Mutex::new((200, String::new())));
        let shared = Arc::clone(&answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buffer = [0u8; 8192];
                // Headers, then the body by Content-Length.
                let body_start = loop {
                    let Ok(n) = stream.read(&mut buffer) else {
                        break None;
                    };
                    if n == 0 {
                        break None;
                    }
                    request.extend_from_slice(&buffer[..n]);
                    if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(at + 4);
                    }
                };
                let Some(body_start) = body_start else {
                    continue;
                };
                let head = String::from_utf8_lossy(&request[..body_start]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while request.len() < body_start + length {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let (status, body) = shared.lock().unwrap().clone();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\nretry-after: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { url, answer }
    }

    fn answer(&self, status: u16, body: String) {
        *self.answer.lock().unwrap() = (status, body);
    }

    /// A provider of this server; its key is `key`, and it also withholds `more`.
    fn provider(&self, key: &str, more: &Redactor, retries: u32) -> OpenAiProvider {
        let settings = ProviderSettings {
            base_url: Some(self.url.clone()),
            max_retries: retries,
            constrain: Constrain::Off,
            timeout_secs: 10,
            ..ProviderSettings::default()
        };
        let provider = OpenAiProvider::with_key("m", &settings, Some(key.to_owned())).unwrap();
        provider.withhold(more);
        provider
    }
}

/// The body the server answers with for `entry`, with `payload` where the cap applies.
fn provider_body(entry: Entry, payload: &str) -> (u16, String) {
    match entry {
        Entry::ProviderError => (400, json!({"error": {"message": payload}}).to_string()),
        Entry::ProviderRetried => (503, json!({"error": {"message": payload}}).to_string()),
        // Quoted as compact JSON: `{"x":"` comes before the payload.
        _ => (200, json!({"x": payload}).to_string()),
    }
}

/// How many characters come before the payload in the capped text.
fn lead(entry: Entry) -> usize {
    match entry {
        Entry::ProviderWrongShape => r#"{"x":""#.len(),
        _ => 0,
    }
}

// ---- the tools -------------------------------------------------------------------------

fn mcp_config() -> McpServerConfig {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/tests/fixtures/fault_mcp_server.py");
    McpServerConfig {
        command: "python3".into(),
        args: vec![script.display().to_string()],
        env: BTreeMap::new(),
        cwd: None,
        timeout_secs: 10,
        start_timeout_secs: 60,
        side_effects: BTreeMap::new(),
    }
}

struct Tools {
    all: Vec<Arc<dyn Tool>>,
    _mcp: Arc<McpServer>,
}

async fn tools(work: &Path) -> Tools {
    let root = WorkDir::new(work, &ProtectedPaths::nothing()).unwrap();
    let settings = ShellSettings {
        max_output_bytes: SHELL_CAP,
        ..ShellSettings::default()
    };
    // bubblewrap is not on every machine that runs this; the output path is the same.
    let shell = ShellTool::with_sandbox(&root, settings, Sandbox::off());
    let mut all: Vec<Arc<dyn Tool>> = vec![Arc::new(shell)];
    all.extend(
        fs_tools(&root)
            .into_iter()
            .map(|t| Arc::new(t) as Arc<dyn Tool>),
    );
    let (server, listed) = McpServer::start("fault", &mcp_config()).await.unwrap();
    all.extend(
        listed
            .into_iter()
            .filter(|t| t.spec().name == "fault.echo")
            .map(|t| Arc::new(t) as Arc<dyn Tool>),
    );
    Tools { all, _mcp: server }
}

fn tool<'a>(tools: &'a Tools, name: &str) -> &'a dyn Tool {
    tools
        .all
        .iter()
        .find(|t| t.spec().name == name)
        .unwrap()
        .as_ref()
}

/// The tool, its arguments and the file it reads, for a tool entry with `payload`.
fn tool_call(entry: Entry, work: &Path, payload: &str) -> (&'static str, Value) {
    let file = |name: &str| std::fs::write(work.join(name), payload).unwrap();
    match entry {
        Entry::ShellStdout => {
            file("out.txt");
            ("shell.exec", json!({"command": "cat out.txt"}))
        }
        Entry::ShellStderr => {
            file("err.txt");
            ("shell.exec", json!({"command": "cat err.txt >&2"}))
        }
        Entry::FsReadLine => {
            file("line.txt");
            ("fs.read", json!({"path": "line.txt"}))
        }
        Entry::FsSearchHit => {
            file("hit.txt");
            // The payload starts with filler: its first characters find the line.
            (
                "fs.search",
                json!({"text": &payload[..6], "path": "hit.txt"}),
            )
        }
        Entry::McpResult => ("fault.echo", json!({"text": payload})),
        _ => unreachable!("not a tool entry"),
    }
}

/// The payload of `entry`: filler around `cap.at`, the secret starting `delta` characters
/// after the cut (negative: before it).
fn payload(cap: &Cap, seed: u64, secret: &str, delta: i64) -> String {
    let at = (cap.at as i64 + delta - lead(cap.entry) as i64).max(0) as usize;
    with_secret_at(seed, cap.at + 64, secret, at)
}

/// Pushes `payload` through `entry` and returns everything it produced.
async fn run_entry(
    entry: Entry,
    payload: &str,
    key_is_secret: bool,
    secret_text: &str,
    server: &ModelServer,
    tools: &Tools,
    work: &Path,
) -> String {
    let secret = &Redactor::new([secret_text]);
    match entry {
        Entry::ProviderError | Entry::ProviderRetried | Entry::ProviderWrongShape => {
            let (status, body) = provider_body(entry, payload);
            server.answer(status, body);
            // The secret is the provider's own key, or one the runtime gives it.
            let (key, more) = if key_is_secret {
                (secret_text.to_owned(), Redactor::default())
            } else {
                ("key-not-the-secret".to_owned(), secret.clone())
            };
            let retries = u32::from(entry == Entry::ProviderRetried);
            let provider = server.provider(&key, &more, retries);
            let request = ModelRequest {
                prompt: skillstate_core::Prompt {
                    prefix: "p".into(),
                    body: "b".into(),
                },
                prompt_tokens: 1,
                output_schema: None,
            };
            match provider.complete(&request).await {
                Ok(response) => panic!("the server answered an error, got {response:?}"),
                Err(error) => format!("{error}\n{error:?}"),
            }
        }
        _ => {
            let (name, args) = tool_call(entry, work, payload);
            let ctx = CallContext::new("t", 1).with_secrets(Arc::new(secret.clone()));
            match tool(tools, name).call(&args, &ctx).await {
                Ok(output) => output.text,
                Err(error) => format!("{error}"),
            }
        }
    }
}

fn secret_strategy() -> impl Strategy<Value = String> {
    "[A-Z]{8,24}"
}

/// One case at a time (the logs are the process's): held for a case, which starts with empty
/// logs.
fn one_case() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    logs().lock().unwrap_or_else(|p| p.into_inner()).clear();
    guard
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Every cap, every offset from `cap − len − 2` to `cap + 2`: nothing of the secret in any
    /// output or log line.
    #[test]
    fn a_secret_at_any_offset_around_any_cap_leaves_no_piece(
        secret in secret_strategy(),
        seed in any::<u64>(),
        key_is_secret in any::<bool>(),
    ) {
        let _one = one_case();
        let logs = logs();
        let work = tempfile::tempdir().unwrap();
        runtime().block_on(async {
            let server = ModelServer::start();
            let tools = tools(work.path()).await;
            let len = secret.len() as i64;
            for cap in &CAPS {
                for delta in -len - 2..=2 {
                    let payload = payload(cap, seed, &secret, delta);
                    let out = run_entry(
                        cap.entry, &payload, key_is_secret, &secret, &server, &tools,
                        work.path(),
                    )
                    .await;
                    assert_no_piece(&format!("{} at {delta}", cap.name), &out, &secret);
                    // Whole and before the cut, the secret is shown redacted: the text did
                    // reach the output.
                    if delta == -len - 2 {
                        assert!(out.contains("[redacted]"), "{}: {out:.300}", cap.name);
                    }
                }
            }
        });
        let logged = logs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_no_piece("the logs", &logged, &secret);
    }
}

// ---- through the runtime, into SQLite ----------------------------------------------------

/// A world of the given tools that asks nothing more.
struct ToolWorld(Vec<Arc<dyn Tool>>);

impl Environment for ToolWorld {
    fn kind(&self) -> &str {
        "tools"
    }
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.0.clone()
    }
    fn opening_observation(&mut self) -> String {
        "Investigate the work directory.".into()
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

fn skill() -> Skill {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/code-investigator");
    let mut skill = Skill::load(&dir).unwrap().skill;
    skill.definition.settings.tools.allow.push("fault".into());
    skill
}

fn answer(tool: &str, args: &Value) -> String {
    json!({"reasoning": "next", "state_patch": {}, "action": {"tool": tool, "args": args}})
        .to_string()
}

/// Everything the database files hold, as text (pages, freed pages and the WAL included).
fn database_text(path: &Path) -> String {
    let mut text = String::new();
    for suffix in ["", "-wal", "-journal"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if let Ok(bytes) = std::fs::read(&file) {
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    text
}

/// Every text value of every table, read through SQLite: what the database stores, whole. (The
/// files hold the same values, but a long one is split across overflow pages, with page
/// headers between its pieces, so a phrase may not appear in the raw bytes.)
async fn stored_values(path: &Path) -> String {
    use sqlx::{Connection, Row};
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND sql NOT LIKE 'CREATE VIRTUAL%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut text = String::new();
    for table in tables {
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info(?)")
            .bind(&table)
            .fetch_all(&mut conn)
            .await
            .unwrap();
        for column in columns {
            let sql = format!("SELECT CAST(\"{column}\" AS TEXT) FROM \"{table}\"");
            for row in sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut conn)
                .await
                .unwrap()
            {
                if let Ok(Some(value)) = row.try_get::<Option<String>, _>(0) {
                    text.push_str(&value);
                    text.push('\n');
                }
            }
        }
    }
    conn.close().await.unwrap();
    text
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// A real run on a real SQLite file: the tools' outputs, with the secret around each cap,
    /// become observations and results; a provider's failures become outcomes. Nothing of the
    /// secret is in the database files or the logs.
    #[test]
    fn a_secret_around_the_caps_of_a_run_never_reaches_the_database(
        secret in secret_strategy(),
        seed in any::<u64>(),
        deltas in proptest::collection::vec(-30i64..=2, CAPS.len()),
    ) {
        let _one = one_case();
        let logs = logs();
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let redactor = Redactor::new([secret.clone()]);
        let db = runtime().block_on(async {
            let (store, db) = common::sqlite_store(dir.path()).await;
            let tools = tools(&work).await;
            let skill = skill();
            let options = TaskOptions {
                model: "scripted".into(),
                context: skillstate_core::ContextStrategy::State,
                context_budget: None,
                environment: None,
                secrets: redactor.clone(),
            };
            // One task calling every tool with the secret around its cap.
            let mut answers = Vec::new();
            for (cap, delta) in CAPS.iter().zip(&deltas) {
                let tool_entry = !matches!(
                    cap.entry,
                    Entry::ProviderError | Entry::ProviderRetried | Entry::ProviderWrongShape
                );
                if tool_entry {
                    let delta = (*delta).max(-(secret.len() as i64) - 2);
                    let payload = payload(cap, seed, &secret, delta);
                    // (The MCP echo's argument holds the secret: the answer is redacted before
                    // the call, so this one checks the answer's path.)
                    let (tool, args) = tool_call(cap.entry, &work, &payload);
                    answers.push(answer(tool, &args));
                }
            }
            answers.push(answer("finish", &json!({"result": "done"})));
            let mut world = ToolWorld(tools.all.clone());
            let model = common::scripted(answers);
            let task = start_task(store.as_ref(), &skill, &mut world, &options)
                .await
                .unwrap();
            Runner::new(store.clone(), model, &mut world, &mut NoProgress)
                .with_secrets(&redactor)
                .run(&task.id)
                .await
                .unwrap();
            // Tasks whose model server answers with the secret around each provider cap.
            let server = ModelServer::start();
            for (cap, delta) in CAPS.iter().zip(&deltas) {
                if !matches!(
                    cap.entry,
                    Entry::ProviderError | Entry::ProviderRetried | Entry::ProviderWrongShape
                ) {
                    continue;
                }
                let payload = payload(cap, seed, &secret, *delta);
                let (status, body) = provider_body(cap.entry, &payload);
                server.answer(status, body);
                let retries = u32::from(cap.entry == Entry::ProviderRetried);
                let model: Arc<dyn ModelProvider> =
                    Arc::new(server.provider("key-not-the-secret", &Redactor::default(), retries));
                let mut world = ToolWorld(tools.all.clone());
                let task = start_task(store.as_ref(), &skill, &mut world, &options)
                    .await
                    .unwrap();
                Runner::new(store.clone(), model, &mut world, &mut NoProgress)
                    .with_secrets(&redactor)
                    .run(&task.id)
                    .await
                    .unwrap();
            }
            db
        });
        // The payload files themselves hold the secret; the database must not.
        let stored = database_text(&db);
        assert_no_piece("the database", &stored, &secret);
        // What was cut did reach the database.
        let values = runtime().block_on(stored_values(&db));
        for seen in [
            "[stdout truncated",
            "[stderr truncated",
            "is longer than 262144 bytes",
            "echo: ",
            "the request was rejected (HTTP 400)",
            "unavailable after 2 attempt(s)",
            "the answer has no choices",
        ] {
            prop_assert!(values.contains(seen), "`{seen}` is not in the database");
        }
        let logged = logs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_no_piece("the logs", &logged, &secret);
    }
}
