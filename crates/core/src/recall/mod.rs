//! Recall over a task's journal (docs/recall.md, "Recall and provenance"): what of a committed step is
//! indexed, how a query reads, and how an indexed entry becomes text for one reader.
//!
//! The store indexes each step in the transaction that commits it; the entries are built here
//! ([`step_entries`]) from exactly what the journal keeps, so replaying a journal rebuilds the
//! same index. The index holds what the journal holds (redacted already by the runtime); what a
//! reader may see of it is decided only when a hit is read, by [`RawHit::reveal`]: a state
//! write at a write-only location is never shown, free text loses every write-only value the
//! reader knows, and a hit that matched only through such a value is dropped, so a query
//! cannot even learn that one exists.

mod query;
mod render;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::escape_token;
use crate::output::parse_output;
use crate::write_only::{SecretValues, WriteOnly};

pub use query::{
    ANCHOR_MIN_CHARS, IndexWord, MAX_LIMIT, MAX_WORDS, QueryProblem, RecallQuery, tokens_of,
};
pub use render::{HITS_NOT_SHOWN, render_hits};

/// The built-in tool's name (and source) in `[tools] allow`.
pub const RECALL_TOOL: &str = "recall";

/// The longest text one entry keeps in the index, in bytes (cut at a character boundary). An
/// observation keeps its first 16,384 characters (the stores' triggers cut it): a 10 MB tool
/// result is found by its beginning.
pub const ENTRY_TEXT_BYTES: usize = 16 * 1024;

/// The most state writes one step adds to the index; a patch that writes more leaves the rest
/// to the journal (provenance still finds them).
pub const MAX_STATE_ENTRIES: usize = 256;

/// The longest value a state entry shows, in bytes.
const STATE_VALUE_BYTES: usize = 1024;

/// What an index entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecallKind {
    /// The observation a step started from: a tool's result, an event, a user's message.
    Observation,
    /// The reasoning the model wrote with an accepted answer.
    Reasoning,
    /// The action of an accepted step: `tool {args}`.
    Action,
    /// One location an accepted step's patch wrote: `/pointer = value` or `/pointer removed`.
    State,
}

impl RecallKind {
    pub const ALL: [RecallKind; 4] = [
        RecallKind::Observation,
        RecallKind::Reasoning,
        RecallKind::Action,
        RecallKind::State,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecallKind::Observation => "observation",
            RecallKind::Reasoning => "reasoning",
            RecallKind::Action => "action",
            RecallKind::State => "state",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// One entry a store writes into its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub kind: RecallKind,
    /// For a state entry: the location written.
    pub pointer: Option<String>,
    pub text: String,
}

/// The entries of one accepted step: its reasoning, its action and the locations its patch
/// wrote, from the journal row's `output`, `action` and `patch` as stored.
pub fn step_entries(
    output: &str,
    patch: Option<&Value>,
    action: Option<&Value>,
) -> Vec<IndexEntry> {
    let mut entries = Vec::new();
    if let Ok(parsed) = parse_output(output) {
        let reasoning = parsed.reasoning.trim();
        if !reasoning.is_empty() {
            entries.push(IndexEntry {
                kind: RecallKind::Reasoning,
                pointer: None,
                text: bounded(reasoning, ENTRY_TEXT_BYTES),
            });
        }
    }
    if let Some(action) = action
        && let Some(tool) = action.get("tool").and_then(Value::as_str)
    {
        let args = action.get("args").cloned().unwrap_or(Value::Null);
        entries.push(IndexEntry {
            kind: RecallKind::Action,
            pointer: None,
            text: bounded(&format!("{tool} {args}"), ENTRY_TEXT_BYTES),
        });
    }
    if let Some(patch) = patch {
        let mut writes = Vec::new();
        state_writes(patch, "", &mut writes);
        entries.extend(writes.into_iter().take(MAX_STATE_ENTRIES));
    }
    entries
}

/// The entries of a board member's step's board write: its locations under `/board`, where
/// the member's prompts show the board.
pub fn board_entries(patch: &Value) -> Vec<IndexEntry> {
    let mut writes = Vec::new();
    state_writes(patch, "/board", &mut writes);
    writes.truncate(MAX_STATE_ENTRIES);
    writes
}

/// The locations a patch writes, with what it writes there: a merge patch's members down to
/// its leaves (a non-empty object merges into its location), a JSON Patch's operations (an
/// object added or replaced whole shows its leaves too).
fn state_writes(patch: &Value, prefix: &str, out: &mut Vec<IndexEntry>) {
    match patch {
        Value::Object(map) => merge_writes(map, prefix, out),
        Value::Array(ops) => {
            for op in ops {
                let path = &format!(
                    "{prefix}{}",
                    op.get("path").and_then(Value::as_str).unwrap_or("")
                );
                match op.get("op").and_then(Value::as_str) {
                    Some("add" | "replace") => {
                        let value = op.get("value").unwrap_or(&Value::Null);
                        value_writes(path, value, out);
                    }
                    Some("remove") => out.push(state(path, format!("{path} removed"))),
                    Some(verb @ ("move" | "copy")) => {
                        let from = &format!(
                            "{prefix}{}",
                            op.get("from").and_then(Value::as_str).unwrap_or("")
                        );
                        let past = if verb == "move" { "moved" } else { "copied" };
                        if verb == "move" {
                            out.push(state(from, format!("{from} removed (moved to {path})")));
                        }
                        out.push(state(path, format!("{path} {past} from {from}")));
                    }
                    _ => {}
                }
                if out.len() >= MAX_STATE_ENTRIES {
                    return;
                }
            }
        }
        _ => {}
    }
}

fn merge_writes(map: &serde_json::Map<String, Value>, parent: &str, out: &mut Vec<IndexEntry>) {
    for (key, value) in map {
        if out.len() >= MAX_STATE_ENTRIES {
            return;
        }
        let pointer = format!("{parent}/{}", escape_token(key));
        match value {
            Value::Null => out.push(state(&pointer, format!("{pointer} removed"))),
            Value::Object(inner) if !inner.is_empty() => merge_writes(inner, &pointer, out),
            other => out.push(state(
                &pointer,
                format!("{pointer} = {}", shown_value(other)),
            )),
        }
    }
}

fn value_writes(pointer: &str, value: &Value, out: &mut Vec<IndexEntry>) {
    match value {
        Value::Object(inner) if !inner.is_empty() => {
            for (key, value) in inner {
                if out.len() >= MAX_STATE_ENTRIES {
                    return;
                }
                value_writes(&format!("{pointer}/{}", escape_token(key)), value, out);
            }
        }
        other => out.push(state(
            pointer,
            format!("{pointer} = {}", shown_value(other)),
        )),
    }
}

fn state(pointer: &str, text: String) -> IndexEntry {
    IndexEntry {
        kind: RecallKind::State,
        pointer: Some(pointer.to_owned()),
        text,
    }
}

fn shown_value(value: &Value) -> String {
    bounded(&value.to_string(), STATE_VALUE_BYTES)
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` when cut.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// An entry as a store found it: its text is not for anyone until a reader's view decides
/// what of it may be shown ([`RawHit::reveal`]).
#[derive(Debug, Clone)]
pub struct RawHit {
    /// The entry's position in the index; orders entries of one step, and pages.
    pub id: i64,
    pub step: u64,
    pub kind: RecallKind,
    pub pointer: Option<String>,
    text: String,
}

impl RawHit {
    /// An entry read back from a store's index.
    pub fn from_index(
        id: i64,
        step: u64,
        kind: RecallKind,
        pointer: Option<String>,
        text: String,
    ) -> Self {
        Self {
            id,
            step,
            kind,
            pointer,
            text,
        }
    }

    /// Adds the value this entry wrote to `secrets`, when it is a state write at a location
    /// `write_only` covers: a reader learns the write-only values of a history from its index.
    pub fn collect_write_only(&self, write_only: &WriteOnly, secrets: &mut SecretValues) {
        let Some(pointer) = &self.pointer else {
            return;
        };
        if self.kind != RecallKind::State || !write_only.covers(pointer) {
            return;
        }
        let Some(value) = self
            .text
            .strip_prefix(pointer.as_str())
            .and_then(|t| t.strip_prefix(" = "))
        else {
            return;
        };
        match serde_json::from_str::<Value>(value) {
            Ok(value) => secrets.add_value(&value),
            // A value cut in the index: what it shows of it.
            Err(_) => secrets.add_text(value.trim_end_matches('…')),
        }
    }

    /// Whether the entry has every word of `query` (an index that looked a word up by its
    /// anchor found a candidate; see [`IndexWord`]).
    pub fn matches(&self, query: &RecallQuery) -> bool {
        query.matches(&self.text)
    }

    /// What `reader` may see of this entry, or `None` when it may see nothing of it: a state
    /// write at a write-only location, or an entry that matches the query only through a
    /// value the reader must not see.
    pub fn reveal(self, reader: &HitReader<'_>) -> Option<RecallHit> {
        if let Some(pointer) = &self.pointer
            && reader.write_only.covers(pointer)
        {
            return None;
        }
        let text = reader.secrets.scrub(&self.text).into_owned();
        if !query::matches_words(&text, reader.words) {
            return None;
        }
        Some(RecallHit {
            id: self.id,
            step: self.step,
            kind: self.kind,
            pointer: self.pointer,
            text,
        })
    }
}

/// What one reader may see of a task's recalled entries: the task's write-only locations and
/// the write-only values it knows of, and the query's words (a shown hit must still match).
pub struct HitReader<'a> {
    pub write_only: &'a WriteOnly,
    pub secrets: &'a SecretValues,
    pub words: &'a [Vec<String>],
}

/// An entry as one reader may see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecallHit {
    #[serde(skip)]
    pub id: i64,
    pub step: u64,
    pub kind: RecallKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pointer: Option<String>,
    pub text: String,
}

/// Where a page of hits ended: the next page starts after this entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HitCursor {
    pub step: u64,
    pub id: i64,
}

#[cfg(test)]
mod tests;

/// The recall tool as the model is shown it.
pub fn recall_spec() -> crate::tool::ToolSpec {
    crate::tool::ToolSpec {
        name: RECALL_TOOL.into(),
        description: "Search this task's own journal (earlier observations, tool results, your reasoning, actions and state writes) for facts no longer in the state. Returns matching entries with their step numbers, newest first. Every word of `query` must match (`item_42` matches the words item and 42 in a row); `pointer` finds the writes at or below a state location.".into(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 512, "description": "words to find"},
                "pointer": {"type": "string", "maxLength": 512, "description": "a JSON pointer into the state: only writes at or below it"},
                "kinds": {"type": "array", "items": {"enum": ["observation", "reasoning", "action", "state"]}, "uniqueItems": true},
                "from_step": {"type": "integer", "minimum": 0},
                "to_step": {"type": "integer", "minimum": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                "oldest_first": {"type": "boolean"}
            },
            "anyOf": [{"required": ["query"]}, {"required": ["pointer"]}],
            "additionalProperties": false
        }),
        side_effect: crate::tool::SideEffect::ReadOnly,
        source: RECALL_TOOL.into(),
        needs_approval: false,
    }
}
