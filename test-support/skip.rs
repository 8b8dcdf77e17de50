//! Visible skips, for tests that need something from outside the repository: a PostgreSQL
//! server, the third-party MCP test servers, a live model server.
//!
//! A test crate includes this file (it is not a crate, so nothing depends on it):
//!
//! ```ignore
//! #[path = "../../../test-support/skip.rs"]
//! mod skip;
//! ```
//!
//! A test that cannot run calls [`skip_test`] (or [`skip_part`] for part of a suite) and
//! returns. libtest still reports it `ok`, so the skip is also written as one line, in a file of
//! its own, to the skip directory: `$SKILLSTATE_TEST_SKIP_DIR`, else `target/test-skips`.
//! `scripts/test` empties that directory before `cargo test` and prints every line after it
//! ("SKIPPED n: ..."), keeping cargo's exit status.
#![allow(dead_code)]

use std::path::PathBuf;

/// The running test (named by libtest's thread) skips itself because of `reason`; `enable` says
/// how to make it run.
pub fn skip_test(reason: &str, enable: &str) {
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => "(a test)".to_owned(),
    };
    record(&test, reason, enable);
}

/// `part` of this test binary (for example "the PostgreSQL half of every test") is skipped.
pub fn skip_part(part: &str, reason: &str, enable: &str) {
    record(part, reason, enable);
}

fn record(what: &str, reason: &str, enable: &str) {
    let line = format!(
        "{} {}: {what}: {reason}; {enable}",
        env!("CARGO_PKG_NAME"),
        env!("CARGO_CRATE_NAME")
    );
    eprintln!("SKIPPED {line}");
    let dir = skip_dir();
    let name: String = format!(
        "{}.{}.{what}",
        env!("CARGO_PKG_NAME"),
        env!("CARGO_CRATE_NAME")
    )
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || c == '.' {
            c
        } else {
            '_'
        }
    })
    .collect();
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.skip")), format!("{line}\n")));
    if let Err(error) = written {
        eprintln!(
            "(the skip could not be recorded in {}: {error})",
            dir.display()
        );
    }
}

fn skip_dir() -> PathBuf {
    match std::env::var_os("SKILLSTATE_TEST_SKIP_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        // target/tmp for integration tests and benches: its parent is the target directory.
        _ => PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("..")
            .join("test-skips"),
    }
}
