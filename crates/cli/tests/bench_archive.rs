//! `skillstate bench warehouse --archive` as a user runs it: the real binary, from the
//! repository root, on the shipped skills/warehouse-archive.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bench_archive_prints_the_four_arms_and_writes_its_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("archive-out");
    let db = tmp.path().join("unused.db");
    let bench = skillstate(
        &db,
        &[
            "bench",
            "warehouse",
            "--archive",
            "--horizons",
            "120",
            "--seeds",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = text(&bench.stdout);
    assert!(bench.status.success(), "{}\n{stdout}", text(&bench.stderr));
    for arm in ["state+recall", "state", "window", "summary"] {
        assert!(stdout.contains(&format!("| {arm} ")), "{stdout}");
    }
    assert!(
        stdout.contains("state+recall at T = 120: score 1.000 (bar ≥ 0.95: met)"),
        "{stdout}"
    );
    for file in ["archive.json", "archive.md", "archive_prompt_tokens.svg"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    // The archive bench runs on its own in-memory stores: the database named is never made.
    assert!(!db.exists());

    // Options that belong to the strategy table are refused with --archive.
    let mixed = skillstate(&db, &["bench", "warehouse", "--archive", "--drift"]);
    assert_eq!(mixed.status.code(), Some(2), "{}", text(&mixed.stderr));
    let other = skillstate(&db, &["bench", "repository", "--archive"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(
        text(&other.stderr).contains("run `bench warehouse --archive`"),
        "{}",
        text(&other.stderr)
    );
}
