//! Boards: shared states that several tasks (and API clients) read and write, each with its own
//! schema, versions and append-only journal of writes (docs/boards.md, "Several agents, one state").
//!
//! Invariants every backend keeps:
//! - a board write names the version it replaces and is refused with `BoardMoved` when the
//!   board is elsewhere — never a lost update; the caller rebases (core's `board::rebase`) and
//!   tries again;
//! - a write made by a task's step is ONE transaction with that step
//!   (`commit_step_with_board`): the task's journal row, new state and intent and the board's
//!   new state and journal row commit together or not at all;
//! - the board journal is append-only: version `n` is the `n`-th write, with the patch as
//!   applied, the hash of the state after it and its author; the initial state is kept, so any
//!   version can be rebuilt and every hash checked (`board_state_at`);
//! - a write whose new version is a multiple of the store's snapshot interval also stores the
//!   new state as a snapshot, in the same transaction, so rebuilding a version replays at most
//!   that many writes; deleting the board deletes its snapshots;
//! - a board's schema may change, only by a write of its own (`commit_board_schema`): the
//!   write, the board's new schema and the schema's row in the history (`board_schemas`, from
//!   that version on) commit together; every schema of the history is kept, so any version is
//!   read with the schema in effect at it (`board_schema_at`).

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::Result;
use crate::model::{NewTask, StepCommit, TaskRecord};

/// What a new board starts from.
#[derive(Debug, Clone)]
pub struct NewBoard {
    /// Unique among the boards of one tenant (or among untenanted boards); letters, digits,
    /// `-`, `_` and `.`, at most 100 characters.
    pub name: String,
    /// The board's JSON Schema (2020-12), checked by the caller.
    pub schema: Value,
    /// Valid against `schema`, checked by the caller.
    pub initial_state: Value,
    /// The tenant that owns the board (boards created through the service); `None` otherwise.
    pub tenant: Option<String>,
}

/// A board as it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardRecord {
    pub id: String,
    pub name: String,
    pub schema: Value,
    pub state: Value,
    /// Number of writes so far; the initial state is version 0.
    pub version: u64,
    pub state_hash: String,
    pub tenant: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One line of a board listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardSummary {
    pub id: String,
    pub name: String,
    pub version: u64,
    /// Tasks attached to the board.
    pub members: u64,
    pub tenant: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Who wrote a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BoardAuthor {
    /// A task's accepted step.
    Task { task: String, step: u64 },
    /// An API key (its id), through the service.
    Key { key: String },
    /// Someone at the command line (`skillstate board patch`).
    Cli,
}

/// A write about to be committed.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardWrite {
    /// The patch as applied to the newest version (merge patch object or JSON Patch array).
    pub patch: Value,
    pub new_state: Value,
    pub state_hash: String,
    pub author: BoardAuthor,
    /// The version the writer's patch was computed on, when older than the version it is
    /// committed on top of (it was rebased); `None` when it was computed on that version.
    pub rebased_from: Option<u64>,
}

/// One committed write: the board journal's row for `version`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardWriteRecord {
    pub version: u64,
    pub patch: Value,
    pub state_hash: String,
    pub author: BoardAuthor,
    pub rebased_from: Option<u64>,
    pub created_at: i64,
}

/// One schema of a board's history: in effect from `from_version` (0: as the board was
/// created) until the next one's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardSchemaRecord {
    pub from_version: u64,
    pub schema: Value,
}

/// Boards, their journals and which tasks are attached to which board.
#[async_trait]
pub trait Boards: Send + Sync {
    /// Creates a board at version 0. `BoardExists` when the name is taken (for that tenant).
    async fn create_board(&self, board: NewBoard) -> Result<BoardRecord>;
    /// A board by id, or by name among the boards of `tenant` (`None`: untenanted boards).
    /// `NoSuchBoard` when none matches.
    async fn board(&self, id_or_name: &str, tenant: Option<&str>) -> Result<BoardRecord>;
    /// The boards of `tenant` (`None`: every board), newest first.
    async fn list_boards(&self, tenant: Option<&str>) -> Result<Vec<BoardSummary>>;
    /// Commits a write on top of `expected_version`: `BoardMoved` (with the current version)
    /// when the board is elsewhere. Returns the new version.
    async fn commit_board_write(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
    ) -> Result<u64>;
    /// Commits a write that changes the board's schema to `schema` (checked by the caller, with
    /// the write's new state valid against it): the write exactly as `commit_board_write`
    /// commits it — its own version of the journal, `BoardMoved` when the board is elsewhere —
    /// and `schema` in effect from that version on, in ONE transaction. Returns the new version.
    async fn commit_board_schema(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
        schema: &Value,
    ) -> Result<u64>;
    /// Every schema the board had, oldest first, each with the version it applies from (the
    /// first from 0). A database opened read-only at a schema before board histories gives the
    /// board's one schema, from 0. `NoSuchBoard` when the board does not exist.
    async fn board_schemas(&self, board: &str) -> Result<Vec<BoardSchemaRecord>>;
    /// Commits a task's step (exactly as `Journal::commit_step`, with the task at
    /// `expected_task_version`) and a board write on top of `expected_board_version` in ONE
    /// transaction: task `Conflict` or `BoardMoved` refuses both, and so does a task that is
    /// not a member of the board (`NotAttached`, `AttachedElsewhere`). Returns the board's new
    /// version.
    async fn commit_step_with_board(
        &self,
        task: &str,
        expected_task_version: u64,
        commit: &StepCommit,
        board: &str,
        expected_board_version: u64,
        write: &BoardWrite,
    ) -> Result<u64>;
    /// The journal's rows for versions `from..=to` that exist, in order.
    async fn board_writes(&self, board: &str, from: u64, to: u64) -> Result<Vec<BoardWriteRecord>>;
    /// The state the board was created with (version 0).
    async fn board_initial_state(&self, board: &str) -> Result<Value>;
    /// The newest snapshot at or before `version`, as its version and state; `None` when there
    /// is none (no write has reached a multiple of the snapshot interval yet, or the board was
    /// written before snapshots existed). `NoSuchBoard` when the board does not exist.
    async fn board_snapshot_at_or_before(
        &self,
        board: &str,
        version: u64,
    ) -> Result<Option<(u64, Value)>>;
    /// Attaches `task` to `board` (a task belongs to at most one board; attaching it again to
    /// the same board is a no-op, to another is refused with `AttachedElsewhere`).
    async fn attach_task(&self, board: &str, task: &str) -> Result<()>;
    /// Creates a task exactly as `Tasks::create_task` does, attached to `board`, in ONE
    /// transaction: when the board does not exist (`NoSuchBoard`), nothing is stored — no task
    /// row, no membership.
    async fn create_board_task(
        &self,
        board: &str,
        task: NewTask,
        initial_state: &Value,
    ) -> Result<TaskRecord>;
    /// The board `task` is attached to, if any.
    async fn task_board(&self, task: &str) -> Result<Option<String>>;
    /// The tasks attached to `board`, in the order they were attached.
    async fn board_members(&self, board: &str) -> Result<Vec<String>>;
    /// Deletes a board, its journal and its snapshots; attached tasks are detached.
    async fn delete_board(&self, board: &str) -> Result<()>;
}
