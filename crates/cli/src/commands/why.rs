//! `skillstate show <task> --why POINTER [--all]`: why the task's state holds what it holds at
//! a location — each step that wrote it, newest first, with the value it left, its patch, the
//! observation the model was answering and who wrote it. Read through the runtime's
//! `provenance`, which replays the journal and redacts write-only values for the task's reader.

use std::process::ExitCode;

use anyhow::Result;
use serde_json::Value;
use skillstate_runtime::RuntimeError;
use skillstate_runtime::provenance::{Author, Provenance, ProvenanceWrite, provenance};
use skillstate_store::{Store, TaskRecord};

use crate::render::format_time;

/// The longest observation or patch a write shows, in characters (`show --step N
/// --observation` prints an observation whole).
const SHOWN_CHARS: usize = 400;

pub async fn run(
    store: &dyn Store,
    task: &TaskRecord,
    pointer: &str,
    all: bool,
) -> Result<ExitCode> {
    let found = match provenance(store, task, pointer, all).await {
        Ok(found) => found,
        Err(error @ RuntimeError::BadPointer { .. }) => {
            errln!("error: --why: {error}");
            return Ok(ExitCode::from(2));
        }
        Err(error) => return Err(error.into()),
    };
    if found.current.is_none() && found.writes.is_empty() {
        let kept = if found.kept_from > 1 {
            format!(
                ", and no step the journal keeps (steps {} on; gc compacted the older ones) wrote it",
                found.kept_from
            )
        } else {
            ", and no step ever wrote it".to_owned()
        };
        errln!(
            "error: the state of task {} has no value at {}{kept}; `skillstate show {}` prints the state, whose locations --why takes",
            task.id,
            shown_pointer(pointer),
            task.id
        );
        return Ok(ExitCode::FAILURE);
    }
    print(task, &found, all);
    Ok(ExitCode::SUCCESS)
}

fn print(task: &TaskRecord, found: &Provenance, all: bool) {
    let pointer = shown_pointer(&found.pointer);
    outln!("{pointer} in task {}", task.id);
    outln!("now      {}", value_text(found.current.as_ref()));
    if found.writes.is_empty() {
        if found.kept_from > 1 {
            outln!(
                "no step the journal keeps wrote it: it was set at or before step {}, the oldest kept (gc compacted the steps before)",
                found.kept_from - 1
            );
        } else {
            outln!("no step wrote it: it is the skill's initial state (step 0)");
        }
        return;
    }
    let which = if all {
        "every step that wrote it"
    } else {
        "the steps since it last changed"
    };
    outln!(
        "{which}, newest first ({}):",
        count(found.writes.len(), "write")
    );
    for write in &found.writes {
        outln!();
        print_write(write);
    }
    if found.older_writes > 0 {
        outln!(
            "\n… and {} older (not listed)",
            count(found.older_writes as usize, "write")
        );
    }
    if !all {
        outln!("\n--all lists every past value");
    } else if found.kept_from > 1 {
        outln!(
            "\nsteps before {} were compacted by gc and are not listed",
            found.kept_from
        );
    }
}

fn print_write(write: &ProvenanceWrite) {
    outln!(
        "step {}  {}  by {}",
        write.step,
        format_time(write.created_at),
        author_text(&write.author)
    );
    outln!("  value        {}", value_text(write.value.as_ref()));
    let patch = serde_json::to_string(&write.patch).unwrap_or_default();
    outln!("  patch        {}", clip(&patch));
    match &write.observation {
        Some(observation) => {
            let shown = clip(&one_line(observation));
            outln!("  observation  {shown}");
            if shown.ends_with('…') {
                outln!(
                    "               (cut; `skillstate show <task> --step {} --observation` prints it whole)",
                    write.step
                );
            }
        }
        None => outln!("  observation  - (none recorded)"),
    }
}

fn author_text(author: &Author) -> String {
    match author {
        Author::Model { model } => format!("the model ({model})"),
        Author::ApiKey { key } => format!("API key {key} (a state PATCH through the service)"),
    }
}

fn value_text(value: Option<&Value>) -> String {
    match value {
        Some(value) => clip(&value.to_string()),
        None => "nothing (no value there)".to_owned(),
    }
}

fn shown_pointer(pointer: &str) -> &str {
    if pointer.is_empty() {
        "\"\" (the whole state)"
    } else {
        pointer
    }
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn one_line(text: &str) -> String {
    text.trim_end()
        .replace("\r\n", " ⏎ ")
        .replace(['\n', '\r'], " ⏎ ")
}

fn clip(text: &str) -> String {
    if text.chars().count() <= SHOWN_CHARS {
        return text.to_owned();
    }
    let kept: String = text.chars().take(SHOWN_CHARS - 1).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_one_line_and_bounded() {
        assert_eq!(one_line("a\nb\r\nc\n"), "a ⏎ b ⏎ c");
        let long = clip(&"x".repeat(1000));
        assert!(long.chars().count() == SHOWN_CHARS && long.ends_with('…'));
        assert_eq!(value_text(None), "nothing (no value there)");
        assert_eq!(value_text(Some(&serde_json::json!("a"))), "\"a\"");
        assert_eq!(count(1, "write"), "1 write");
        assert_eq!(count(3, "write"), "3 writes");
    }
}
