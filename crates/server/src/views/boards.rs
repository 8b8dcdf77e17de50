//! What the board routes answer with: boards, listings and the journal of writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_store::{BoardAuthor, BoardRecord, BoardSummary, BoardWriteRecord};
use utoipa::ToSchema;

use super::rfc3339;

/// What a new board starts from.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBoardRequest {
    /// Unique among the tenant's boards: letters, digits, `-`, `_` and `.`, at most 100
    /// characters.
    #[schema(min_length = 1, max_length = 100, pattern = "^[A-Za-z0-9._-]+$")]
    pub name: String,
    /// The board's state schema (JSON Schema 2020-12, an object); every write is checked
    /// against it, `readOnly` locations included.
    #[schema(value_type = Object)]
    pub schema: Value,
    /// The state at version 0 (default `{}`); must satisfy `schema`.
    #[schema(value_type = Option<Object>)]
    pub initial_state: Option<Value>,
}

/// A board.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardView {
    pub id: String,
    pub name: String,
    /// Writes so far; the state's version (its ETag). The initial state is version 0.
    pub version: u64,
    /// The board's state schema. For a key limited to board pointers, the schema projected to
    /// its reads: what it reads whole is described in full, and on the way to it only `type`,
    /// `readOnly`/`writeOnly`, `required` and `properties` leading to a read; keywords about
    /// the other members (`maxProperties`, `dependentRequired`, `propertyNames`, `if`/`then`,
    /// `additionalProperties`, ...) are left out, and references point at renamed copies
    /// under `$defs`.
    #[schema(value_type = Object)]
    pub schema: Value,
    /// The tasks attached to the board, in the order they joined (a fork of a member is a
    /// member from its creation).
    pub members: Vec<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl BoardView {
    pub fn of(board: &BoardRecord, members: Vec<String>) -> Self {
        Self {
            id: board.id.clone(),
            name: board.name.clone(),
            version: board.version,
            schema: board.schema.clone(),
            members,
            created_at: rfc3339(board.created_at),
            updated_at: rfc3339(board.updated_at),
        }
    }
}

/// One board of a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardListItem {
    pub id: String,
    pub name: String,
    pub version: u64,
    /// Tasks attached.
    pub members: u64,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl BoardListItem {
    pub fn of(board: &BoardSummary) -> Self {
        Self {
            id: board.id.clone(),
            name: board.name.clone(),
            version: board.version,
            members: board.members,
            created_at: rfc3339(board.created_at),
            updated_at: rfc3339(board.updated_at),
        }
    }
}

/// The tenant's boards, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardList {
    pub boards: Vec<BoardListItem>,
}

/// Who wrote a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthorKind {
    /// A task's accepted step (`task`, `step`).
    Task,
    /// An API key (`key`).
    Key,
    /// Someone at the command line.
    Cli,
}

/// Who wrote a version.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuthorView {
    pub kind: AuthorKind,
    /// The task, for a task's step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The task's step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The API key's id, for a write through the service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl AuthorView {
    pub fn of(author: &BoardAuthor) -> Self {
        let none = Self {
            kind: AuthorKind::Cli,
            task: None,
            step: None,
            key: None,
        };
        match author {
            BoardAuthor::Task { task, step } => Self {
                kind: AuthorKind::Task,
                task: Some(task.clone()),
                step: Some(*step),
                ..none
            },
            BoardAuthor::Key { key } => Self {
                kind: AuthorKind::Key,
                key: Some(key.clone()),
                ..none
            },
            BoardAuthor::Cli => none,
        }
    }
}

/// One committed write: the board journal's row for `version`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardWriteView {
    pub version: u64,
    /// The patch as applied (merge patch object or JSON Patch array; write-only values read
    /// `[redacted]`).
    pub patch: Value,
    /// The hash of the state after this write; withheld (null) when the board's schema marks
    /// values write-only.
    pub state_hash: Option<String>,
    pub author: AuthorView,
    /// The version the writer computed the patch on, when older than the one it was
    /// committed on (it was rebased).
    pub rebased_from: Option<u64>,
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl BoardWriteView {
    pub fn of(write: &BoardWriteRecord, patch: Value, show_hash: bool) -> Self {
        Self {
            version: write.version,
            patch,
            state_hash: show_hash.then(|| write.state_hash.clone()),
            author: AuthorView::of(&write.author),
            rebased_from: write.rebased_from,
            created_at: rfc3339(write.created_at),
        }
    }
}

/// A page of a board's journal, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BoardWritePage {
    pub writes: Vec<BoardWriteView>,
    /// Pass as `after` for the next page; absent on the last one.
    pub next_after: Option<u64>,
}
