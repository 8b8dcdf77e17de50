//! What the journal search and provenance routes answer with (docs/recall.md, "Recall and
//! provenance"): hits as one reader may see them, and the writes behind a state value.

use serde::Serialize;
use serde_json::Value;
use skillstate_core::recall::{RecallHit, RecallKind};
use skillstate_runtime::provenance::{Author, Provenance, ProvenanceWrite};
use utoipa::ToSchema;

use super::rfc3339;

/// What a hit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HitKindName {
    /// The observation a step started from (a tool's result, an event, a user's message).
    Observation,
    /// The reasoning the model wrote with an accepted answer.
    Reasoning,
    /// The action of an accepted step: `tool {args}`.
    Action,
    /// One location an accepted step's patch wrote: `/pointer = value` or `/pointer removed`.
    State,
}

impl HitKindName {
    pub fn of(kind: RecallKind) -> Self {
        match kind {
            RecallKind::Observation => HitKindName::Observation,
            RecallKind::Reasoning => HitKindName::Reasoning,
            RecallKind::Action => HitKindName::Action,
            RecallKind::State => HitKindName::State,
        }
    }
}

/// One entry of a task's journal that matches a search.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JournalHit {
    /// The committed step the entry belongs to (`GET /v1/tasks/{id}/steps/{step}`).
    pub step: u64,
    pub kind: HitKindName,
    /// For a state write: the location written (RFC 6901); `null` otherwise.
    pub pointer: Option<String>,
    /// The entry's text as the index keeps it (an observation's first 16 KiB, a state write as
    /// `/pointer = value`); write-only values never appear.
    pub text: String,
}

impl JournalHit {
    pub fn of(hit: RecallHit) -> Self {
        Self {
            step: hit.step,
            kind: HitKindName::of(hit.kind),
            pointer: hit.pointer,
            text: hit.text,
        }
    }
}

/// A page of a journal search.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JournalSearchPage {
    /// The hits, newest first (or oldest first with `order=oldest`).
    pub hits: Vec<JournalHit>,
    /// Pass as `cursor` (with the same other parameters) for the next page; `null` when there
    /// is no more.
    pub next_cursor: Option<String>,
}

/// Who wrote a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WriteAuthor {
    /// The model, answering a step's observation.
    Model {
        /// The model spec the task runs with.
        model: String,
    },
    /// A state write through the API (`PATCH /v1/tasks/{id}/state`).
    ApiKey {
        /// The id of the API key (never its secret).
        key: String,
    },
}

/// One write at (or above, or below) a state location.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProvenanceWriteView {
    /// The step that wrote it (`GET /v1/tasks/{id}/steps/{step}`).
    pub step: u64,
    /// The value at the location right after this write; `null` when the write removed it.
    /// A write-only value reads `"[redacted]"`.
    pub value: Option<Value>,
    /// The step's whole patch (RFC 7396 merge patch or RFC 6902 operations), write-only values
    /// redacted.
    pub patch: Value,
    /// The observation the model was answering; `null` for a write through the API.
    pub observation: Option<String>,
    pub author: WriteAuthor,
    #[schema(format = DateTime)]
    pub created_at: String,
}

/// Where a state value came from.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProvenanceView {
    /// The location asked about (RFC 6901).
    pub pointer: String,
    /// The value there now; `null` when nothing is there. A write-only value reads
    /// `"[redacted]"`.
    pub current: Option<Value>,
    /// The steps that wrote at, above or below the location, newest first: without `all`,
    /// those since the value last changed (the write that set it, and any that wrote it
    /// again); with `all=true`, every one the journal keeps (at most 1,000).
    pub writes: Vec<ProvenanceWriteView>,
    /// Writes older than the listed ones that the 1,000 limit left out.
    pub older_writes: u64,
    /// The first step the journal still holds (older ones were compacted away).
    pub kept_from: u64,
}

impl WriteAuthor {
    pub fn of(author: Author) -> Self {
        match author {
            Author::Model { model } => WriteAuthor::Model { model },
            Author::ApiKey { key } => WriteAuthor::ApiKey { key },
        }
    }
}

impl ProvenanceWriteView {
    pub fn of(write: ProvenanceWrite) -> Self {
        Self {
            step: write.step,
            value: write.value,
            patch: write.patch,
            observation: write.observation,
            author: WriteAuthor::of(write.author),
            created_at: rfc3339(write.created_at),
        }
    }
}

impl ProvenanceView {
    /// The runtime's answer (already redacted for the task's reader) as the API shows it.
    pub fn of(found: Provenance) -> Self {
        Self {
            pointer: found.pointer,
            current: found.current,
            writes: found
                .writes
                .into_iter()
                .map(ProvenanceWriteView::of)
                .collect(),
            older_writes: found.older_writes,
            kept_from: found.kept_from,
        }
    }
}
