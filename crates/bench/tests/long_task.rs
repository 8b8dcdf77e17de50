//! The long-task curve end to end on a real SQLite file: one task runs all its steps, every
//! step is timed, and the steady workload really keeps the state (and so the prompt) the same
//! size from the first window to the last. No timing is asserted.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use skillstate_bench::long_task::{CurveConfig, CurveModel, run_curve};
use skillstate_core::ContextStrategy;

fn skill_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse")
}

fn config(dir: &Path, steps: u32, model: CurveModel) -> CurveConfig {
    CurveConfig {
        steps,
        model,
        seed: 0,
        strategy: ContextStrategy::State,
        full_sync: true,
        dir: dir.to_path_buf(),
    }
}

#[tokio::test]
async fn a_steady_long_task_runs_every_step_with_a_fixed_prompt_size() {
    let tmp = tempfile::tempdir().unwrap();
    let report = run_curve(
        &skill_dir(),
        &config(tmp.path(), 400, CurveModel::Steady),
        Box::new(|_| {}),
    )
    .await
    .unwrap();
    assert_eq!(report.status, "completed");
    assert_eq!(report.steps, 400);
    assert_eq!(report.step_ms.len(), 400);
    assert_eq!(report.step_cpu_ms.len(), 400);
    assert!(report.step_ms.iter().all(|ms| *ms >= 0.0));
    assert_eq!(
        (report.early.first_step, report.early.last_step),
        (101, 200)
    );
    assert_eq!((report.late.first_step, report.late.last_step), (301, 400));
    assert!(report.early.median_ms > 0.0 && report.late.median_ms > 0.0);
    // The state alternates between two sizes one item apart: the medians stay within a few
    // tokens, whatever the episode's own inventory does.
    assert!(report.early.prompt_tokens > 1000.0);
    assert!(
        (report.early.prompt_tokens - report.late.prompt_tokens).abs() <= 10.0,
        "{} vs {}",
        report.early.prompt_tokens,
        report.late.prompt_tokens
    );
    assert_eq!(report.blocks.len(), 10);
    assert!(report.text().contains("ratio late/early"));
    // The SQLite file and its WAL are gone.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn the_oracle_long_task_runs_the_real_episode() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(tmp.path(), 300, CurveModel::Oracle);
    config.full_sync = false;
    let report = run_curve(&skill_dir(), &config, Box::new(|_| {}))
        .await
        .unwrap();
    assert_eq!(report.status, "completed");
    assert_eq!(report.steps, 300);
}

#[tokio::test]
async fn too_short_a_long_task_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let error = run_curve(
        &skill_dir(),
        &config(tmp.path(), 299, CurveModel::Steady),
        Box::new(|_| {}),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("300 to 100000 steps"), "{error}");
}
