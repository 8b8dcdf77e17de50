//! A recall query: the words to find, and the filters (pointer prefix, kinds, step range).
//!
//! Words are matched as the index tokenizes text: runs of letters and digits, case folded;
//! everything else separates (`item_4298` is the phrase `item 4298`). Every word must match.
//! A word is never query syntax: the stores build their own query from the tokens, so no text
//! a model writes can change what is searched or how.

use serde_json::Value;

use super::RecallKind;
use crate::json::pointer_tokens;

/// The most words a query may have.
pub const MAX_WORDS: usize = 16;
/// The most hits one query returns.
pub const MAX_LIMIT: usize = 50;
const DEFAULT_LIMIT: usize = 5;
const MAX_QUERY_BYTES: usize = 512;

/// A recall query, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecallQuery {
    /// The words as written.
    pub words: Vec<String>,
    /// Each word's tokens: what the stores match as a phrase (SQLite FTS5, PostgreSQL's
    /// `phraseto_tsquery`), and what a shown hit must still contain.
    pub word_tokens: Vec<Vec<String>>,
    /// Only state writes at or below this location.
    pub pointer: Option<String>,
    /// Only these kinds (empty: every kind; with `pointer`: state writes only).
    pub kinds: Vec<RecallKind>,
    pub from_step: Option<u64>,
    pub to_step: Option<u64>,
    pub limit: usize,
    pub oldest_first: bool,
}

/// Why a query cannot run: the argument (a JSON pointer into the tool's arguments, or the
/// name of a request's parameter) and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct QueryProblem {
    pub field: String,
    pub message: String,
}

fn problem(field: &str, message: impl Into<String>) -> QueryProblem {
    QueryProblem {
        field: field.to_owned(),
        message: message.into(),
    }
}

impl RecallQuery {
    /// A query from words and a location, as a person asks (`skillstate search`, the
    /// service's `?q=`): at least one of them.
    pub fn new(text: Option<&str>, pointer: Option<&str>) -> Result<Self, QueryProblem> {
        let mut query = Self {
            limit: DEFAULT_LIMIT,
            ..Self::default()
        };
        if let Some(text) = text {
            query.set_words(text, "q")?;
        }
        if let Some(pointer) = pointer {
            query.set_pointer(pointer, "pointer")?;
        }
        query.finish("q")
    }

    /// A query from the recall tool's arguments (`{"query", "pointer", "kinds", "from_step",
    /// "to_step", "limit", "oldest_first"}`); problems name the argument's pointer.
    pub fn from_args(args: &Value) -> Result<Self, QueryProblem> {
        let Some(map) = args.as_object() else {
            return Err(problem(
                "/",
                "the arguments must be an object such as {\"query\": \"item_4298\"}",
            ));
        };
        let mut query = Self {
            limit: DEFAULT_LIMIT,
            ..Self::default()
        };
        for (key, value) in map {
            let field = format!("/{key}");
            match key.as_str() {
                "query" => {
                    let text = value
                        .as_str()
                        .ok_or_else(|| problem(&field, "must be a string of words"))?;
                    query.set_words(text, &field)?;
                }
                "pointer" => {
                    let text = value.as_str().ok_or_else(|| {
                        problem(
                            &field,
                            "must be a JSON pointer string such as \"/inventory\"",
                        )
                    })?;
                    query.set_pointer(text, &field)?;
                }
                "kinds" => {
                    let list = value.as_array().ok_or_else(|| {
                        problem(
                            &field,
                            "must be a list of observation, reasoning, action, state",
                        )
                    })?;
                    for (index, kind) in list.iter().enumerate() {
                        let kind = kind.as_str().and_then(RecallKind::parse).ok_or_else(|| {
                            problem(
                                &format!("{field}/{index}"),
                                "is not one of observation, reasoning, action, state",
                            )
                        })?;
                        if !query.kinds.contains(&kind) {
                            query.kinds.push(kind);
                        }
                    }
                }
                "from_step" => query.from_step = Some(step_number(value, &field)?),
                "to_step" => query.to_step = Some(step_number(value, &field)?),
                "limit" => {
                    let limit = value
                        .as_u64()
                        .filter(|n| (1..=MAX_LIMIT as u64).contains(n))
                        .ok_or_else(|| {
                            problem(
                                &field,
                                format!("must be a whole number from 1 to {MAX_LIMIT}"),
                            )
                        })?;
                    query.limit = limit as usize;
                }
                "oldest_first" => {
                    query.oldest_first = value
                        .as_bool()
                        .ok_or_else(|| problem(&field, "must be true or false"))?;
                }
                _ => {
                    return Err(problem(
                        &field,
                        "is not an argument of recall; it takes query, pointer, kinds, from_step, to_step, limit, oldest_first",
                    ));
                }
            }
        }
        query.finish("/query")
    }

    fn set_words(&mut self, text: &str, field: &str) -> Result<(), QueryProblem> {
        if text.len() > MAX_QUERY_BYTES {
            return Err(problem(
                field,
                format!("is longer than {MAX_QUERY_BYTES} bytes; search for fewer words"),
            ));
        }
        for word in text.split_whitespace() {
            let tokens = tokens_of(word);
            if tokens.is_empty() {
                continue;
            }
            self.words.push(word.to_owned());
            self.word_tokens.push(tokens);
        }
        if self.words.len() > MAX_WORDS {
            return Err(problem(
                field,
                format!("has more than {MAX_WORDS} words; search for fewer"),
            ));
        }
        if self.words.is_empty() {
            return Err(problem(
                field,
                "has no word to search for (letters or digits); write the item, name or number to find",
            ));
        }
        Ok(())
    }

    fn set_pointer(&mut self, text: &str, field: &str) -> Result<(), QueryProblem> {
        if text.len() > MAX_QUERY_BYTES || pointer_tokens(text).is_none() {
            return Err(problem(
                field,
                "must be a JSON pointer into the state, such as \"/inventory/shelf_122\" (\"\" is the whole state)",
            ));
        }
        self.pointer = Some(text.to_owned());
        Ok(())
    }

    fn finish(mut self, field: &str) -> Result<Self, QueryProblem> {
        if self.words.is_empty() && self.pointer.is_none() {
            return Err(problem(
                field,
                "give words to search for, a state pointer, or both",
            ));
        }
        if self.pointer.is_some() {
            if self.kinds.iter().any(|k| *k != RecallKind::State) {
                return Err(problem(
                    field,
                    "a pointer finds state writes only; leave out kinds other than state",
                ));
            }
            self.kinds = vec![RecallKind::State];
        }
        if let (Some(from), Some(to)) = (self.from_step, self.to_step)
            && from > to
        {
            return Err(problem(
                "/from_step",
                format!("is after to_step ({from} > {to}); give a range from the earlier step"),
            ));
        }
        Ok(self)
    }

    /// Only steps up to `step` (the recall tool searches the steps before the one asking).
    pub fn up_to(mut self, step: u64) -> Self {
        self.to_step = Some(self.to_step.map_or(step, |to| to.min(step)));
        self
    }

    /// How the full-text index looks up each word (see [`IndexWord`]).
    pub fn index_words(&self) -> Vec<IndexWord<'_>> {
        self.word_tokens
            .iter()
            .map(|tokens| IndexWord::of(tokens))
            .collect()
    }

    /// Whether an entry the index finds must still be checked against the words
    /// ([`RecallQuery::matches`]): some word is looked up by its anchor alone.
    pub fn needs_check(&self) -> bool {
        self.word_tokens
            .iter()
            .any(|tokens| matches!(IndexWord::of(tokens), IndexWord::Anchor(_)))
    }

    /// Whether `text` has every word of the query, each as its tokens in a row.
    pub fn matches(&self, text: &str) -> bool {
        matches_words(text, &self.word_tokens)
    }

    /// The query as SQLite FTS5 matches it: every word a phrase of its tokens or its anchor
    /// ([`IndexWord`]; tokens are letters and digits only, so nothing in them is FTS5 syntax).
    /// `None` without words.
    pub fn fts5_match(&self) -> Option<String> {
        if self.word_tokens.is_empty() {
            return None;
        }
        Some(
            self.index_words()
                .iter()
                .map(|word| format!("\"{}\"", word.tokens().join(" ")))
                .collect::<Vec<_>>()
                .join(" AND "),
        )
    }

    /// A short description for a result's first line: `"item_4298"` or `writes at /inventory`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.words.is_empty() {
            parts.push(format!("\"{}\"", self.words.join(" ")));
        }
        if let Some(pointer) = &self.pointer {
            parts.push(format!(
                "writes at {}",
                if pointer.is_empty() { "/" } else { pointer }
            ));
        }
        parts.join(" among ")
    }
}

fn step_number(value: &Value, field: &str) -> Result<u64, QueryProblem> {
    value
        .as_u64()
        .filter(|n| *n <= i64::MAX as u64)
        .ok_or_else(|| problem(field, "must be a step number (a whole number, 0 or more)"))
}

/// How the full-text index looks a word up.
///
/// A word of several tokens is a phrase, and a phrase is as slow as its most common token: the
/// index walks that token's list to check positions. An identifier such as `item_4298` is the
/// tokens `item` and `4298`, and `item` is on nearly every entry of a warehouse's journal, so
/// the phrase grew with the journal (on PostgreSQL the GIN index intersects both lists; see
/// docs/recall.md, "What it costs"). Such a word is looked up by its anchor —
/// its longest token with a digit, when that has at least [`ANCHOR_MIN_CHARS`] characters (a
/// number that specific is rare) — and the entries found are checked for the whole word
/// ([`RecallQuery::matches`]), so a search finds exactly the entries the phrase finds. Words
/// without such a token (`the item`, `item_7`) stay phrases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexWord<'a> {
    Phrase(&'a [String]),
    Anchor(&'a String),
}

/// The shortest token a word is looked up by alone.
pub const ANCHOR_MIN_CHARS: usize = 3;

impl<'a> IndexWord<'a> {
    fn of(tokens: &'a [String]) -> Self {
        if tokens.len() < 2 {
            return Self::Phrase(tokens);
        }
        tokens
            .iter()
            .filter(|t| t.chars().any(|c| c.is_numeric()) && t.chars().count() >= ANCHOR_MIN_CHARS)
            .max_by_key(|t| t.chars().count())
            .map_or(Self::Phrase(tokens), Self::Anchor)
    }

    /// The tokens the index is asked for, in order.
    pub fn tokens(&self) -> &'a [String] {
        match self {
            Self::Phrase(tokens) => tokens,
            Self::Anchor(token) => std::slice::from_ref(*token),
        }
    }
}

/// The tokens of `text` as the index sees them: runs of letters and digits, lower-cased.
pub fn tokens_of(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether every word's tokens appear, in order and adjacent, among `text`'s tokens.
pub(super) fn matches_words(text: &str, words: &[Vec<String>]) -> bool {
    if words.is_empty() {
        return true;
    }
    let tokens = tokens_of(text);
    words.iter().all(|word| {
        !word.is_empty()
            && tokens
                .windows(word.len())
                .any(|window| window.iter().zip(word).all(|(a, b)| a == b))
    })
}
