//! An API caller can name only what the operator allowed (docs/service.md, "Running as a service",
//! "Who may name what"). Every string field of every request schema in the served OpenAPI
//! document (walked from /openapi.json, `$ref`s followed) gets hostile values — absolute paths
//! of a canary file, `../` escapes, `scripted:` and `file://` forms — against a real
//! `skillstate serve` child process. Then:
//!
//! - the canary is a FIFO, so a server that opened it for reading would be seen holding it
//!   open (and its request would hang): checked after every request, without any tracer;
//! - every refusal reads the same for an existing and a missing canary (nothing tells whether
//!   a path exists);
//! - when `strace` can trace here, the server runs under `strace -f -e trace=%file,%process`
//!   and the canary's directory appears in no open, stat, exec or other file call of the log.
//!   Without strace that part is skipped with the reason printed; the two checks above still
//!   run.
#![allow(clippy::unwrap_used)]

mod common;
mod service_support;

use std::collections::BTreeSet;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

use serde_json::{Map, Value, json};
use service_support::{client, new_key, start, strace_works, temp_path};

/// O_NONBLOCK on Linux: opening a FIFO for writing without blocking fails (ENXIO) unless
/// some process has it open for reading.
const O_NONBLOCK: i32 = 0o4000;

/// Whether anyone holds the FIFO `path` open for reading.
fn fifo_has_reader(path: &Path) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(O_NONBLOCK)
        .open(path)
        .is_ok()
}

/// The schema `schema` refers to, `$ref`s followed.
fn deref<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..32 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let pointer = reference.trim_start_matches('#');
                schema = doc.pointer(pointer).unwrap_or(&Value::Null);
            }
            None => break,
        }
    }
    schema
}

fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Map keys tried where a schema allows any key: the operator-only setting, parameters that
/// take text, and any other name.
const MAP_KEYS: &[&str] = &["audit_log", "request", "now", "x"];

/// Every pointer into a body of `schema` where a string can go.
fn string_sites(doc: &Value, schema: &Value, at: String, depth: usize, out: &mut Vec<String>) {
    let schema = deref(doc, schema);
    if depth > 8 {
        return;
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        for alternative in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            string_sites(doc, alternative, at.clone(), depth + 1, out);
        }
    }
    let kinds = types(schema);
    let any = kinds.is_empty()
        && schema.get("properties").is_none()
        && schema.get("oneOf").is_none()
        && schema.get("anyOf").is_none()
        && schema.get("allOf").is_none();
    if kinds.contains(&"string") || any {
        out.push(at.clone());
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            string_sites(doc, property, format!("{at}/{name}"), depth + 1, out);
        }
    }
    match schema.get("additionalProperties") {
        Some(Value::Bool(false)) | None => {}
        Some(Value::Bool(true)) => {
            for key in MAP_KEYS {
                out.push(format!("{at}/{key}"));
            }
        }
        Some(values) => {
            for key in MAP_KEYS {
                string_sites(doc, values, format!("{at}/{key}"), depth + 1, out);
            }
        }
    }
    if kinds.contains(&"array")
        && let Some(items) = schema.get("items")
    {
        string_sites(doc, items, format!("{at}/0"), depth + 1, out);
    }
}

/// A body `schema` accepts, as plain as possible: required properties only, examples where
/// the document gives them (`"skill": "warehouse"`, `"model": "oracle"`).
fn plain_body(doc: &Value, schema: &Value, depth: usize) -> Value {
    let schema = deref(doc, schema);
    if let Some(example) = schema
        .get("example")
        .or_else(|| schema.get("examples").and_then(|e| e.get(0)))
    {
        return example.clone();
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    if depth > 8 {
        return Value::Null;
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(first) = schema.get(key).and_then(|a| a.get(0)) {
            return plain_body(doc, first, depth + 1);
        }
    }
    let kinds = types(schema);
    if kinds.contains(&"object") || schema.get("properties").is_some() {
        let mut body = Map::new();
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for (name, property) in schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if required.contains(name.as_str()) {
                body.insert(name.clone(), plain_body(doc, property, depth + 1));
            }
        }
        return Value::Object(body);
    }
    match kinds.first().copied() {
        Some("string") => json!("x"),
        Some("integer") | Some("number") => {
            json!(schema.get("minimum").cloned().unwrap_or(json!(0)))
        }
        Some("boolean") => json!(false),
        Some("array") => {
            let item = schema.get("items").map(|i| plain_body(doc, i, depth + 1));
            Value::Array(item.into_iter().collect())
        }
        Some("null") => Value::Null,
        _ => json!({}),
    }
}

/// `body` with `value` at `pointer`, creating the objects and arrays on the way.
fn with_value(mut body: Value, pointer: &str, value: Value) -> Value {
    if pointer.is_empty() {
        return value;
    }
    let mut node = &mut body;
    let parts: Vec<&str> = pointer[1..].split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let next = if last {
            value.clone()
        } else if parts[i + 1].parse::<usize>().is_ok() {
            json!([])
        } else {
            json!({})
        };
        if let Ok(index) = part.parse::<usize>()
            && node.is_array()
        {
            let array = node.as_array_mut().unwrap();
            while array.len() <= index {
                array.push(json!({}));
            }
            if last || !(array[index].is_object() || array[index].is_array()) {
                array[index] = next;
            }
            node = &mut array[index];
        } else {
            if !node.is_object() {
                *node = json!({});
            }
            let object = node.as_object_mut().unwrap();
            let entry = object.entry(part.to_string()).or_insert(next.clone());
            if last || !(entry.is_object() || entry.is_array()) {
                *entry = next;
            }
            node = entry;
        }
    }
    body
}

/// The hostile forms of a canary path, in the same order for the existing and missing one.
fn hostile(canary: &Path) -> Vec<String> {
    let path = canary.display().to_string();
    let escape = format!("{}{}", "../".repeat(12), path.trim_start_matches('/'));
    vec![
        path.clone(),
        escape.clone(),
        format!("scripted:{path}"),
        format!("scripted:{escape}"),
        format!("file://{path}"),
        format!("openai:{path}"),
    ]
}

/// What a response says, comparable between the existing and the missing canary: the status,
/// and for a refusal its body with the hostile value written as VALUE and the canary's file
/// name as CANARY.
async fn outcome(response: reqwest::Response, value: &str) -> (u16, String) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    if status < 300 {
        return (status, String::new());
    }
    let escaped = serde_json::to_string(value).unwrap();
    let escaped = &escaped[1..escaped.len() - 1];
    let text = text.replace(escaped, "VALUE").replace(value, "VALUE");
    // Echoes of a part of the value (the name after `scripted:`) differ by the file name only.
    let text = text
        .replace("exists.jsonl", "CANARY")
        .replace("missing.jsonl", "CANARY");
    (status, without_task_status(&text))
}

/// `text` with the task's status in "the task is completed, not …" left out: the embedded
/// worker runs the task (and the sweep's messages reopen it) while the requests go on, so two
/// consecutive answers may name two statuses, which says nothing about the canary.
fn without_task_status(text: &str) -> String {
    const SAYS: &str = "the task is ";
    let Some(start) = text.find(SAYS).map(|at| at + SAYS.len()) else {
        return text.to_owned();
    };
    match text[start..].find(',') {
        Some(end) => format!("{}STATUS{}", &text[..start], &text[start + end..]),
        None => text.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_string_reaches_a_file_or_process_outside_the_allowed_roots() {
    let work = tempfile::tempdir().unwrap();
    let canaries = tempfile::tempdir().unwrap();
    let canary_dir = temp_path(&canaries, "canary");
    std::fs::create_dir_all(&canary_dir).unwrap();
    let exists = canary_dir.join("exists.jsonl");
    let missing = canary_dir.join("missing.jsonl");
    let made = Command::new("mkfifo").arg(&exists).status().unwrap();
    assert!(made.success(), "mkfifo");
    let scripts = temp_path(&work, "scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    std::fs::write(scripts.join("ok.jsonl"), "{}\n").unwrap();

    let db = temp_path(&work, "service.db");
    let key = new_key(&db, "acme");
    let log = temp_path(&work, "strace.log");
    let traced = match strace_works() {
        Ok(()) => true,
        Err(reason) => {
            eprintln!(
                "SKIPPED (the strace part only): {reason}. The FIFO canary and the exists/missing comparison still run; install strace to trace file and process calls."
            );
            false
        }
    };
    let scripted_dir = scripts.display().to_string();
    let mut server = start(
        &db,
        &["--workers", "1", "--scripted-dir", &scripted_dir],
        traced.then_some(log.as_path()),
    );
    let http = client();
    let base = server.base.clone();

    // Things the routes' {id}s can name: a task, a board, a batch.
    let task: Value = http
        .post(format!("{base}/v1/tasks"))
        .bearer_auth(&key)
        .json(&json!({"skill": "warehouse", "model": "oracle", "environment": {"events": 3}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task_id = task["task"]["id"].as_str().unwrap().to_owned();
    let board: Value = http
        .post(format!("{base}/v1/boards"))
        .bearer_auth(&key)
        .json(&json!({"name": "canary-board", "schema": {"type": "object"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let board_id = board["id"].as_str().unwrap_or_default().to_owned();
    let batch: Value = http
        .post(format!("{base}/v1/tasks:batch"))
        .bearer_auth(&key)
        .json(&json!({"tasks": [{"skill": "warehouse", "model": "oracle", "environment": {"events": 3}}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let batch_id = batch["batch"].as_str().unwrap_or_default().to_owned();

    let doc: Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(content) = operation
                .pointer("/requestBody/content")
                .and_then(Value::as_object)
            else {
                continue;
            };
            for (content_type, media) in content {
                operations.push((
                    method.clone(),
                    path.clone(),
                    content_type.clone(),
                    media["schema"].clone(),
                ));
            }
        }
    }
    assert!(
        operations.len() >= 8,
        "request bodies in the document: {operations:?}"
    );

    let mut sent = 0;
    let mut fields = BTreeSet::new();
    for (method, path, content_type, schema) in &operations {
        let url = format!(
            "{base}{}",
            path.replace(
                "{id}",
                if path.starts_with("/v1/boards") {
                    &board_id
                } else if path.starts_with("/v1/batches") {
                    &batch_id
                } else {
                    &task_id
                }
            )
            .replace("{step}", "1")
            .replace("{version}", "0")
        );
        let mut sites = Vec::new();
        string_sites(&doc, schema, String::new(), 0, &mut sites);
        let plain = plain_body(&doc, schema, 0);
        let mut extra: Vec<(String, Value)> = Vec::new();
        if path == "/v1/boards" {
            // A schema may refer to documents: only to parts of itself.
            for canary in [&exists, &missing] {
                extra.push((
                    format!("file://{}", canary.display()),
                    with_value(
                        plain.clone(),
                        "/schema",
                        json!({"$ref": format!("file://{}", canary.display())}),
                    ),
                ));
            }
        }
        let mut cases: Vec<(String, String, Value)> = Vec::new();
        for site in &sites {
            fields.insert(format!("{method} {path} {content_type} {site}"));
            for (a, b) in hostile(&exists).into_iter().zip(hostile(&missing)) {
                cases.push((
                    site.clone(),
                    a.clone(),
                    with_value(plain.clone(), site, json!(a)),
                ));
                cases.push((
                    site.clone(),
                    b.clone(),
                    with_value(plain.clone(), site, json!(b)),
                ));
            }
        }
        for (value, body) in extra {
            cases.push(("/schema/$ref".into(), value, body));
        }
        let mut outcomes = Vec::new();
        for (site, value, body) in cases {
            let mut request = http
                .request(method.to_uppercase().parse().unwrap(), &url)
                .bearer_auth(&key)
                .header("content-type", content_type.as_str())
                .header("if-match", "\"0\"")
                .body(serde_json::to_vec(&body).unwrap());
            if path == "/v1/tasks" || path == "/v1/tasks:batch" {
                request = request.header("idempotency-key", format!("k{sent}"));
            }
            let response = request.send().await.unwrap();
            sent += 1;
            let seen = outcome(response, &value).await;
            assert!(
                !fifo_has_reader(&exists),
                "{method} {path} {site} = {value}: the server opened the canary"
            );
            outcomes.push((site, seen));
        }
        // Pairs: the existing canary, then the missing one, must read the same.
        for pair in outcomes.chunks(2) {
            if let [(site, a), (_, b)] = pair {
                assert_eq!(
                    a, b,
                    "{method} {path} {site}: an existing and a missing path answer differently"
                );
            }
        }
    }
    // The walk found the fields that once reached the filesystem.
    for must in [
        "post /v1/tasks application/json /model",
        "post /v1/tasks application/json /environment/audit_log",
        "post /v1/tasks:batch application/json /tasks/0/model",
        "post /v1/tasks application/json /skill",
    ] {
        assert!(fields.contains(must), "{must} not among {fields:#?}");
    }
    eprintln!(
        "{sent} hostile requests over {} string fields",
        fields.len()
    );

    let status = server
        .terminate(std::time::Duration::from_secs(120))
        .expect("serve stops on SIGTERM");
    assert!(status.success(), "{status:?}");
    if traced {
        let log = std::fs::read_to_string(&log).unwrap();
        let canary = canary_dir.display().to_string();
        let touching: Vec<&str> = log.lines().filter(|l| l.contains(&canary)).collect();
        assert!(
            touching.is_empty(),
            "the server touched the canary:\n{}",
            touching.join("\n")
        );
        // The trace is real: it saw the server open its database and the scripted directory's
        // parent is never listed either.
        assert!(log.contains("service.db"), "the trace saw no file calls");
    }
}
