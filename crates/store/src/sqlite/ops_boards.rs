//! Board writes of the group-commit writer (`writer.rs`): creating a board, a board write on
//! its own (changing the board's schema or not), a task's step together with its board write (ONE savepoint, so both or neither),
//! attaching a task and deleting a board.

use rusqlite::{Connection, OptionalExtension, params};

use super::ops::OpResult;
use super::ops_steps::Step;
use crate::StoreError;
use crate::board_rows::WriteRow;

/// A new board at version 0; refused when its name is taken for its tenant.
pub(super) struct NewBoardWrite {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) tenant: Option<String>,
    pub(super) schema: String,
    pub(super) state: String,
    pub(super) state_hash: String,
    pub(super) now: i64,
}

impl NewBoardWrite {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        // Under the writer's write lock nobody creates a board between the look-up and the
        // insert; the unique index stays the last word.
        let taken = conn
            .prepare_cached(
                "SELECT 1 FROM boards WHERE COALESCE(tenant, '') = COALESCE(?, '') AND name = ?",
            )?
            .query_row(params![self.tenant, self.name], |_| Ok(()))
            .optional()?;
        if taken.is_some() {
            return Err(StoreError::BoardExists {
                name: self.name.clone(),
            }
            .into());
        }
        conn.prepare_cached(
            "INSERT INTO boards (id, name, tenant, schema, initial_state, state, version, state_hash, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        )?
        .execute(params![
            self.id,
            self.name,
            self.tenant,
            self.schema,
            self.state,
            self.state,
            self.state_hash,
            self.now,
            self.now
        ])?;
        conn.prepare_cached(
            "INSERT INTO board_schemas (board_id, from_version, schema) VALUES (?, 0, ?)",
        )?
        .execute(params![self.id, self.schema])?;
        Ok(())
    }
}

/// A board write on top of `expected_version`: the board's new state and version, its
/// journal row and, when the new version is a multiple of the snapshot interval, its snapshot;
/// or `BoardMoved` when the board is elsewhere.
pub(super) struct BoardWriteOp {
    pub(super) board: String,
    pub(super) expected_version: u64,
    pub(super) row: WriteRow,
    pub(super) state: String,
    /// Whether the new state is written to `board_snapshots` too.
    pub(super) snapshot: bool,
    /// The board's schema from the new version on, when the write changes it (its row in
    /// `board_schemas` is written with the write).
    pub(super) schema: Option<String>,
    pub(super) now: i64,
}

impl BoardWriteOp {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let next = self.expected_version + 1;
        // The version check and the write are one statement.
        let updated = conn
            .prepare_cached(
                "UPDATE boards SET state = ?, version = ?, state_hash = ?, updated_at = ?, schema = COALESCE(?, schema) WHERE id = ? AND version = ?",
            )?
            .execute(params![
                self.state,
                next as i64,
                self.row.state_hash,
                self.now,
                self.schema,
                self.board,
                self.expected_version as i64
            ])?;
        if updated != 1 {
            let actual: Option<i64> = conn
                .prepare_cached("SELECT version FROM boards WHERE id = ?")?
                .query_row([&self.board], |row| row.get(0))
                .optional()?;
            return Err(match actual {
                None => StoreError::NoSuchBoard(self.board.clone()),
                Some(actual) => StoreError::BoardMoved {
                    board: self.board.clone(),
                    expected: self.expected_version,
                    actual: actual.max(0) as u64,
                },
            }
            .into());
        }
        conn.prepare_cached(
            "INSERT INTO board_writes (board_id, version, patch, state_hash, author, rebased_from, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![
            self.board,
            next as i64,
            self.row.patch,
            self.row.state_hash,
            self.row.author,
            self.row.rebased_from.map(|v| v as i64),
            self.now
        ])?;
        if self.snapshot {
            conn.prepare_cached(
                "INSERT INTO board_snapshots (board_id, version, state) VALUES (?, ?, ?)",
            )?
            .execute(params![self.board, next as i64, self.state])?;
        }
        if let Some(schema) = &self.schema {
            conn.prepare_cached(
                "INSERT INTO board_schemas (board_id, from_version, schema) VALUES (?, ?, ?)",
            )?
            .execute(params![self.board, next as i64, schema])?;
        }
        Ok(())
    }
}

/// A task's accepted step and its board write, in one savepoint: the board goes first (a
/// moved board is the common refusal and costs nothing of the step), then the step; either
/// refusal rolls both back.
pub(super) struct StepWithBoard {
    pub(super) board: BoardWriteOp,
    pub(super) step: Step,
}

impl StepWithBoard {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        member_check(conn, self.step.task(), &self.board.board)?;
        self.board.run(conn)?;
        self.step.run(conn)?;
        // The member's board write is found with its step, under `/board` (recall_rows.rs).
        let patch = serde_json::from_str(&self.board.row.patch).unwrap_or_default();
        self.step
            .index(conn, &skillstate_core::recall::board_entries(&patch))?;
        Ok(())
    }
}

/// Only a member of a board writes it with a step: `NotAttached`, or `AttachedElsewhere`.
fn member_check(conn: &Connection, task: &str, board: &str) -> OpResult<()> {
    let attached: Option<String> = conn
        .prepare_cached("SELECT board_id FROM board_members WHERE task_id = ?")?
        .query_row([task], |row| row.get(0))
        .optional()?;
    match attached {
        Some(attached) if attached == board => Ok(()),
        Some(attached) => Err(StoreError::AttachedElsewhere {
            task: task.to_owned(),
            board: board.to_owned(),
            attached,
        }
        .into()),
        None => Err(StoreError::NotAttached {
            task: task.to_owned(),
            board: board.to_owned(),
        }
        .into()),
    }
}

/// Attaches a task to a board; a no-op when it is attached to that board already.
pub(super) struct Attach {
    pub(super) board: String,
    pub(super) task: String,
    pub(super) now: i64,
}

impl Attach {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let board = conn
            .prepare_cached("SELECT 1 FROM boards WHERE id = ?")?
            .query_row([&self.board], |_| Ok(()))
            .optional()?;
        if board.is_none() {
            return Err(StoreError::NoSuchBoard(self.board.clone()).into());
        }
        let task = conn
            .prepare_cached("SELECT 1 FROM tasks WHERE id = ?")?
            .query_row([&self.task], |_| Ok(()))
            .optional()?;
        if task.is_none() {
            return Err(StoreError::NotFound(self.task.clone()).into());
        }
        let attached: Option<String> = conn
            .prepare_cached("SELECT board_id FROM board_members WHERE task_id = ?")?
            .query_row([&self.task], |row| row.get(0))
            .optional()?;
        match attached {
            Some(attached) if attached == self.board => Ok(()),
            Some(attached) => Err(StoreError::AttachedElsewhere {
                task: self.task.clone(),
                board: self.board.clone(),
                attached,
            }
            .into()),
            None => {
                conn.prepare_cached(
                    "INSERT INTO board_members (task_id, board_id, attached_at) VALUES (?, ?, ?)",
                )?
                .execute(params![self.task, self.board, self.now])?;
                Ok(())
            }
        }
    }
}

/// Deletes a board; its journal, snapshots and memberships go with it (ON DELETE CASCADE).
pub(super) struct DeleteBoard {
    pub(super) board: String,
}

impl DeleteBoard {
    pub(super) fn run(&self, conn: &Connection) -> OpResult<()> {
        let deleted = conn
            .prepare_cached("DELETE FROM boards WHERE id = ?")?
            .execute([&self.board])?;
        if deleted != 1 {
            return Err(StoreError::NoSuchBoard(self.board.clone()).into());
        }
        Ok(())
    }
}
