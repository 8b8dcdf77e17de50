//! `GET /metrics` over a real socket on 127.0.0.1: requests are counted under their route
//! template with their status, real steps (a runner, embedded workers) move the runtime's
//! counters by what the store recorded, queue depth is the store's, and the text parses as
//! Prometheus exposition format 0.0.4.
//!
//! The recorder is one per process, so the tests of this file take turns (`SERIAL`) and compare
//! scrapes taken before and after what they do.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::Method;
use serde_json::json;
use skillstate_envs::oracle::OracleModel;
use skillstate_envs::warehouse::{WarehouseConfig, generate_events, reference_answer};
use skillstate_providers::ScriptedModel;
use skillstate_runtime::{HostedTask, StopLevel, TaskHost, WorkerEvent, WorkerOptions, run_worker};
use skillstate_server::metrics::TEXT_FORMAT;
use skillstate_store::{LeaseClaim, QueueDepth, Settle, Store, TaskRecord, TaskStatus, Verdict};
use support::*;
use tokio::sync::{Mutex, mpsc, watch};

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Longest any worker run of these tests may take.
const RUN_LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// The exposition format

/// One scrape, parsed: every sample by name and label set, and each family's type.
#[derive(Debug)]
struct Exposition {
    text: String,
    samples: BTreeMap<(String, Labels), f64>,
    types: BTreeMap<String, String>,
}

type Labels = BTreeSet<(String, String)>;

fn is_name(text: &str, colons: bool) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// `{name="value",…}` from just after the `{`; returns the labels and the rest after `}`.
fn parse_labels(mut rest: &str, line: &str) -> (Labels, String) {
    let mut labels = Labels::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return (labels, after.to_owned());
        }
        let (name, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label without =\" in {line:?}"));
        assert!(is_name(name, false), "label name {name:?} in {line:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => panic!("bad escape {other:?} in {line:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("an unterminated label value in {line:?}"),
            }
        };
        assert!(
            labels.insert((name.to_owned(), value)),
            "label {name} twice in {line:?}"
        );
        rest = &after[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Parses `text` as the text format 0.0.4, failing on anything that breaks it: names, label
/// syntax and escapes, values, a sample without its family's `# TYPE` before it, a family
/// typed twice, a sample given twice, histograms whose buckets shrink or whose `+Inf` bucket is
/// not their count.
fn parse(text: &str) -> Exposition {
    let mut samples = BTreeMap::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = BTreeSet::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["TYPE", name, kind] => {
                    assert!(is_name(name, true), "{line:?}");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(kind),
                        "{line:?}"
                    );
                    assert!(
                        !samples
                            .keys()
                            .any(|(n, _): &(String, Labels)| family(n, &types) == *name),
                        "# TYPE after samples of {name}"
                    );
                    assert!(
                        types
                            .insert((*name).to_owned(), (*kind).to_owned())
                            .is_none(),
                        "{name} typed twice"
                    );
                }
                ["HELP", name, ..] => {
                    assert!(is_name(name, true), "{line:?}");
                    assert!(helped.insert((*name).to_owned()), "{name} has two # HELP");
                }
                _ => {}
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("a sample without a value: {line:?}"));
        let name = &line[..name_end];
        assert!(is_name(name, true), "metric name {name:?} in {line:?}");
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(after) => parse_labels(after, line),
            None => (Labels::new(), line[name_end..].to_owned()),
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        assert!(
            rest.starts_with(' ') && (1..=2).contains(&fields.len()),
            "{line:?}"
        );
        let value = parse_value(fields[0]).unwrap_or_else(|| panic!("value of {line:?}"));
        if let Some(timestamp) = fields.get(1) {
            assert!(timestamp.parse::<i64>().is_ok(), "timestamp of {line:?}");
        }
        assert!(
            types.contains_key(&family(name, &types)),
            "{name} has no # TYPE before its samples"
        );
        assert!(
            samples.insert((name.to_owned(), labels), value).is_none(),
            "a sample given twice: {line:?}"
        );
    }
    let exposition = Exposition {
        text: text.to_owned(),
        samples,
        types,
    };
    exposition.check_histograms();
    exposition
}

/// The family a sample belongs to: a histogram's `_bucket`, `_sum` and `_count` are its own.
fn family(name: &str, types: &BTreeMap<String, String>) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
        {
            return base.to_owned();
        }
    }
    name.to_owned()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Exposition {
    /// The sample `name{pairs}` exactly; 0 when absent (a counter not counted yet).
    fn value(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
        self.samples
            .get(&(name.to_owned(), labels(pairs)))
            .copied()
            .unwrap_or(0.0)
    }

    /// The sum of every `name` sample whose labels include `pairs`.
    fn sum(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
        let wanted = labels(pairs);
        self.samples
            .iter()
            .filter(|((n, l), _)| n == name && wanted.is_subset(l))
            .map(|(_, v)| v)
            .sum()
    }

    fn check_histograms(&self) {
        for (name, _) in self.types.iter().filter(|(_, t)| *t == "histogram") {
            let bucket = format!("{name}_bucket");
            let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
            for ((n, l), v) in &self.samples {
                if *n != bucket {
                    continue;
                }
                let le = l.iter().find(|(k, _)| k == "le").unwrap();
                let le = parse_value(&le.1).unwrap();
                let mut rest = l.clone();
                rest.retain(|(k, _)| k != "le");
                series.entry(rest).or_default().push((le, *v));
            }
            assert!(!series.is_empty(), "histogram {name} has no buckets");
            for (rest, mut buckets) in series {
                buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                assert!(
                    buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                    "{name}{rest:?}: buckets shrink: {buckets:?}"
                );
                let (le, last) = *buckets.last().unwrap();
                assert!(le.is_infinite(), "{name}{rest:?} has no +Inf bucket");
                let count = self.samples.get(&(format!("{name}_count"), rest.clone()));
                assert_eq!(Some(&last), count, "{name}{rest:?}: +Inf bucket ≠ count");
                assert!(
                    self.samples
                        .contains_key(&(format!("{name}_sum"), rest.clone())),
                    "{name}{rest:?} has no sum"
                );
            }
        }
    }
}

async fn scrape(api: &dyn Transport) -> Exposition {
    let reply = api.send(Call::get("/metrics")).await;
    reply.expect(200);
    assert_eq!(reply.header("content-type"), Some(TEXT_FORMAT));
    parse(std::str::from_utf8(&reply.body).unwrap())
}

/// How much `name{pairs}` grew between two scrapes.
fn grew(before: &Exposition, after: &Exposition, name: &str, pairs: &[(&str, &str)]) -> f64 {
    after.value(name, pairs) - before.value(name, pairs)
}

fn grew_sum(before: &Exposition, after: &Exposition, name: &str, pairs: &[(&str, &str)]) -> f64 {
    after.sum(name, pairs) - before.sum(name, pairs)
}

fn assert_queue_is(scraped: &Exposition, depth: QueueDepth) {
    assert_eq!(scraped.value("skillstate_store_up", &[]), 1.0);
    for (state, tasks) in depth.by_state() {
        assert_eq!(
            scraped.value("skillstate_queue_tasks", &[("state", state)]),
            tasks as f64,
            "queue state {state}"
        );
    }
}

async fn create(api: &dyn Transport, key: &str, seed: u64) -> String {
    let request = json!({
        "skill": "warehouse",
        "model": "oracle",
        "environment": {"seed": seed, "events": 4},
    });
    let created = api.send(Call::post("/v1/tasks", &request).key(key)).await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// HTTP requests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_under_their_route_template_with_their_status() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;

    let before = scrape(&api).await;
    let id = create(&api, &key, 3).await;
    for _ in 0..2 {
        api.send(Call::get(format!("/v1/tasks/{id}")).key(&key))
            .await
            .expect(200);
    }
    let missing = uuid::Uuid::now_v7().to_string();
    api.send(Call::get(format!("/v1/tasks/{missing}")).key(&key))
        .await
        .problem(404);
    api.send(Call::get(format!("/v1/tasks/{id}")))
        .await
        .problem(401);
    api.send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await
        .expect(200);
    api.send(Call::get(format!("/no/such/route/{id}")))
        .await
        .problem(404);
    api.send(Call::get("/healthz")).await.expect(200);
    let after = scrape(&api).await;

    let requests = "skillstate_http_requests_total";
    let counted = |route: &str, method: &str, status: &str| {
        grew(
            &before,
            &after,
            requests,
            &[("route", route), ("method", method), ("status", status)],
        )
    };
    assert_eq!(counted("/v1/tasks", "POST", "201"), 1.0);
    assert_eq!(counted("/v1/tasks/{id}", "GET", "200"), 2.0);
    assert_eq!(counted("/v1/tasks/{id}", "GET", "404"), 1.0);
    assert_eq!(counted("/v1/tasks/{id}", "GET", "401"), 1.0);
    assert_eq!(counted("/v1/tasks/{id}/state", "GET", "200"), 1.0);
    assert_eq!(counted("unmatched", "GET", "404"), 1.0);
    assert_eq!(counted("/healthz", "GET", "200"), 1.0);
    // The first scrape is counted once it is answered, so the second one shows it.
    assert_eq!(counted("/metrics", "GET", "200"), 1.0);
    assert_eq!(grew_sum(&before, &after, requests, &[]), 9.0);
    // One duration sample per request, by route and method.
    let durations = "skillstate_http_request_duration_seconds_count";
    let timed = [("route", "/v1/tasks/{id}"), ("method", "GET")];
    assert_eq!(grew(&before, &after, durations, &timed), 4.0);
    assert_eq!(
        after.types["skillstate_http_request_duration_seconds"],
        "histogram"
    );
    assert_eq!(after.types[requests], "counter");
    // Paths never become labels: neither the task's id nor the unknown one appear.
    assert!(!after.text.contains(&id) && !after.text.contains(&missing));
    assert!(
        after
            .text
            .contains("# HELP skillstate_http_requests_total ")
    );

    api.stop().await;
    harness.db.destroy().await;
}

/// State PATCHes on SQLite: each write's wait for its group commit is recorded, and the groups
/// that committed them (their time, their COMMIT's, and how many writes each held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_writes_are_timed_by_the_sqlite_writer() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    let id = create(&api, &key, 4).await;
    let state = api
        .send(Call::get(format!("/v1/tasks/{id}/state")).key(&key))
        .await;
    state.expect(200);
    let mut etag = state.header("etag").unwrap().to_owned();

    let before = scrape(&api).await;
    const WRITES: usize = 5;
    for n in 0..WRITES {
        let patch = json!({"inventory": {"shelf_7": format!("item_{n}")}});
        let reply = api
            .send(
                Call::new(Method::PATCH, format!("/v1/tasks/{id}/state"))
                    .key(&key)
                    .header("if-match", &etag)
                    .raw(
                        "application/merge-patch+json",
                        serde_json::to_vec(&patch).unwrap(),
                    ),
            )
            .await;
        reply.expect(200);
        etag = reply.header("etag").unwrap().to_owned();
    }
    let after = scrape(&api).await;
    after.check_histograms();

    // Other writes of the process may share the writer (none are expected here): at least one
    // wait per PATCH, and groups that held at least the PATCHes.
    let waits = grew(
        &before,
        &after,
        "skillstate_sqlite_write_wait_seconds_count",
        &[],
    );
    assert!(waits >= WRITES as f64, "{waits} waits for {WRITES} PATCHes");
    let written = grew(&before, &after, "skillstate_sqlite_group_writes_sum", &[]);
    assert!(written >= WRITES as f64, "{written} writes in groups");
    let groups = grew(
        &before,
        &after,
        "skillstate_sqlite_group_seconds_count",
        &[],
    );
    assert!(
        groups >= 1.0 && groups <= written,
        "{groups} groups for {written} writes"
    );
    // One after another, each PATCH waited for its answer: a group each.
    assert!(
        groups >= WRITES as f64,
        "{groups} groups for {WRITES} PATCHes in turn"
    );
    assert_eq!(
        grew(
            &before,
            &after,
            "skillstate_sqlite_commit_seconds_count",
            &[]
        ),
        groups
    );
    assert_eq!(
        grew(&before, &after, "skillstate_sqlite_group_writes_count", &[]),
        groups
    );
    let group_time = grew(&before, &after, "skillstate_sqlite_group_seconds_sum", &[]);
    let commit_time = grew(&before, &after, "skillstate_sqlite_commit_seconds_sum", &[]);
    assert!(
        group_time > 0.0 && commit_time > 0.0 && commit_time <= group_time,
        "group {group_time} s, commit {commit_time} s"
    );
    assert_eq!(
        after.types["skillstate_sqlite_write_wait_seconds"],
        "histogram"
    );
    assert!(
        after
            .text
            .contains("# HELP skillstate_sqlite_group_seconds ")
    );

    api.stop().await;
    harness.db.destroy().await;
}

// ---------------------------------------------------------------------------------------------
// Steps, rejections, tools and tokens

/// A scripted run with a rejected answer of each of two kinds and a tool call that fails: the
/// runtime's counters move by exactly what the journal recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_rejections_tool_errors_and_tokens_are_counted_as_the_journal_records_them() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    let id = create(&api, &key, 5).await;

    let events = generate_events(&WarehouseConfig::new(5, 4));
    let references: Vec<String> = events.iter().map(reference_answer).collect();
    let unknown_tool = json!({
        "reasoning": "trying a tool that does not exist",
        "state_patch": {},
        "action": {"tool": "teleport", "args": {}}
    });
    let failing_ship = json!({
        "reasoning": "shipping from a shelf that holds nothing",
        "state_patch": {},
        "action": {"tool": "ship", "args": {"item": "item_999", "shelf": "shelf_999"}}
    });
    let answers = vec![
        "no JSON here".to_owned(),
        references[0].clone(),
        unknown_tool.to_string(),
        references[1].clone(),
        failing_ship.to_string(),
        references[3].clone(),
    ];
    let model = ScriptedModel::from_outputs("answers.jsonl".into(), answers);

    let before = scrape(&api).await;
    run_with(harness.store(), &id, Arc::new(model)).await;
    let after = scrape(&api).await;

    let store = harness.store();
    let task = store.task(&id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed, "{:?}", task.outcome);
    let journal = store.journal(&id).await.unwrap();
    let accepted = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .count() as f64;
    let rejected = journal.len() as f64 - accepted;
    assert_eq!((accepted, rejected), (4.0, 2.0));
    let intents = store.intents(&id).await.unwrap();
    let tool_calls = intents.iter().filter(|i| i.ok.is_some()).count() as f64;
    let tool_errors = intents.iter().filter(|i| i.ok == Some(false)).count() as f64;
    assert!(tool_errors >= 1.0, "{intents:?}");

    let grew = |name: &str, pairs: &[(&str, &str)]| grew(&before, &after, name, pairs);
    assert_eq!(grew("skillstate_steps_committed_total", &[]), accepted);
    assert_eq!(
        grew("skillstate_steps_committed_total", &[]),
        task.version as f64
    );
    assert_eq!(
        grew("skillstate_answers_total", &[("verdict", "accepted")]),
        accepted
    );
    assert_eq!(
        grew("skillstate_answers_total", &[("verdict", "rejected")]),
        rejected
    );
    assert_eq!(
        grew("skillstate_rejected_answers_total", &[("kind", "parse")]),
        1.0
    );
    assert_eq!(
        grew(
            "skillstate_rejected_answers_total",
            &[("kind", "unknown_tool")]
        ),
        1.0
    );
    assert_eq!(grew("skillstate_invalid_tool_calls_total", &[]), 1.0);
    assert_eq!(
        grew_sum(&before, &after, "skillstate_tool_calls_total", &[]),
        tool_calls
    );
    assert_eq!(
        grew_sum(&before, &after, "skillstate_tool_errors_total", &[]),
        tool_errors
    );
    assert_eq!(
        grew("skillstate_tool_errors_total", &[("tool", "ship")]),
        tool_errors
    );
    let prompt_tokens: u64 = journal.iter().map(|e| e.prompt_tokens).sum();
    assert!(prompt_tokens > 0);
    assert_eq!(
        grew("skillstate_prompt_tokens_total", &[]),
        prompt_tokens as f64
    );
    // One latency sample per answer; the scripted model reports no provider usage.
    assert_eq!(
        grew("skillstate_model_latency_seconds_count", &[]),
        journal.len() as f64
    );
    assert_eq!(after.types["skillstate_model_latency_seconds"], "histogram");
    assert_eq!(
        grew_sum(&before, &after, "skillstate_provider_tokens_total", &[]),
        0.0
    );
    assert!(
        after
            .text
            .contains("# HELP skillstate_rejected_answers_total ")
    );

    api.stop().await;
    harness.db.destroy().await;
}

// ---------------------------------------------------------------------------------------------
// Workers and the queue

/// Rebuilds a task's world and model as a deployment's host does: the warehouse with the
/// oracle. With `steal` set, the first task it opens is taken by "another worker" first.
struct Host {
    store: Arc<dyn Store>,
    steal: AtomicBool,
}

#[async_trait]
impl TaskHost for Host {
    async fn open(&self, task: &TaskRecord) -> Result<HostedTask, String> {
        if self.steal.swap(false, Ordering::SeqCst) {
            // As if this worker's lease had expired and another worker claimed the task: the
            // lease is let go and claimed under another token.
            let lease = self.store.lease(&task.id).await.unwrap().unwrap();
            self.store
                .release_lease(&task.id, &lease.token)
                .await
                .unwrap();
            let other = LeaseClaim {
                token: "other-worker".into(),
                holder: "another worker".into(),
                process: "elsewhere".into(),
            };
            let taken = self.store.claim_task(&other, 600_000, None).await.unwrap();
            assert_eq!(taken.map(|c| c.task_id).as_deref(), Some(task.id.as_str()));
        }
        Ok(HostedTask {
            env: world_of(task).ok_or("no built-in environment")?,
            model: Arc::new(OracleModel::for_environment("warehouse").map_err(|e| e.to_string())?),
            resources: None,
        })
    }
}

fn options(concurrency: usize) -> WorkerOptions {
    WorkerOptions {
        concurrency,
        until_idle: true,
        poll: Duration::from_millis(50),
        ..WorkerOptions::default()
    }
}

/// Tasks created over HTTP are queued: the scrape's queue depth is the store's; embedded
/// workers run them and the claim, settle and step counters move by what they did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_settle_tasks_and_queue_depth_is_the_stores() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    let store = harness.store();

    let before = scrape(&api).await;
    let mut ids = Vec::new();
    for seed in [11, 12, 13] {
        ids.push(create(&api, &key, seed).await);
    }
    let queued = scrape(&api).await;
    let depth = store.queue_depth().await.unwrap();
    assert_eq!(
        depth,
        QueueDepth {
            ready: 3,
            ..QueueDepth::default()
        }
    );
    assert_queue_is(&queued, depth);
    assert_eq!(queued.types["skillstate_queue_tasks"], "gauge");

    let host = Arc::new(Host {
        store: store.clone(),
        steal: AtomicBool::new(false),
    });
    let (_stop, stopped) = watch::channel(StopLevel::Run);
    let stats = tokio::time::timeout(
        RUN_LIMIT,
        run_worker(store.clone(), host, options(2), stopped, None),
    )
    .await
    .expect("the worker finishes the queue")
    .unwrap();
    assert_eq!((stats.claimed, stats.completed), (3, 3));
    let after = scrape(&api).await;

    let mut versions = 0;
    for id in &ids {
        let task = store.task(id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        versions += task.version;
    }
    let grew = |name: &str, pairs: &[(&str, &str)]| grew(&before, &after, name, pairs);
    assert_eq!(grew("skillstate_tasks_claimed_total", &[]), 3.0);
    assert_eq!(
        grew("skillstate_tasks_settled_total", &[("status", "completed")]),
        3.0
    );
    assert_eq!(
        grew_sum(&before, &after, "skillstate_tasks_settled_total", &[]),
        3.0
    );
    assert_eq!(
        grew("skillstate_steps_committed_total", &[]),
        versions as f64
    );
    assert_eq!(grew("skillstate_leases_lost_total", &[]), 0.0);
    let depth = store.queue_depth().await.unwrap();
    assert_eq!(depth, QueueDepth::default());
    assert_queue_is(&after, depth);

    api.stop().await;
    harness.db.destroy().await;
}

/// A worker whose task was taken over by another stops without settling it, and says so:
/// one lost lease, no settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_is_counted_as_lost() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    let store = harness.store();
    let id = create(&api, &key, 21).await;

    let before = scrape(&api).await;
    let host = Arc::new(Host {
        store: store.clone(),
        steal: AtomicBool::new(true),
    });
    let (stop, stopped) = watch::channel(StopLevel::Run);
    let (events, mut received) = mpsc::unbounded_channel();
    let worker = tokio::spawn(run_worker(
        store.clone(),
        host,
        options(1),
        stopped,
        Some(events),
    ));
    let lost = tokio::time::timeout(RUN_LIMIT, async {
        while let Some(event) = received.recv().await {
            if let WorkerEvent::LostLease { task, .. } = event {
                return task;
            }
        }
        panic!("the worker ended without losing its lease");
    })
    .await
    .expect("the worker notices the takeover");
    assert_eq!(lost, id);
    // The other worker is done with it; this one has nothing left.
    store
        .settle_claim(&id, "other-worker", &Settle::Done, None)
        .await
        .unwrap();
    // The worker runs until idle: with nothing claimable it may have ended already, and the
    // stop then has no one to reach.
    let _ = stop.send(StopLevel::Drain);
    let stats = tokio::time::timeout(RUN_LIMIT, worker)
        .await
        .expect("the worker drains")
        .unwrap()
        .unwrap();
    assert_eq!((stats.claimed, stats.lost), (1, 1));
    let after = scrape(&api).await;

    assert_eq!(
        grew(&before, &after, "skillstate_leases_lost_total", &[]),
        1.0
    );
    assert_eq!(
        grew(&before, &after, "skillstate_tasks_claimed_total", &[]),
        1.0
    );
    assert_eq!(
        grew_sum(&before, &after, "skillstate_tasks_settled_total", &[]),
        0.0
    );
    assert_queue_is(&after, store.queue_depth().await.unwrap());

    api.stop().await;
    harness.db.destroy().await;
}

// ---------------------------------------------------------------------------------------------
// A worker process's own listener

/// `metrics_router` (what `skillstate worker --metrics-addr` serves) answers /metrics with the
/// same figures and queue depth, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_listener_serves_metrics_only() {
    let _turn = SERIAL.lock().await;
    let harness = Harness::new(Db::sqlite().await).await;
    let store = harness.store();
    let api = Socket::start(harness.state.clone()).await;
    let (key, _) = harness.key("acme").await;
    create(&api, &key, 31).await;
    api.stop().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(skillstate_server::serve_metrics(
        listener,
        store.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let first = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        first.headers()["content-type"].to_str().unwrap(),
        TEXT_FORMAT
    );
    let first = parse(&first.text().await.unwrap());
    let depth = store.queue_depth().await.unwrap();
    assert_eq!(depth.ready, 1);
    assert_queue_is(&first, depth);
    let second = parse(
        &client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let scrapes = [("route", "/metrics"), ("method", "GET"), ("status", "200")];
    assert_eq!(
        grew(&first, &second, "skillstate_http_requests_total", &scrapes),
        1.0
    );
    let other = client.get(format!("{base}/v1/tasks")).send().await.unwrap();
    assert_eq!(other.status(), 404);
    assert_eq!(
        other.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the listener stops")
        .unwrap()
        .unwrap();
    harness.db.destroy().await;
}
