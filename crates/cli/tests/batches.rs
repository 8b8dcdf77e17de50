//! `skillstate batch …` and `skillstate worker` on SQLite, through the real binary: a batch
//! with failing tasks (skip_and_log and stop), its output_dir and reports checked against the
//! database, retrying the failed ones, .jsonl inputs, and a worker drained by SIGTERM.
#![allow(clippy::unwrap_used)]

mod batch_support;
mod common;
#[path = "../../providers/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use batch_support::*;
use serde_json::{Value, json};
use skillstate_store::{BatchState, QueueState, TaskStatus, Verdict};
use support::{FakeServer, Reply, openai_answer};

fn fixture_skill() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/batch/triage")
}

/// A model server for the triage skill: it answers every message correctly, except messages
/// containing FAIL while `failing` is set, which get an answer that is not JSON (rejected).
async fn triage_server(failing: Arc<AtomicBool>) -> FakeServer {
    FakeServer::with_responder(move |body| {
        let prompt: String = body["messages"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| m["content"].as_str()).collect())
            .unwrap_or_default();
        // Only the task's input (the observation) can hold these words.
        let message = prompt.as_str();
        if failing.load(Ordering::SeqCst) && message.contains("FAIL") {
            return Reply::json(200, openai_answer("I cannot answer in JSON today.", "stop"));
        }
        let category = if message.contains("refund") {
            "billing"
        } else {
            "shipping"
        };
        let answer = json!({
            "reasoning": "read the message",
            "state_patch": {"category": category, "summary": "one line"},
            "action": {"tool": "finish", "args": {"result": category}}
        });
        Reply::json(200, openai_answer(&answer.to_string(), "stop"))
    })
    .await
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    config: PathBuf,
    db: String,
}

/// A batch directory: inputs/ with `files`, skillstate.toml pointing at `server`, batch.yaml
/// with `extra` settings.
fn setup(server: &FakeServer, files: &[(&str, &str)], extra: &str) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir(dir.join("inputs")).unwrap();
    for (name, body) in files {
        std::fs::write(dir.join("inputs").join(name), body).unwrap();
    }
    let config = dir.join("skillstate.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nbase_url = \"{}/v1\"\nmax_retries = 0\n[prices.\"openai:fake-model\"]\ninput = 2.0\noutput = 8.0\n",
            server.base_url
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: openai:fake-model\ninputs: ./inputs\noutput_dir: ./out\nstore: ./batch.db\n{extra}",
            fixture_skill().display()
        ),
    )
    .unwrap();
    let db = dir.join("batch.db").display().to_string();
    Setup {
        _tmp: tmp,
        dir,
        config,
        db,
    }
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_and_log_runs_every_task_and_the_summary_matches_the_database() {
    let failing = Arc::new(AtomicBool::new(true));
    let server = triage_server(failing.clone()).await;
    let files = [
        ("a.txt", "I want a refund"),
        ("b.txt", "Where is my parcel?"),
        ("c.txt", "FAIL this one"),
        ("d.txt", "refund for order 7"),
        ("e.txt", "FAIL again"),
        ("f.txt", "parcel lost"),
    ];
    let s = setup(
        &server,
        &files,
        "concurrency: 3\nmax_retry: 1\non_error: skip_and_log\n",
    );
    let dir = s.dir.clone();
    let config = s.config.clone();
    let run =
        tokio::task::spawn_blocking(move || cli(&dir, &config, &["batch", "run", "batch.yaml"]))
            .await
            .unwrap();
    expect_exit(&run, 1, "batch run with failing tasks");
    let stdout = text(&run.stdout);
    let summary_md = s.dir.join("out/summary.md");
    assert!(
        stdout.contains(&format!("summary: {}", summary_md.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("6 tasks: 4 completed, 2 failed"),
        "{stdout}"
    );

    // The database.
    let store = skillstate_store::open_existing(&s.db, &Default::default())
        .await
        .unwrap();
    let batches = store.list_batches().await.unwrap();
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    let tasks = store.batch_tasks(&batch.id).await.unwrap();
    assert_eq!(tasks.len(), 6);
    for task in &tasks {
        assert_eq!(task.queue, Some(QueueState::Done));
        assert!(!task.leased);
        let file = task.labels["file"].as_str().unwrap();
        if file == "c.txt" || file == "e.txt" {
            assert_eq!(task.status, Some(TaskStatus::Failed), "{file}");
            assert_eq!(task.tries, 1, "{file}: one whole-task retry (max_retry: 1)");
            assert!(
                task.failure.as_deref().unwrap().starts_with("rejected"),
                "{task:?}"
            );
            // 3 answers per try (skill max_retries = 2), two tries.
            assert_eq!(task.rejected, 6, "{file}");
        } else {
            assert_eq!(task.status, Some(TaskStatus::Completed), "{file}");
            assert_eq!((task.version, task.rejected), (1, 0), "{file}");
        }
    }

    // output_dir: one result per task, plus the summaries, and they agree with the database.
    let mut names: Vec<String> = std::fs::read_dir(s.dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = files.iter().map(|(f, _)| format!("{f}.json")).collect();
    expected.extend(["summary.json".into(), "summary.md".into()]);
    expected.sort();
    assert_eq!(names, expected);
    let failed = json_file(&s.dir.join("out/c.txt.json"));
    assert_eq!(failed["status"], "failed");
    assert!(failed["failure"].as_str().unwrap().starts_with("rejected"));
    let billed = json_file(&s.dir.join("out/a.txt.json"));
    assert_eq!(billed["status"], "completed");
    assert_eq!(billed["state"]["category"], "billing");
    assert_eq!(billed["outcome"]["result"], "billing");
    let summary = json_file(&s.dir.join("out/summary.json"));
    assert_eq!(counts(&summary), (6, 4, 2));
    assert_eq!(summary["batch"]["id"], batch.id.as_str());
    let metrics = &summary["metrics"];
    assert_eq!(metrics["answers"], 16);
    assert_eq!(metrics["rejected_answers"], 12);
    assert_eq!(metrics["completion_rate"].as_f64().unwrap(), 4.0 / 6.0);
    assert_eq!(metrics["steps"]["p50"].as_f64().unwrap(), 1.0);
    // 16 answers of the fake server's usage (1200 in, 60 out), at $2 and $8 per million.
    let input: u64 = tasks.iter().map(|t| t.input_tokens).sum();
    assert_eq!(input, 16 * 1200);
    let cost = metrics["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - 16.0 * (1200.0 * 2.0 + 60.0 * 8.0) / 1e6).abs() < 1e-9,
        "{cost}"
    );
    let md = std::fs::read_to_string(&summary_md).unwrap();
    assert!(
        md.contains("| completed | 4 |") && md.contains("| failed | 2 |"),
        "{md}"
    );

    // Reports in every format say the same.
    let report = |format: &str| {
        let out = cli(
            &s.dir,
            &s.config,
            &[
                "--db",
                &s.db,
                "batch",
                "report",
                &batch.id[..8],
                "--format",
                format,
            ],
        );
        expect_exit(&out, 0, "batch report");
        text(&out.stdout)
    };
    let json_report: Value = serde_json::from_str(&report("json")).unwrap();
    assert_eq!(counts(&json_report), (6, 4, 2));
    assert_eq!(json_report["tasks"].as_array().unwrap().len(), 6);
    let csv = report("csv");
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 6, "{csv}");
    assert_eq!(rows.iter().filter(|r| r.contains(",completed,")).count(), 4);
    assert_eq!(rows.iter().filter(|r| r.contains(",failed,")).count(), 2);
    assert!(report("md").contains("| failed | 2 |"));
    let written = s.dir.join("report.csv");
    let out = cli(
        &s.dir,
        &s.config,
        &[
            "--db",
            &s.db,
            "batch",
            "report",
            &batch.id,
            "--format",
            "csv",
            "--output",
            written.to_str().unwrap(),
        ],
    );
    expect_exit(&out, 0, "batch report --output");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), csv);

    let status = cli(
        &s.dir,
        &s.config,
        &["--db", &s.db, "batch", "status", &batch.id],
    );
    expect_exit(&status, 0, "batch status");
    let status = text(&status.stdout);
    assert!(
        status.contains("6 tasks: 4 completed, 2 failed, 0 running, 0 queued"),
        "{status}"
    );
    assert!(
        status.contains("failed tasks (2)") && status.contains("rejected"),
        "{status}"
    );
    assert!(
        status.contains(&format!(
            "skill {}, model openai:fake-model\n",
            fixture_skill().display()
        )),
        "{status}"
    );
    let list = cli(&s.dir, &s.config, &["--db", &s.db, "batches"]);
    expect_exit(&list, 0, "batches");
    assert!(
        text(&list.stdout).contains(&batch.id),
        "{}",
        text(&list.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_stop_leaves_the_rest_queued_and_retry_finishes_them() {
    let failing = Arc::new(AtomicBool::new(true));
    let server = triage_server(failing.clone()).await;
    let files = [
        ("a.txt", "FAIL first"),
        ("b.txt", "refund"),
        ("c.txt", "parcel"),
        ("d.txt", "refund twice"),
    ];
    let s = setup(&server, &files, "concurrency: 1\non_error: stop\n");
    let (dir, config) = (s.dir.clone(), s.config.clone());
    let run =
        tokio::task::spawn_blocking(move || cli(&dir, &config, &["batch", "run", "batch.yaml"]))
            .await
            .unwrap();
    expect_exit(&run, 1, "batch run that stops");
    let stdout = text(&run.stdout);
    assert!(stdout.contains("stopped (task"), "{stdout}");
    assert!(
        stdout.contains("4 tasks: 0 completed, 1 failed, 0 running, 3 queued"),
        "{stdout}"
    );
    assert!(
        text(&run.stderr).contains("batch retry --failed"),
        "{}",
        text(&run.stderr)
    );

    let store = skillstate_store::open_existing(&s.db, &Default::default())
        .await
        .unwrap();
    let batch = store.list_batches().await.unwrap().remove(0);
    assert_eq!(batch.state, BatchState::Stopped);
    let tasks = store.batch_tasks(&batch.id).await.unwrap();
    let failed_id = tasks[0].id.clone();
    assert_eq!(tasks[0].status, Some(TaskStatus::Failed));
    for task in &tasks[1..] {
        assert_eq!((task.queue, task.version), (Some(QueueState::Queued), 0));
    }

    // The model is fixed; the failed task is queued again and continues from its journal.
    failing.store(false, Ordering::SeqCst);
    let retry = cli(
        &s.dir,
        &s.config,
        &["--db", &s.db, "batch", "retry", &batch.id, "--failed"],
    );
    expect_exit(&retry, 0, "batch retry --failed");
    assert!(
        text(&retry.stdout).contains("1 failed task(s)"),
        "{}",
        text(&retry.stdout)
    );
    let (dir, config, db, id) = (
        s.dir.clone(),
        s.config.clone(),
        s.db.clone(),
        batch.id.clone(),
    );
    let resume = tokio::task::spawn_blocking(move || {
        cli(&dir, &config, &["--db", &db, "batch", "resume", &id])
    })
    .await
    .unwrap();
    expect_exit(&resume, 0, "batch resume after retry");
    assert_eq!(
        store.batch(&batch.id).await.unwrap().state,
        BatchState::Open
    );
    for task in store.batch_tasks(&batch.id).await.unwrap() {
        assert_eq!(task.status, Some(TaskStatus::Completed), "{task:?}");
    }
    let journal = store.journal(&failed_id).await.unwrap();
    let verdicts: Vec<Verdict> = journal.iter().map(|e| e.verdict).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Rejected,
            Verdict::Rejected,
            Verdict::Rejected,
            Verdict::Accepted
        ],
        "the retried task keeps its journal and goes on from it"
    );
    assert_eq!(
        counts(&json_file(&s.dir.join("out/summary.json"))),
        (4, 4, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonl_inputs_set_environment_parameters_labels_and_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (skill, _) = common::warehouse_copy(dir, 1, 3);
    let config = dir.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    let lines = [
        json!({"environment": {"seed": 11}, "labels": {"client": "acme"}}),
        json!({"environment": {"seed": 12, "events": 2}}),
        json!({"environment": {"seed": 13}, "limits": {"max_steps": 1}}),
    ];
    let body: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(dir.join("in.jsonl"), body.join("\n")).unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: oracle\ninputs: in.jsonl\noutput_dir: results\nstore: b.db\n",
            skill.display()
        ),
    )
    .unwrap();
    let run = cli(dir, &config, &["batch", "run", "batch.yaml"]);
    expect_exit(&run, 1, "batch run with a task over its step limit");
    let first = json_file(&dir.join("results/line-1.json"));
    assert_eq!(first["status"], "completed");
    assert_eq!(first["labels"], json!({"line": 1, "client": "acme"}));
    assert_eq!(first["steps"], 3);
    assert_eq!(json_file(&dir.join("results/line-2.json"))["steps"], 2);
    let third = json_file(&dir.join("results/line-3.json"));
    assert_eq!(third["status"], "failed");
    assert!(
        third["failure"].as_str().unwrap().starts_with("max_steps"),
        "{third}"
    );
    let store =
        skillstate_store::open_existing(dir.join("b.db").to_str().unwrap(), &Default::default())
            .await
            .unwrap();
    let batch = store.list_batches().await.unwrap().remove(0);
    let tasks = store.batch_tasks(&batch.id).await.unwrap();
    let task = store.task(&tasks[1].id).await.unwrap();
    assert_eq!(
        task.environment.unwrap()["seed"],
        12,
        "the line's seed is the task's"
    );

    // A bad line is refused by file and line before anything is queued.
    std::fs::write(
        dir.join("in.jsonl"),
        "{\"environment\": {\"seed\": 1}}\n{\"enviroment\": {\"seed\": 2}}\n",
    )
    .unwrap();
    let bad = cli(
        dir,
        &config,
        &["--db", "second.db", "batch", "submit", "batch.yaml"],
    );
    expect_exit(&bad, 1, "batch submit with a misspelt key");
    let error = text(&bad.stderr);
    assert!(
        error.contains("in.jsonl:2: unknown field `enviroment`"),
        "{error}"
    );
    std::fs::write(dir.join("in.jsonl"), "{\"input\": \"hello\"}\n").unwrap();
    let bad = cli(
        dir,
        &config,
        &["--db", "second.db", "batch", "submit", "batch.yaml"],
    );
    expect_exit(
        &bad,
        1,
        "batch submit with an input for an environment skill",
    );
    assert!(
        text(&bad.stderr)
            .contains("in.jsonl:1: input: skill `warehouse` runs in the `warehouse` environment"),
        "{}",
        text(&bad.stderr)
    );
    assert!(
        !dir.join("second.db").exists(),
        "a refused batch creates no database"
    );
    // And an unknown key of the batch file by line.
    std::fs::write(
        dir.join("batch.yaml"),
        "skill: s\nmodel: oracle\ninputs: in.jsonl\nretries: 3\n",
    )
    .unwrap();
    let bad = cli(dir, &config, &["batch", "submit", "batch.yaml"]);
    expect_exit(&bad, 1, "a batch file with an unknown key");
    assert!(
        text(&bad.stderr).contains("batch.yaml:4: unknown field `retries`"),
        "{}",
        text(&bad.stderr)
    );
}

/// `--tenant` gives a submitted batch's tasks to a tenant, whose API keys then see the batch; a
/// batch made through the service (which records only its skill and model) shows them in
/// `batch status` as a batch file's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_submitted_for_a_tenant_is_the_tenants_and_api_batches_show_their_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (skill, _) = common::warehouse_copy(dir, 1, 3);
    let config = dir.join("skillstate.toml");
    std::fs::write(&config, "").unwrap();
    std::fs::write(
        dir.join("in.jsonl"),
        "{\"environment\": {\"seed\": 1}}\n{\"environment\": {\"seed\": 2}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("batch.yaml"),
        format!(
            "skill: {}\nmodel: oracle\ninputs: in.jsonl\nstore: b.db\n",
            skill.display()
        ),
    )
    .unwrap();
    let bad = cli(
        dir,
        &config,
        &["batch", "submit", "batch.yaml", "--tenant", "acme corp"],
    );
    expect_exit(&bad, 1, "batch submit with a tenant name that has a space");
    assert!(
        text(&bad.stderr).contains("--tenant `acme corp`: use 1-64 of"),
        "{}",
        text(&bad.stderr)
    );
    assert!(
        !dir.join("b.db").exists(),
        "a refused submit stores nothing"
    );

    let submitted = cli(
        dir,
        &config,
        &["batch", "submit", "batch.yaml", "--tenant", "acme"],
    );
    expect_exit(&submitted, 0, "batch submit --tenant acme");
    let id = text(&submitted.stdout).trim().to_owned();
    let untenanted = cli(dir, &config, &["batch", "submit", "batch.yaml"]);
    expect_exit(&untenanted, 0, "batch submit");
    let other = text(&untenanted.stdout).trim().to_owned();

    let db = dir.join("b.db");
    let store = skillstate_store::open_with(db.to_str().unwrap(), &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.batch_tenant(&id).await.unwrap().as_deref(),
        Some("acme")
    );
    assert_eq!(store.batch_tenant(&other).await.unwrap(), None);
    for task in store.batch_tasks(&id).await.unwrap() {
        assert_eq!(
            store.task_tenant(&task.id).await.unwrap().as_deref(),
            Some("acme")
        );
    }
    let visible = store
        .list_batches_page(&skillstate_store::BatchQuery {
            tenant: "acme".into(),
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(
        visible.into_iter().map(|b| b.id).collect::<Vec<_>>(),
        std::slice::from_ref(&id)
    );

    // A batch as `POST /v1/tasks:batch` records it: its skill and model, nothing else.
    let api = store
        .create_batch(&skillstate_store::NewBatch {
            name: "api".into(),
            spec: json!({"source": "api", "skill": "warehouse", "model": "oracle", "idempotency_key": null}),
            on_error: skillstate_store::OnError::SkipAndLog,
            max_retry: 0,
            rate_limit: Default::default(),
        })
        .await
        .unwrap();
    store.release().await;
    drop(store);
    let status = cli(dir, &config, &["--db", "b.db", "batch", "status", &api.id]);
    expect_exit(&status, 0, "batch status of an API batch");
    let status = text(&status.stdout);
    assert!(
        status.contains("skill warehouse, model oracle\n"),
        "{status}"
    );
    let report = cli(
        dir,
        &config,
        &[
            "--db", "b.db", "batch", "report", &api.id, "--format", "json",
        ],
    );
    expect_exit(&report, 0, "batch report of an API batch");
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["batch"]["model"], "oracle", "{report}");
    assert_eq!(report["batch"]["skill"], "warehouse", "{report}");
}

/// SIGTERM drains a worker: it exits 0, leaves no lease behind, and the tasks it had are still
/// queued; a second worker finishes them without repeating an effectful call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_worker_and_another_finishes_its_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ledger = dir.join("ledger.tsv");
    let SubmittedBatch {
        config, db, batch, ..
    } = submit_warehouse_batch(dir, 120, 3, &ledger);
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    let mut reaper = Reaper(vec![spawn_worker(
        dir,
        &config,
        &db,
        &["--concurrency", "2"],
        &[],
        &dir.join("worker1.log"),
    )]);
    wait_for(
        Duration::from_secs(120),
        "three completed tasks",
        async || {
            let tasks = store.batch_tasks(&batch).await.unwrap();
            (tasks
                .iter()
                .filter(|t| t.status == Some(TaskStatus::Completed))
                .count()
                >= 3)
                .then_some(())
        },
    )
    .await;
    signal(&reaper.0[0], "TERM");
    let status = wait_exit(
        &mut reaper.0[0],
        Duration::from_secs(60),
        "the drained worker",
    );
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(dir.join("worker1.log")).unwrap()
    );
    let tasks = store.batch_tasks(&batch).await.unwrap();
    assert!(
        tasks.iter().all(|t| !t.leased),
        "a drained worker leaves no lease"
    );
    let unfinished: Vec<_> = tasks
        .iter()
        .filter(|t| t.status != Some(TaskStatus::Completed))
        .collect();
    assert!(
        !unfinished.is_empty(),
        "the worker stopped claiming at the signal"
    );
    for task in &unfinished {
        assert_eq!(task.queue, Some(QueueState::Queued), "{task:?}");
        assert_eq!(task.status, Some(TaskStatus::Running), "{task:?}");
    }
    // The tasks it was running when the signal came stopped at a step boundary and were
    // released: queued, unleased, their committed steps kept.
    let log = std::fs::read_to_string(dir.join("worker1.log")).unwrap();
    let released: Vec<&str> = log
        .lines()
        .filter(|l| l.ends_with("released (still queued)"))
        .filter_map(|l| l.split(' ').nth(1))
        .collect();
    for id in &released {
        let task = tasks.iter().find(|t| t.id == *id).unwrap();
        assert_eq!(
            (task.queue, task.leased),
            (Some(QueueState::Queued), false),
            "{task:?}"
        );
    }

    let mut second = spawn_worker(
        dir,
        &config,
        &db,
        &["--concurrency", "4", "--until-idle", "--batch", &batch],
        &[],
        &dir.join("worker2.log"),
    );
    let status = wait_exit(&mut second, Duration::from_secs(300), "the second worker");
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(dir.join("worker2.log")).unwrap()
    );
    let tasks = store.batch_tasks(&batch).await.unwrap();
    assert!(
        tasks
            .iter()
            .all(|t| t.status == Some(TaskStatus::Completed) && t.version == 3)
    );
    assert_no_duplicate(&ledger_keys(&ledger));
    eprintln!(
        "{} task(s) released by the drain, finished by the second worker",
        released.len()
    );
}

/// `batch stop` by hand: a worker of the batch claims none of its tasks and exits when idle,
/// `batch status` shows the reason, and after `batch reopen` a worker completes them all. An
/// unknown batch id is refused with exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_stop_keeps_tasks_queued_until_batch_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ledger = dir.join("ledger.tsv");
    let SubmittedBatch {
        config, db, batch, ..
    } = submit_warehouse_batch(dir, 4, 3, &ledger);
    let prefix = &batch[..13];

    let stop = cli(
        dir,
        &config,
        &[
            "--db",
            &db,
            "batch",
            "stop",
            prefix,
            "--reason",
            "wrong inputs file",
        ],
    );
    expect_exit(&stop, 0, "batch stop");
    let said = text(&stop.stdout);
    assert!(
        said.contains(&format!("batch {batch} stopped (wrong inputs file)")),
        "{said}"
    );
    assert!(said.contains("4 task(s) stay queued"), "{said}");
    assert!(said.contains("running task(s) finish"), "{said}");
    assert!(
        said.contains(&format!("batch reopen {batch}")),
        "stop says how to continue: {said}"
    );
    // Stopping again keeps the first reason.
    let again = cli(dir, &config, &["--db", &db, "batch", "stop", prefix]);
    expect_exit(&again, 0, "batch stop of a stopped batch");
    assert!(
        text(&again.stdout).contains("already stopped (wrong inputs file)"),
        "{}",
        text(&again.stdout)
    );

    // A worker of the batch that runs until nothing is left to claim, and exits 0.
    let work_until_idle = |log: &str, within: Duration, what: &str| {
        let log = dir.join(log);
        let mut worker = spawn_worker(
            dir,
            &config,
            &db,
            &["--concurrency", "2", "--until-idle", "--batch", &batch],
            &[],
            &log,
        );
        let status = wait_exit(&mut worker, within, what);
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
    };
    work_until_idle(
        "worker1.log",
        Duration::from_secs(60),
        "the worker of a stopped batch",
    );
    let store = skillstate_store::open_existing(&db, &Default::default())
        .await
        .unwrap();
    let tasks = store.batch_tasks(&batch).await.unwrap();
    assert_eq!(tasks.len(), 4);
    for task in &tasks {
        assert_eq!(
            (task.queue, task.status, task.version, task.leased),
            (
                Some(QueueState::Queued),
                Some(TaskStatus::Running),
                0,
                false
            ),
            "{task:?}"
        );
    }
    assert!(ledger_keys(&ledger).is_empty(), "no effectful call ran");

    let status = cli(dir, &config, &["--db", &db, "batch", "status", prefix]);
    expect_exit(&status, 0, "batch status of a stopped batch");
    let shown = text(&status.stdout);
    assert!(shown.contains("stopped (wrong inputs file)"), "{shown}");

    let reopen = cli(dir, &config, &["--db", &db, "batch", "reopen", prefix]);
    expect_exit(&reopen, 0, "batch reopen");
    let said = text(&reopen.stdout);
    assert!(said.contains(&format!("batch {batch} reopened")), "{said}");
    assert!(said.contains("4 queued task(s) can be claimed"), "{said}");
    assert!(said.contains("worker --batch"), "{said}");
    let record = store.batch(&batch).await.unwrap();
    assert_eq!((record.state, record.stop_reason), (BatchState::Open, None));

    work_until_idle(
        "worker2.log",
        Duration::from_secs(300),
        "the worker of the reopened batch",
    );
    let tasks = store.batch_tasks(&batch).await.unwrap();
    assert!(
        tasks.iter().all(|t| t.status == Some(TaskStatus::Completed)
            && t.queue == Some(QueueState::Done)
            && t.version == 3),
        "{tasks:?}"
    );
    assert_no_duplicate(&ledger_keys(&ledger));

    // Unknown ids: a clear error, exit 1, for both commands.
    for command in ["stop", "reopen"] {
        let unknown = cli(dir, &config, &["--db", &db, "batch", command, "0000dead"]);
        expect_exit(&unknown, 1, &format!("batch {command} of an unknown batch"));
        let error = text(&unknown.stderr);
        assert!(
            error.contains("no batch matches `0000dead`") && error.contains("skillstate batches"),
            "{error}"
        );
    }
}

/// The queue bench's counting skill as an operator runs it (crates/bench/skills/counter,
/// docs/performance.md "The CLI worker and the in-process bench"): a batch of its tasks, each
/// with its scripted answers, through `skillstate worker --until-idle`; every task completes
/// with 20 ticks and `finish`, each tick a `fs.list` of its own work directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bench_skill_runs_through_the_cli_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let skill = common::repo_root().join("crates/bench/skills/counter");
    let tasks: Vec<String> = (0..5)
        .map(|_| json!({"input": "count"}).to_string())
        .collect();
    std::fs::write(tmp.path().join("tasks.jsonl"), tasks.join("\n")).unwrap();
    std::fs::write(
        tmp.path().join("batch.yaml"),
        format!(
            "skill: {}\nmodel: scripted:{}\ninputs: tasks.jsonl\n",
            skill.display(),
            skill.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let output = std::process::Command::new(common::binary())
            .current_dir(tmp.path())
            .env("SKILLSTATE_DATA_DIR", tmp.path().join("data"))
            .env_remove("SKILLSTATE_DB")
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "skillstate {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&["batch", "submit", "batch.yaml"]);
    run(&["worker", "--concurrency", "4", "--until-idle"]);
    let db = tmp.path().join("data/db/skillstate.db");
    let store = skillstate_store::open_existing(db.to_str().unwrap(), &Default::default())
        .await
        .unwrap();
    let tasks = store.list_tasks().await.unwrap();
    assert_eq!(tasks.len(), 5);
    for task in tasks {
        let task = store.task(&task.id).await.unwrap();
        assert_eq!(task.status, TaskStatus::Completed, "{}", task.id);
        assert_eq!(task.version, 21, "{}: 20 ticks and finish", task.id);
        assert_eq!(task.state, json!({"count": 20}), "{}", task.id);
        let journal = store.journal(&task.id).await.unwrap();
        assert!(
            journal
                .iter()
                .all(|entry| entry.verdict == Verdict::Accepted),
            "{}: every answer accepted",
            task.id
        );
    }
}
