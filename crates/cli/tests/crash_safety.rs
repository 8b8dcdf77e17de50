//! SIGKILL a real `skillstate run` at many points: the database must always open cleanly and
//! its last committed step must be intact (journal, state, version and hash agree). On a SQLite
//! file, and on PostgreSQL through PgBouncer in transaction mode (`transaction_pooler=true`,
//! test-support/pgbouncer.rs: the PgBouncer `scripts/test` started, else one of the test's own).
#![allow(clippy::unwrap_used)]

mod common;

#[path = "../../../test-support/pgbouncer.rs"]
mod pgbouncer;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use skillstate_core::json::state_hash;
use skillstate_store::prelude::*;
use skillstate_store::{SqliteStore, Synchronous, TaskRecord, TaskStatus, Verdict, state_at};

const KILLS: u64 = 12;

/// How long one `skillstate` command may take before the test fails (a 400-step run took about
/// 2 s on SQLite and 4 s through PgBouncer on this 2-core machine).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Waits for `child` at most `limit`; past it, kills it and fails the test.
fn wait_at_most(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The runtime's crash points the kills cycle through (a kill inside the tool needs its audit
/// log and is covered by durability.rs).
const POINTS: [&str; 4] = ["before_model", "after_model", "after_commit", "after_tool"];

/// Checks the task of a killed run in `store`: journal, state, version and hash agree for the
/// last committed step, every committed step has its intent and observation, at most the last
/// action is in flight. Returns the task.
async fn assert_last_step_intact(store: &dyn Store, what: &str) -> TaskRecord {
    let tasks = store.list_tasks().await.unwrap();
    assert_eq!(tasks.len(), 1, "{what}: one task");
    let task = store.task(&tasks[0].id).await.unwrap();
    let journal = store.journal(&task.id).await.unwrap();
    let accepted: Vec<_> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Accepted)
        .collect();
    assert_eq!(
        accepted.len() as u64,
        task.version,
        "{what}: version and journal disagree"
    );
    let rebuilt = state_at(store, &task.id, task.version, task.version)
        .await
        .unwrap();
    assert_eq!(
        rebuilt, task.state,
        "{what}: stored state differs from the journal"
    );
    if let Some(last) = accepted.last() {
        assert_eq!(
            last.state_hash.as_deref(),
            Some(state_hash(&task.state).as_str()),
            "{what}: the last step's hash"
        );
    }
    let intents = store.intents(&task.id).await.unwrap();
    assert_eq!(
        intents.len() as u64,
        task.version,
        "{what}: every committed step has its intent"
    );
    for step in 1..=task.version {
        assert!(
            store.observation(&task.id, step).await.unwrap().is_some(),
            "{what}: step {step} lost its observation"
        );
    }
    let pending = intents.iter().filter(|i| !i.done).count();
    assert!(
        pending <= 1,
        "{what}: at most the last action can be in flight"
    );
    task
}

#[tokio::test]
async fn a_killed_run_leaves_a_consistent_database() {
    let tmp = tempfile::tempdir().unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 3, 400);
    let model = format!("scripted:{}", script.display());

    // Each run kills itself with SIGKILL at a chosen crash point and step, spread over the
    // whole 400-step run; the points cycle through the runtime's crash points.
    for kill in 0..KILLS {
        let db = tmp.path().join(format!("kill-{kill}.db"));
        let point = POINTS[kill as usize % POINTS.len()];
        let hit = 1 + kill * 399 / KILLS;
        let mut child = Command::new(binary())
            .args([
                "--db",
                db.to_str().unwrap(),
                "run",
                skill.to_str().unwrap(),
                "--model",
                &model,
                "--quiet",
            ])
            .env("SKILLSTATE_FAILPOINT", format!("{point}:{hit}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let status = wait_at_most(&mut child, RUN_LIMIT, &format!("kill {kill}: the run"));
        assert_eq!(
            status.signal(),
            Some(9),
            "kill {kill}: the run must die by SIGKILL at {point}:{hit}"
        );

        let store = SqliteStore::open(db.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap();
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(integrity, "ok", "kill {kill}");
        let task = assert_last_step_intact(&store, &format!("kill {kill}")).await;
        assert!(task.version < 400, "kill {kill}: the run was cut short");
        drop(store);

        // The database stays usable by the CLI.
        let show = skillstate(&db, &["show", &task.id]);
        assert!(
            show.status.success(),
            "kill {kill}: {}",
            String::from_utf8_lossy(&show.stderr)
        );
    }
}

/// Kills through PgBouncer: fewer than on the SQLite file (one at each crash point; a step costs
/// more round trips there), each run in a role and schema of its own.
const POOLER_KILLS: u64 = 4;
/// The warehouse events (steps) of a run killed through the pooler.
const POOLER_STEPS: u32 = 400;

/// The same crash points through PgBouncer in transaction mode: `skillstate --db
/// postgres://<role>@<pgbouncer>/test?transaction_pooler=true run …` dies by SIGKILL, and the
/// store opens cleanly directly and through the pooler, both showing the last committed step
/// intact; the CLI reads it through the pooler, and after the last kill resumes the run to its
/// end. The run's role brings its schema (`search_path` set on the role: startup options cannot
/// pass a transaction pooler); role and schema are dropped after each kill, also on a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_through_pgbouncer_leaves_a_consistent_database() {
    let url = match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => {
            common::skip::skip_test(
                "SKILLSTATE_TEST_POSTGRES_URL=off",
                "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
            );
            return;
        }
        Ok(url) if !url.is_empty() => url,
        _ => "postgres://postgres@127.0.0.1:5432/test".to_owned(),
    };
    let Some(pooler) = pgbouncer::Pooler::get(&url).await.unwrap() else {
        common::skip::skip_test(&format!("{}=off", pgbouncer::POOLER_ENV), pgbouncer::ENABLE);
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (skill, script) = warehouse_copy(tmp.path(), 3, POOLER_STEPS);
    let started = Instant::now();
    for kill in 0..POOLER_KILLS {
        let role = pgbouncer::RoleSchema::create(&url, "crash_pooled")
            .await
            .unwrap();
        let run = PooledRun {
            kill,
            through: pooler
                .url_as(&role.name, "?transaction_pooler=true")
                .unwrap(),
            direct: role.direct_url(),
            skill: skill.to_str().unwrap().to_owned(),
            model: format!("scripted:{}", script.display()),
            data_dir: tmp.path().join(format!("data-{kill}")),
        };
        let outcome = tokio::spawn(run.kill_and_check()).await;
        role.drop_now().await.unwrap();
        if let Err(error) = outcome {
            std::panic::resume_unwind(error.into_panic());
        }
    }
    eprintln!(
        "{POOLER_KILLS} kills through PgBouncer in {:?}",
        started.elapsed()
    );
}

/// One killed run through the pooler.
struct PooledRun {
    kill: u64,
    /// The run's schema through PgBouncer, as its role, with `transaction_pooler=true`.
    through: String,
    /// The same schema on PostgreSQL directly.
    direct: String,
    skill: String,
    model: String,
    data_dir: std::path::PathBuf,
}

impl PooledRun {
    async fn kill_and_check(self) {
        let kill = self.kill;
        let point = POINTS[kill as usize % POINTS.len()];
        let hit = 1 + kill * u64::from(POOLER_STEPS - 1) / POOLER_KILLS;
        let started = Instant::now();
        let status = self.cli(
            &["run", &self.skill, "--model", &self.model, "--quiet"],
            Some(&format!("{point}:{hit}")),
        );
        eprintln!(
            "kill {kill}: died at {point}:{hit} after {:?}",
            started.elapsed()
        );
        assert_eq!(
            status.signal(),
            Some(9),
            "kill {kill}: the run must die by SIGKILL at {point}:{hit}"
        );

        let direct = skillstate_store::open(&self.direct).await.unwrap();
        let task =
            assert_last_step_intact(direct.as_ref(), &format!("kill {kill}, directly")).await;
        assert!(
            task.version < u64::from(POOLER_STEPS),
            "kill {kill}: the run was cut short"
        );
        let pooled = skillstate_store::open(&self.through).await.unwrap();
        let seen =
            assert_last_step_intact(pooled.as_ref(), &format!("kill {kill}, through PgBouncer"))
                .await;
        assert_eq!(seen, task, "kill {kill}: the pooler shows another task");
        direct.release().await;
        pooled.release().await;

        // The store stays usable by the CLI through the pooler.
        let status = self.cli(&["show", &task.id], None);
        assert!(
            status.success(),
            "kill {kill}: `show` failed: {}",
            self.stderr()
        );
        if kill + 1 == POOLER_KILLS {
            let started = Instant::now();
            let status = self.cli(&["resume", &task.id], None);
            eprintln!(
                "kill {kill}: resumed from step {} to the end in {:?}",
                task.version,
                started.elapsed()
            );
            assert!(
                status.success(),
                "kill {kill}: `resume` failed: {}",
                self.stderr()
            );
            let store = skillstate_store::open(&self.through).await.unwrap();
            let done =
                assert_last_step_intact(store.as_ref(), &format!("kill {kill}, resumed")).await;
            assert_eq!(done.status, TaskStatus::Completed, "kill {kill}: resumed");
            assert!(done.version > task.version, "kill {kill}: resumed");
            store.release().await;
        }
    }

    /// `skillstate --db <through the pooler> <args>`, at most `RUN_LIMIT`; its stderr is kept
    /// for [`Self::stderr`].
    fn cli(&self, args: &[&str], failpoint: Option<&str>) -> ExitStatus {
        std::fs::create_dir_all(&self.data_dir).unwrap();
        let stderr = std::fs::File::create(self.stderr_path()).unwrap();
        let mut command = Command::new(binary());
        command
            .args(["--db", &self.through])
            .args(args)
            .env("SKILLSTATE_DATA_DIR", &self.data_dir)
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(failpoint) = failpoint {
            command.env("SKILLSTATE_FAILPOINT", failpoint);
        }
        let mut child = command.spawn().unwrap();
        wait_at_most(
            &mut child,
            RUN_LIMIT,
            &format!("kill {}: skillstate {}", self.kill, args.join(" ")),
        )
    }

    fn stderr_path(&self) -> std::path::PathBuf {
        Path::new(&self.data_dir).join("stderr.txt")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }
}
