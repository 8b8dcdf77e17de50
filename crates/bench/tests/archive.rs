//! `bench warehouse --archive` end to end with the oracle on the shipped warehouse-archive
//! skill: every arm through the real runtime, the real `recall` tool reading the run's own
//! SQLite journal; the arms' relations, determinism and the outputs.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use serde_json::Value;
use skillstate_bench::archive::{
    ArchiveConfig, ArchiveReport, Arm, DEFAULT_ARCHIVE_BUDGET, run_archive, write_archive_outputs,
};

fn skill_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse-archive")
}

fn config(horizon: u32, arms: &[Arm]) -> ArchiveConfig {
    ArchiveConfig {
        horizons: vec![horizon],
        seeds: vec![0],
        arms: arms.to_vec(),
        budget: DEFAULT_ARCHIVE_BUDGET,
        model: "oracle".into(),
        state_tokens: 2000,
        jobs: 2,
    }
}

fn run(config: &ArchiveConfig) -> ArchiveReport {
    run_archive(&skill_dir(), config, None, &|_, _| {}).unwrap()
}

#[test]
fn recall_keeps_the_state_bounded_and_the_score_whole() {
    let report = run(&config(400, &Arm::ALL));
    assert_eq!(report.runs.len(), 4);
    for run in &report.runs {
        assert!(run.completed(), "{:?}: {:?}", run.spec, run.failure);
        assert_eq!(run.rejected_answers, 0, "{:?}", run.spec);
        assert_eq!(run.prompt_tokens_per_step.len() as u64, run.steps);
        assert!(run.prompt_first_100.is_some() && run.step_time_ratio.is_some());
    }
    let arm = |arm: Arm| report.group(400, arm).unwrap();
    let recall = arm(Arm::StateRecall);
    // The oracle with recall handles every event, and each recall costs exactly one step.
    assert_eq!(recall.score.mean, 1.0);
    let run = &report.runs[0];
    assert_eq!(run.spec.arm, Arm::StateRecall);
    assert!(run.recall_calls > 30, "{} recalls", run.recall_calls);
    assert_eq!(run.steps, 400 + run.recall_calls);
    assert_eq!(run.tool_errors, 0);
    // Without recall, what the bounded state evicted is gone; the transcripts lose it too.
    for other in [Arm::State, Arm::Window, Arm::Summary] {
        let g = arm(other);
        assert!(g.score.mean < 0.95, "{other:?}: {}", g.score.mean);
        assert_eq!(g.recalls_per_event, 0.0);
        assert_eq!(g.steps_per_event, 1.0);
    }
    // State prompts stay bounded: no recall result or index entry beyond the budgets.
    assert!(recall.prompt_max < 3_000.0, "{}", recall.prompt_max);
    assert!(arm(Arm::Window).prompt_max <= DEFAULT_ARCHIVE_BUDGET as f64);
    let table = report.table();
    for name in Arm::NAMES {
        assert!(table.contains(name), "{table}");
    }
    assert!(
        table.contains("state+recall at T = 400: score 1.000"),
        "{table}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let written = write_archive_outputs(&report, tmp.path()).unwrap();
    assert_eq!(written.len(), 3);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("archive.json")).unwrap())
            .unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 4);
    assert_eq!(json["runs"][0]["arm"], "state+recall");
    let svg = std::fs::read_to_string(tmp.path().join("archive_prompt_tokens.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    let markdown = std::fs::read_to_string(tmp.path().join("archive.md")).unwrap();
    assert!(
        markdown.contains("| 400 | state+recall | 1.000"),
        "{markdown}"
    );
}

#[test]
fn the_same_seed_gives_the_same_figures() {
    let config = config(150, &[Arm::StateRecall, Arm::State]);
    let (a, b) = (run(&config), run(&config));
    for (x, y) in a.runs.iter().zip(&b.runs) {
        assert_eq!(x.spec, y.spec);
        assert_eq!(
            (x.score, x.steps, x.recall_calls, x.total_tokens),
            (y.score, y.steps, y.recall_calls, y.total_tokens)
        );
        assert_eq!(x.prompt_tokens_per_step, y.prompt_tokens_per_step);
    }
}

#[test]
fn a_skill_of_another_environment_is_refused_with_what_to_pass() {
    let warehouse = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/warehouse");
    let error = run_archive(&warehouse, &config(10, &[Arm::State]), None, &|_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("not the `warehouse-archive` environment")
            && error.contains("--skill skills/warehouse-archive"),
        "{error}"
    );
}
