//! Crash-safe resume, measured on real processes: `skillstate run` / `skillstate resume` are
//! SIGKILLed at random points (before the model call, after it, after the commit, inside the
//! tool, after the tool, or at a random moment) and resumed until the task completes.
//! After every kill the database must open, no committed step may be lost or changed, and the
//! effectful tools' own audit log must never show an action executed twice. The resumed task
//! must end in the same state as an uninterrupted run.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use skillstate_store::{TaskStatus, Verdict, state_at};

const EVENTS: u32 = 40;
const POINTS: [&str; 6] = [
    "before_model",
    "after_model",
    "after_commit",
    "in_tool",
    "after_tool",
    "timer",
];

/// A small deterministic generator, so a failing run can be repeated.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The warehouse skill with an audit log in `root/audit`, which the configuration written to
/// `root/ops.toml` (returned last) allows as a work root.
fn skill_with_audit(
    root: &Path,
) -> (
    std::path::PathBuf,
    String,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let (skill, script) = warehouse_copy(root, 3, EVENTS);
    std::fs::create_dir_all(root.join("audit")).unwrap();
    let audit = root.join("audit/audit.log");
    let config = root.join("ops.toml");
    std::fs::write(
        &config,
        format!(
            "[tools]\nwork_roots = [\"{}\"]\n",
            root.join("audit").display()
        ),
    )
    .unwrap();
    let settings = std::fs::read_to_string(skill.join("skill.toml")).unwrap();
    std::fs::write(
        skill.join("skill.toml"),
        format!("{settings}audit_log = \"{}\"\n", audit.display()),
    )
    .unwrap();
    (
        skill,
        format!("scripted:{}", script.display()),
        audit,
        config,
    )
}

/// Starts `skillstate <args>` and lets it die at `point` (or kills it after a random delay).
fn run_until_killed(
    db: &str,
    config: &Path,
    args: &[&str],
    point: &str,
    count: u64,
    delay: Duration,
) -> bool {
    let mut command = Command::new(binary());
    command
        .env("SKILLSTATE_CONFIG", config)
        .args(["--db", db])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if point != "timer" {
        command.env("SKILLSTATE_FAILPOINT", format!("{point}:{count}"));
    }
    let mut child = command.spawn().unwrap();
    if point == "timer" {
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
    }
    let status = child.wait().unwrap();
    !status.success() && status.code().is_none()
}

struct Observed {
    /// step → recorded state hash, for every step ever seen committed.
    committed: BTreeMap<u64, String>,
}

/// Checks the database after a kill; returns the task's status.
async fn check(db: &str, observed: &mut Observed) -> Option<TaskStatus> {
    let store = skillstate_store::open(db).await.unwrap();
    let tasks = store.list_tasks().await.unwrap();
    let summary = tasks.first()?;
    let task = store.task(&summary.id).await.unwrap();
    let journal = store.journal(&task.id).await.unwrap();
    let accepted: BTreeMap<u64, String> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .map(|e| (e.step, e.state_hash.clone().unwrap()))
        .collect();
    assert_eq!(
        accepted.len() as u64,
        task.version,
        "journal and version disagree"
    );
    for (step, hash) in &observed.committed {
        assert_eq!(
            accepted.get(step),
            Some(hash),
            "committed step {step} was lost or changed"
        );
    }
    observed.committed = accepted;
    let rebuilt = state_at(store.as_ref(), &task.id, task.version, task.version)
        .await
        .unwrap();
    assert_eq!(rebuilt, task.state, "stored state differs from the journal");
    let pending = store
        .intents(&task.id)
        .await
        .unwrap()
        .iter()
        .filter(|i| !i.done)
        .count();
    assert!(pending <= 1, "at most one action can be in flight");
    Some(task.status)
}

fn audit_keys(audit: &Path) -> Vec<String> {
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

async fn final_state(db: &str) -> serde_json::Value {
    let store = skillstate_store::open(db).await.unwrap();
    let tasks = store.list_tasks().await.unwrap();
    store.task(&tasks[0].id).await.unwrap().state
}

/// Runs the kill-and-resume loop until `kills_wanted` kills happened; returns kills per point.
async fn torture(
    db_for: impl AsyncFn(usize) -> String,
    kills_wanted: usize,
    seed: u64,
) -> BTreeMap<&'static str, usize> {
    let tmp = tempfile::tempdir().unwrap();
    let (skill, model, audit, config) = skill_with_audit(tmp.path());
    let skill = skill.to_str().unwrap().to_owned();

    // The uninterrupted run, for the final state and the audit log's shape.
    let reference_db = db_for(0).await;
    let started = Instant::now();
    let out = Command::new(binary())
        .env("SKILLSTATE_CONFIG", &config)
        .args([
            "--db",
            &reference_db,
            "run",
            &skill,
            "--model",
            &model,
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full_run = started.elapsed().max(Duration::from_millis(200));
    let expected_state = final_state(&reference_db).await;
    std::fs::remove_file(&audit).unwrap();

    let mut rng = Rng(seed);
    let mut kills: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut total = 0;
    let mut task_index = 1;
    while total < kills_wanted {
        let db = db_for(task_index).await;
        task_index += 1;
        let _ = std::fs::remove_file(&audit);
        let mut observed = Observed {
            committed: BTreeMap::new(),
        };
        let mut first = true;
        loop {
            let point = POINTS[rng.below(POINTS.len() as u64) as usize];
            let count = 1 + rng.below(8);
            let delay = full_run.mul_f64(rng.below(100) as f64 / 100.0);
            let task_id = if first {
                None
            } else {
                Some(task_id(&db).await)
            };
            let args: Vec<String> = match &task_id {
                None => vec![
                    "run".into(),
                    skill.clone(),
                    "--model".into(),
                    model.clone(),
                    "--quiet".into(),
                ],
                Some(id) => vec!["resume".into(), id.clone()],
            };
            let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let killed = run_until_killed(&db, &config, &arg_refs, point, count, delay);
            first = false;
            if killed {
                *kills.entry(point).or_default() += 1;
                total += 1;
            }
            match check(&db, &mut observed).await {
                None => first = true,
                Some(TaskStatus::Completed) => break,
                Some(TaskStatus::Running) => {}
                Some(other) => panic!("the task ended {other:?}"),
            }
        }
        assert_eq!(
            final_state(&db).await,
            expected_state,
            "a resumed task must end where an uninterrupted one does"
        );
        let keys = audit_keys(&audit);
        let unique: HashSet<&String> = keys.iter().collect();
        assert_eq!(
            unique.len(),
            keys.len(),
            "an effectful action was executed twice: {keys:?}"
        );
    }
    kills
}

async fn task_id(db: &str) -> String {
    let store = skillstate_store::open(db).await.unwrap();
    store.list_tasks().await.unwrap()[0].id.clone()
}

#[tokio::test]
async fn sqlite_survives_sigkill_at_every_crash_point() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let kills = torture(
        async |i| root.join(format!("t{i}.db")).display().to_string(),
        210,
        11,
    )
    .await;
    eprintln!("sqlite kills per point: {kills:?}");
    assert!(kills.values().sum::<usize>() >= 200);
    for point in POINTS {
        assert!(
            kills.get(point).copied().unwrap_or(0) > 0,
            "no kill at {point}: {kills:?}"
        );
    }
}

/// The same harness against PostgreSQL, one schema per task.
#[tokio::test]
async fn postgres_survives_sigkill_at_every_crash_point() {
    let url = std::env::var("SKILLSTATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if url == "off" {
        common::skip::skip_test(
            "SKILLSTATE_TEST_POSTGRES_URL=off",
            "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
        );
        return;
    }
    use sqlx::Connection;
    let prefix = format!("crash_{}", std::process::id());
    let schemas = std::sync::Mutex::new(Vec::new());
    let kills = torture(
        async |i| {
            let schema = format!("{prefix}_{i}");
            let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&mut connection)
                .await
                .unwrap();
            schemas.lock().unwrap().push(schema.clone());
            format!("{url}?options=-c%20search_path%3D{schema}")
        },
        210,
        29,
    )
    .await;
    eprintln!("postgres kills per point: {kills:?}");
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    let created: Vec<String> = schemas.lock().unwrap().clone();
    for schema in &created {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut connection)
            .await
            .unwrap();
    }
    assert!(kills.values().sum::<usize>() >= 200);
    for point in POINTS {
        assert!(
            kills.get(point).copied().unwrap_or(0) > 0,
            "no kill at {point}: {kills:?}"
        );
    }
}
