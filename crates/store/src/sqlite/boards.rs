//! Boards on SQLite: every write through the group-commit writer (`ops_boards.rs`), a task's
//! step and its board write in one savepoint; reads on the pool.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::json::state_hash;
use sqlx::{AssertSqlSafe, Row};

use super::SqliteStore;
use super::ops::Write;
use super::ops_boards::{Attach, BoardWriteOp, DeleteBoard, NewBoardWrite, StepWithBoard};
use super::ops_steps::Step;
use super::ops_tasks::{NewTasks, TaskRow};
use crate::board_rows::{
    SUMMARY_COLUMNS, WriteRow, board_from_row, check_name, is_board_id, schema_from_row,
    snapshot_from_row, summary_from_row, write_from_row,
};
use crate::boards::*;
use crate::model::{NewTask, StepCommit, TaskRecord};
use crate::rows::{decode, to_json};
use crate::traits::Tasks;
use crate::{Result, StoreError, now_millis};

impl SqliteStore {
    pub(super) fn board_write_op(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
    ) -> BoardWriteOp {
        BoardWriteOp {
            board: board.to_owned(),
            expected_version,
            row: WriteRow::new(write),
            state: to_json(&write.new_state),
            snapshot: (expected_version + 1).is_multiple_of(self.snapshot_every),
            schema: None,
            now: now_millis(),
        }
    }

    /// `NoSuchBoard` unless a board with this full id exists.
    async fn board_exists(&self, board: &str) -> Result<()> {
        let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM boards WHERE id = ?")
            .bind(board)
            .fetch_optional(&self.pool)
            .await?;
        found
            .map(|_| ())
            .ok_or_else(|| StoreError::NoSuchBoard(board.to_owned()))
    }
}

#[async_trait]
impl Boards for SqliteStore {
    async fn create_board(&self, board: NewBoard) -> Result<BoardRecord> {
        check_name(&board.name)?;
        let now = now_millis();
        let record = BoardRecord {
            id: uuid::Uuid::now_v7().to_string(),
            name: board.name,
            state_hash: state_hash(&board.initial_state),
            schema: board.schema,
            state: board.initial_state,
            version: 0,
            tenant: board.tenant,
            created_at: now,
            updated_at: now,
        };
        self.write_done(Write::NewBoard(NewBoardWrite {
            id: record.id.clone(),
            name: record.name.clone(),
            tenant: record.tenant.clone(),
            schema: to_json(&record.schema),
            state: to_json(&record.state),
            state_hash: record.state_hash.clone(),
            now,
        }))
        .await?;
        Ok(record)
    }

    async fn board(&self, id_or_name: &str, tenant: Option<&str>) -> Result<BoardRecord> {
        if is_board_id(id_or_name) {
            let row = sqlx::query("SELECT * FROM boards WHERE id = ?")
                .bind(id_or_name)
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                return board_from_row(&row);
            }
        }
        let row = sqlx::query(
            "SELECT * FROM boards WHERE COALESCE(tenant, '') = COALESCE(?, '') AND name = ?",
        )
        .bind(tenant)
        .bind(id_or_name)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => board_from_row(&row),
            None => Err(StoreError::NoSuchBoard(id_or_name.to_owned())),
        }
    }

    async fn list_boards(&self, tenant: Option<&str>) -> Result<Vec<BoardSummary>> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM boards b WHERE ?1 IS NULL OR b.tenant = ?1 ORDER BY b.created_at DESC, b.id DESC"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(summary_from_row).collect()
    }

    async fn commit_board_write(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
    ) -> Result<u64> {
        self.write_done(Write::OnBoard(self.board_write_op(
            board,
            expected_version,
            write,
        )))
        .await?;
        Ok(expected_version + 1)
    }

    async fn commit_board_schema(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
        schema: &Value,
    ) -> Result<u64> {
        let mut op = self.board_write_op(board, expected_version, write);
        op.schema = Some(to_json(schema));
        self.write_done(Write::OnBoard(op)).await?;
        Ok(expected_version + 1)
    }

    async fn board_schemas(&self, board: &str) -> Result<Vec<BoardSchemaRecord>> {
        let current = sqlx::query("SELECT schema FROM boards WHERE id = ?")
            .bind(board)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NoSuchBoard(board.to_owned()))?;
        // A database opened read-only before schema 14 has no history: one schema, from 0.
        let has_history: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'board_schemas'",
        )
        .fetch_optional(&self.pool)
        .await?;
        if has_history.is_none() {
            return Ok(vec![BoardSchemaRecord {
                from_version: 0,
                schema: decode(
                    &format!("schema of board {board}"),
                    &current.try_get::<String, _>("schema")?,
                )?,
            }]);
        }
        let rows = sqlx::query(
            "SELECT from_version, schema FROM board_schemas WHERE board_id = ? ORDER BY from_version",
        )
        .bind(board)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| schema_from_row(board, row)).collect()
    }

    async fn commit_step_with_board(
        &self,
        task: &str,
        expected_task_version: u64,
        commit: &StepCommit,
        board: &str,
        expected_board_version: u64,
        write: &BoardWrite,
    ) -> Result<u64> {
        let now = now_millis();
        self.write_done(Write::StepWithBoard(StepWithBoard {
            board: self.board_write_op(board, expected_board_version, write),
            step: Step::new(
                task,
                expected_task_version,
                commit,
                self.snapshot_every,
                now,
            ),
        }))
        .await?;
        Ok(expected_board_version + 1)
    }

    async fn board_writes(&self, board: &str, from: u64, to: u64) -> Result<Vec<BoardWriteRecord>> {
        self.board_exists(board).await?;
        let (from, to) = (from.min(i64::MAX as u64), to.min(i64::MAX as u64));
        let rows = sqlx::query(
            "SELECT * FROM board_writes WHERE board_id = ? AND version BETWEEN ? AND ? ORDER BY version",
        )
        .bind(board)
        .bind(from as i64)
        .bind(to as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| write_from_row(board, row)).collect()
    }

    async fn board_initial_state(&self, board: &str) -> Result<Value> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT initial_state FROM boards WHERE id = ?")
                .bind(board)
                .fetch_optional(&self.pool)
                .await?;
        let text = text.ok_or_else(|| StoreError::NoSuchBoard(board.to_owned()))?;
        decode(&format!("initial state of board {board}"), &text)
    }

    async fn board_snapshot_at_or_before(
        &self,
        board: &str,
        version: u64,
    ) -> Result<Option<(u64, Value)>> {
        self.board_exists(board).await?;
        let row = sqlx::query(
            "SELECT version, state FROM board_snapshots WHERE board_id = ? AND version <= ? ORDER BY version DESC LIMIT 1",
        )
        .bind(board)
        .bind(version.min(i64::MAX as u64) as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| snapshot_from_row(board, &row)).transpose()
    }

    async fn attach_task(&self, board: &str, task: &str) -> Result<()> {
        self.write_done(Write::Attach(Attach {
            board: board.to_owned(),
            task: task.to_owned(),
            now: now_millis(),
        }))
        .await
    }

    async fn create_board_task(
        &self,
        board: &str,
        task: NewTask,
        initial_state: &Value,
    ) -> Result<TaskRecord> {
        let row = TaskRow::new(&task, initial_state, None);
        let id = row.id.clone();
        self.write_done(Write::NewTasks(NewTasks {
            rows: vec![row],
            batch: None,
            board: Some(board.to_owned()),
            now: now_millis(),
        }))
        .await?;
        self.task(&id).await
    }

    async fn task_board(&self, task: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT board_id FROM board_members WHERE task_id = ?")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn board_members(&self, board: &str) -> Result<Vec<String>> {
        self.board_exists(board).await?;
        let rows = sqlx::query(
            "SELECT task_id FROM board_members WHERE board_id = ? ORDER BY attached_at, rowid",
        )
        .bind(board)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("task_id")?)).collect()
    }

    async fn delete_board(&self, board: &str) -> Result<()> {
        self.write_done(Write::DeleteBoard(DeleteBoard {
            board: board.to_owned(),
        }))
        .await
    }
}
