//! The guide's walk-through (docs/admin-panel.md) ("Example: the admin-panel agent"), run as written: each block of
//! commands through `bash` with the built `skillstate` first on `PATH`, `<task>` replaced by
//! the task's id, and everything it prints pinned by a snapshot (ids redacted), so the
//! guide's printed output can be checked against them.

use std::path::Path;
use std::process::Command;

use super::common;
use super::{FIRST, SECOND, asked, assert_settled, look, task_id, text};

/// The walk-through's commands as the guide writes them.
const RUN: &str = r#"skillstate run skills/post-scheduler --model scripted:skills/post-scheduler/examples/demo.jsonl \
  --input "Prepare a post about the launch of the new product and schedule it for October 15""#;
const APPROVE: &str = "skillstate approve <task>";
const FOLLOW_UP: &str = r#"skillstate say <task> "Let's move the publication to October 20"
skillstate approve <task>"#;
const ONE_FIELD: &str = r#"diff <(skillstate show <task> --step 5 2>/dev/null) <(skillstate show <task> --step 7 2>/dev/null)
skillstate show <task> --step 7 --prompt 2>/dev/null | grep -c -e 2026-10-15 -e "October 15""#;
const ORACLE_RUN: &str = r#"skillstate run skills/post-scheduler --model oracle -q \
  --input "Prepare a post about the launch of the new product and schedule it for October 15""#;
const WITH_APPROVAL: &str = r#"skillstate say <task> "Let's move the publication to October 20" --no-run
skillstate approve <task>"#;

/// Runs `script` (with `<task>` replaced by `task`) as the guide's reader would, both
/// streams in one, as a terminal shows them; requires success.
fn sh(db: &Path, script: &str, task: &str) -> String {
    let bin = Path::new(common::binary()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = script.replace("<task>", task);
    let out = Command::new("bash")
        .current_dir(common::repo_root())
        .env("SKILLSTATE_DB", db)
        .env("PATH", path)
        .args(["-c", &format!("set -o pipefail; {{\n{script}\n}} 2>&1")])
        .output()
        .unwrap();
    // `grep -c` exits 1 when it counts 0, which is what the last block expects.
    let printed = text(&out.stdout);
    assert!(
        out.status.success() || script.contains("grep -c"),
        "{script}\n{printed}{}",
        text(&out.stderr)
    );
    printed
}

macro_rules! snapshot {
    ($name:expr, $value:expr) => {{
        insta::with_settings!({filters => vec![
            (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[TASK]"),
            (r"in [^ ]*\.db\)", "in skillstate.db)"),
        ]}, { insta::assert_snapshot!($name, $value); });
    }};
}

#[test]
fn the_readme_walk_through_prints_what_the_readme_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("skillstate.db");
    let run = sh(&db, RUN, "");
    snapshot!("walk_through_run", &run);
    let id = task_id(&run);
    snapshot!("walk_through_approve", sh(&db, APPROVE, &id));
    snapshot!("walk_through_follow_up", sh(&db, FOLLOW_UP, &id));
    let one_field = sh(&db, ONE_FIELD, &id);
    assert!(one_field.ends_with("\n0\n"), "{one_field}");
    snapshot!("walk_through_one_field", one_field);
    assert_settled(
        &look(&db, &id),
        SECOND,
        &[
            asked("save_post", FIRST, Some(true)),
            asked("schedule_post", SECOND, Some(true)),
        ],
    );

    // A correction that waits with the approval comes first: nothing is saved for the 15th.
    let db = tmp.path().join("with-approval.db");
    let run = sh(&db, ORACLE_RUN, "");
    snapshot!("walk_through_oracle_run", &run);
    let id = task_id(&run);
    snapshot!("walk_through_with_approval", sh(&db, WITH_APPROVAL, &id));
    snapshot!("walk_through_with_approval_saved", sh(&db, APPROVE, &id));
    assert_settled(
        &look(&db, &id),
        SECOND,
        &[
            asked("save_post", FIRST, Some(false)),
            asked("save_post", SECOND, Some(true)),
        ],
    );
}
