//! `skillstate search`: a task's journal searched as a person asks it (docs/recall.md, "Recall and
//! provenance"). Hits are read through the runtime's `RecallReader`, the one reader every
//! search goes through, so a write-only value is never printed and a hit that matched only
//! through one is never listed.

use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;
use skillstate_core::recall::{HitCursor, RecallHit, RecallKind, RecallQuery};
use skillstate_runtime::RecallReader;

use crate::render::Table;

/// The most hits one page may ask for.
const MAX_LIMIT: usize = 500;
/// The longest text a row of the table shows, in characters (`--json` prints texts whole).
const SHOWN_CHARS: usize = 160;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum KindArg {
    Observation,
    Reasoning,
    Action,
    State,
}

impl From<KindArg> for RecallKind {
    fn from(kind: KindArg) -> Self {
        match kind {
            KindArg::Observation => RecallKind::Observation,
            KindArg::Reasoning => RecallKind::Reasoning,
            KindArg::Action => RecallKind::Action,
            KindArg::State => RecallKind::State,
        }
    }
}

#[derive(clap::Args)]
pub struct SearchArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Words to find; every one must match (`item_4298` matches the words item and 4298 in a
    /// row). Optional with --pointer.
    words: Vec<String>,
    /// Only the state writes at or below this JSON pointer (`/inventory/shelf_122`).
    #[arg(long)]
    pointer: Option<String>,
    /// Only entries of this kind; repeat for several (default: every kind).
    #[arg(long = "kind", value_enum)]
    kinds: Vec<KindArg>,
    /// Only steps from this one on.
    #[arg(long, value_name = "STEP")]
    from_step: Option<u64>,
    /// Only steps up to this one.
    #[arg(long, value_name = "STEP")]
    to_step: Option<u64>,
    /// Hits per page (1 to 500).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Oldest first instead of newest first.
    #[arg(long)]
    oldest_first: bool,
    /// The next page: the cursor a previous page printed.
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
    /// One JSON object: `{"task", "hits": [{step, kind, pointer?, text}], "next"}`.
    #[arg(long)]
    json: bool,
}

/// A search the user asked for wrongly: the flag or argument, and what to do.
#[derive(Debug)]
pub struct Usage {
    flag: String,
    message: String,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.flag, self.message)
    }
}

fn usage(flag: &str, message: impl Into<String>) -> Usage {
    Usage {
        flag: flag.to_owned(),
        message: message.into(),
    }
}

pub async fn run(db: &str, args: SearchArgs) -> Result<ExitCode> {
    let (query, after) = match query_of(&args) {
        Ok(parsed) => parsed,
        Err(problem) => {
            errln!("error: {problem}");
            errln!("see `skillstate search --help`");
            return Ok(ExitCode::from(2));
        }
    };
    let store = crate::config::open_existing(db).await?;
    let task = store.task(&args.task).await?;
    let reader = RecallReader::of_task(store.as_ref(), &task).await?;
    let page = reader
        .search(store.as_ref(), &task.id, &query, after, query.limit)
        .await?;
    let next = page.next.map(cursor_text);
    if args.json {
        let out = json!({"task": task.id, "hits": page.hits, "next": next});
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    print_hits(&task.id, &query, &page.hits, args.after.is_some());
    if let Some(next) = next {
        let instead = args
            .after
            .as_deref()
            .map(|given| format!(" (in place of --after {given})"))
            .unwrap_or_default();
        outln!(
            "more matches exist: run the same command with --after {next}{instead} for the next page"
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_hits(task: &str, query: &RecallQuery, hits: &[RecallHit], later_page: bool) {
    let described = query.describe();
    if hits.is_empty() {
        let more = if later_page { " after that cursor" } else { "" };
        outln!("no matches for {described} in task {task}{more}");
        return;
    }
    let order = if query.oldest_first {
        "oldest first"
    } else {
        "newest first"
    };
    outln!(
        "{} match(es) for {described} in task {task}, {order}:",
        hits.len()
    );
    let mut table = Table::new(&["STEP", "KIND", "TEXT"]);
    let mut cut = false;
    for hit in hits {
        let (text, was_cut) = one_line(&hit.text, SHOWN_CHARS);
        cut |= was_cut;
        table.row(vec![
            hit.step.to_string(),
            hit.kind.as_str().to_owned(),
            text,
        ]);
    }
    out!("{}", table.render());
    if cut {
        outln!("(long texts cut to {SHOWN_CHARS} characters; --json prints them whole)");
    }
}

/// `text` on one line (line breaks shown as ⏎), cut to `max` characters.
fn one_line(text: &str, max: usize) -> (String, bool) {
    let flat = text.replace("\r\n", " ⏎ ").replace(['\n', '\r'], " ⏎ ");
    if flat.chars().count() <= max {
        return (flat, false);
    }
    let kept: String = flat.chars().take(max - 1).collect();
    (format!("{kept}…"), true)
}

/// The query and the page start the flags ask for, or the flag that is wrong.
fn query_of(args: &SearchArgs) -> Result<(RecallQuery, Option<HitCursor>), Usage> {
    let words = args.words.join(" ");
    let words = (!args.words.is_empty()).then_some(words.as_str());
    if words.is_none() && args.pointer.is_none() {
        return Err(usage(
            "WORDS",
            "give words to search for, --pointer /a/state/location, or both",
        ));
    }
    let mut query = RecallQuery::new(words, args.pointer.as_deref()).map_err(|problem| {
        let flag = match problem.field.as_str() {
            "pointer" => "--pointer",
            _ => "WORDS",
        };
        usage(flag, problem.message)
    })?;
    let kinds: Vec<RecallKind> = args.kinds.iter().map(|k| RecallKind::from(*k)).collect();
    if query.pointer.is_some() {
        if let Some(other) = kinds.iter().find(|k| **k != RecallKind::State) {
            return Err(usage(
                "--kind",
                format!(
                    "--pointer finds state writes only, not {}; leave out --kind or give --kind state",
                    other.as_str()
                ),
            ));
        }
    } else {
        let mut kinds = kinds;
        kinds.sort();
        kinds.dedup();
        query.kinds = kinds;
    }
    if let (Some(from), Some(to)) = (args.from_step, args.to_step)
        && from > to
    {
        return Err(usage(
            "--from-step",
            format!("is after --to-step ({from} > {to}); give a range from the earlier step"),
        ));
    }
    for (flag, step) in [("--from-step", args.from_step), ("--to-step", args.to_step)] {
        if step.is_some_and(|s| s > i64::MAX as u64) {
            return Err(usage(flag, "is beyond any step a journal can hold"));
        }
    }
    query.from_step = args.from_step;
    query.to_step = args.to_step;
    if args.limit == 0 || args.limit > MAX_LIMIT {
        return Err(usage(
            "--limit",
            format!(
                "must be 1 to {MAX_LIMIT} (got {}); page on with --after",
                args.limit
            ),
        ));
    }
    query.limit = args.limit;
    query.oldest_first = args.oldest_first;
    let after = args
        .after
        .as_deref()
        .map(|text| {
            parse_cursor(text).ok_or_else(|| {
                usage(
                    "--after",
                    format!(
                        "`{text}` is not a cursor; give the one a previous page printed (STEP:ENTRY, such as 12:345)"
                    ),
                )
            })
        })
        .transpose()?;
    Ok((query, after))
}

/// A cursor as printed: `STEP:ENTRY`, the last hit's step and index entry.
pub fn cursor_text(cursor: HitCursor) -> String {
    format!("{}:{}", cursor.step, cursor.id)
}

fn parse_cursor(text: &str) -> Option<HitCursor> {
    let (step, id) = text.trim().split_once(':')?;
    let step: u64 = step.parse().ok()?;
    let id: i64 = id.parse().ok()?;
    (step <= i64::MAX as u64 && id >= 0).then_some(HitCursor { step, id })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SearchArgs,
    }

    fn parse(line: &[&str]) -> Result<(RecallQuery, Option<HitCursor>), Usage> {
        let cli = Cli::try_parse_from(std::iter::once("search").chain(line.iter().copied()))
            .expect("clap accepts the line");
        query_of(&cli.args)
    }

    #[test]
    fn flags_become_a_query() {
        let (query, after) = parse(&[
            "t1",
            "item_4298",
            "shelf",
            "--kind",
            "state",
            "--kind",
            "observation",
            "--from-step",
            "2",
            "--to-step",
            "9",
            "--limit",
            "3",
            "--oldest-first",
            "--after",
            "7:41",
        ])
        .expect("query");
        assert_eq!(query.words, vec!["item_4298", "shelf"]);
        assert_eq!(
            query.kinds,
            vec![RecallKind::Observation, RecallKind::State]
        );
        assert_eq!((query.from_step, query.to_step), (Some(2), Some(9)));
        assert_eq!(query.limit, 3);
        assert!(query.oldest_first);
        assert_eq!(after, Some(HitCursor { step: 7, id: 41 }));
        let (query, _) = parse(&["t1", "--pointer", "/inventory"]).expect("query");
        assert_eq!(query.kinds, vec![RecallKind::State]);
        assert!(query.words.is_empty());
    }

    #[test]
    fn a_bad_query_names_its_flag() {
        for (line, flag) in [
            (&["t1"][..], "WORDS"),
            (&["t1", "..."][..], "WORDS"),
            (&["t1", "--pointer", "inventory"][..], "--pointer"),
            (
                &["t1", "--pointer", "/a", "--kind", "observation"][..],
                "--kind",
            ),
            (
                &["t1", "x", "--from-step", "9", "--to-step", "3"][..],
                "--from-step",
            ),
            (&["t1", "x", "--limit", "0"][..], "--limit"),
            (&["t1", "x", "--limit", "501"][..], "--limit"),
            (&["t1", "x", "--after", "nope"][..], "--after"),
            (&["t1", "x", "--after", "3:-1"][..], "--after"),
        ] {
            let problem = parse(line).expect_err("refused");
            assert_eq!(problem.flag, flag, "{line:?}: {problem}");
        }
    }

    #[test]
    fn cursors_round_trip_and_texts_stay_on_one_line() {
        let cursor = HitCursor { step: 12, id: 345 };
        assert_eq!(parse_cursor(&cursor_text(cursor)), Some(cursor));
        assert_eq!(one_line("a\nb\r\nc", 80), ("a ⏎ b ⏎ c".to_owned(), false));
        let (cut, was_cut) = one_line(&"é".repeat(200), 10);
        assert!(was_cut && cut.chars().count() == 10 && cut.ends_with('…'));
    }
}
