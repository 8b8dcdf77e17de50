//! Boards on PostgreSQL. A board write is one conditional `UPDATE` of the board's row (the
//! version check; a concurrent writer waits for the row lock and then sees the new version) and
//! its journal row; a task's step and its board write share one transaction, the board first,
//! so either refusal rolls both back.

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::json::state_hash;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::PostgresStore;
use crate::board_rows::{
    SUMMARY_COLUMNS, WriteRow, board_from_row, check_name, is_board_id, schema_from_row,
    snapshot_from_row, summary_from_row, write_from_row,
};
use crate::boards::*;
use crate::model::{NewTask, StepCommit, TaskRecord};
use crate::rows::{decode, to_json};
use crate::traits::Tasks;
use crate::{Result, StoreError, now_millis};

/// The board write of [`Boards::commit_board_write`] on `conn` (inside the caller's
/// transaction), with the new state's snapshot when the new version is a multiple of
/// `snapshot_every`, and with `schema` in effect from the new version when given
/// ([`Boards::commit_board_schema`]): `BoardMoved` or `NoSuchBoard` when refused, and then
/// nothing was written.
async fn write_board(
    conn: &mut PgConnection,
    board: &str,
    expected_version: u64,
    write: &BoardWrite,
    snapshot_every: u64,
    schema: Option<&Value>,
) -> Result<u64> {
    let next = expected_version + 1;
    let now = now_millis();
    let row = WriteRow::new(write);
    let state = to_json(&write.new_state);
    let schema = schema.map(to_json);
    let updated = sqlx::query(
        "UPDATE boards SET state = $1, version = $2, state_hash = $3, updated_at = $4, schema = COALESCE($7, schema) WHERE id = $5 AND version = $6",
    )
    .bind(&state)
    .bind(next as i64)
    .bind(&row.state_hash)
    .bind(now)
    .bind(board)
    .bind(expected_version as i64)
    .bind(&schema)
    .execute(&mut *conn)
    .await?;
    if updated.rows_affected() != 1 {
        let actual: Option<i64> = sqlx::query_scalar("SELECT version FROM boards WHERE id = $1")
            .bind(board)
            .fetch_optional(&mut *conn)
            .await?;
        return Err(match actual {
            None => StoreError::NoSuchBoard(board.to_owned()),
            Some(actual) => StoreError::BoardMoved {
                board: board.to_owned(),
                expected: expected_version,
                actual: actual.max(0) as u64,
            },
        });
    }
    sqlx::query(
        "INSERT INTO board_writes (board_id, version, patch, state_hash, author, rebased_from, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(board)
    .bind(next as i64)
    .bind(&row.patch)
    .bind(&row.state_hash)
    .bind(&row.author)
    .bind(row.rebased_from.map(|v| v as i64))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    if next.is_multiple_of(snapshot_every) {
        sqlx::query("INSERT INTO board_snapshots (board_id, version, state) VALUES ($1, $2, $3)")
            .bind(board)
            .bind(next as i64)
            .bind(&state)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(schema) = &schema {
        sqlx::query(
            "INSERT INTO board_schemas (board_id, from_version, schema) VALUES ($1, $2, $3)",
        )
        .bind(board)
        .bind(next as i64)
        .bind(schema)
        .execute(&mut *conn)
        .await?;
    }
    Ok(next)
}

impl PostgresStore {
    /// `NoSuchBoard` unless a board with this full id exists.
    async fn board_exists(&self, board: &str) -> Result<()> {
        let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM boards WHERE id = $1")
            .bind(board)
            .fetch_optional(&self.pool)
            .await?;
        found
            .map(|_| ())
            .ok_or_else(|| StoreError::NoSuchBoard(board.to_owned()))
    }
}

impl PostgresStore {
    /// `Boards::commit_step_with_board` in `tx`, which may have checked something first (a
    /// lease, with the board's row locked before the task's).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_step_with_board_in(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        task: &str,
        expected_task_version: u64,
        commit: &StepCommit,
        board: &str,
        expected_board_version: u64,
        write: &BoardWrite,
    ) -> Result<u64> {
        // Only a member writes the board with a step (membership rows change only by attaching
        // and by deleting the task or the board, which the locks below exclude or refuse).
        let attached: Option<String> =
            sqlx::query_scalar("SELECT board_id FROM board_members WHERE task_id = $1")
                .bind(task)
                .fetch_optional(&mut *tx)
                .await?;
        match attached {
            Some(attached) if attached == board => {}
            Some(attached) => {
                return Err(StoreError::AttachedElsewhere {
                    task: task.to_owned(),
                    board: board.to_owned(),
                    attached,
                });
            }
            None => {
                return Err(StoreError::NotAttached {
                    task: task.to_owned(),
                    board: board.to_owned(),
                });
            }
        }
        // Board first, then the task: every transaction that locks both rows locks them in this
        // order. A refusal returns before the commit; dropping `tx` rolls everything back.
        let version = write_board(
            &mut tx,
            board,
            expected_board_version,
            write,
            self.snapshot_every,
            None,
        )
        .await?;
        // The member's board write, indexed with its step (recall_rows.rs).
        super::journal::insert_recall(
            &mut tx,
            task,
            commit.entry.step,
            &skillstate_core::recall::board_entries(&write.patch),
        )
        .await?;
        self.commit_step_in(
            tx,
            task,
            super::step_fn::LeaseCheck::Skip,
            expected_task_version,
            commit,
        )
        .await?;
        Ok(version)
    }
}

#[async_trait]
impl Boards for PostgresStore {
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
        let state = to_json(&record.state);
        let schema = to_json(&record.schema);
        let mut tx = self.pool.begin().await?;
        // Two racing creates of one name: the unique index lets one in, the other inserts
        // nothing.
        let inserted = sqlx::query(
            "INSERT INTO boards (id, name, tenant, schema, initial_state, state, version, state_hash, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $5, 0, $6, $7, $7) ON CONFLICT (COALESCE(tenant, ''), name) DO NOTHING",
        )
        .bind(&record.id)
        .bind(&record.name)
        .bind(&record.tenant)
        .bind(&schema)
        .bind(&state)
        .bind(&record.state_hash)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() != 1 {
            return Err(StoreError::BoardExists { name: record.name });
        }
        sqlx::query(
            "INSERT INTO board_schemas (board_id, from_version, schema) VALUES ($1, 0, $2)",
        )
        .bind(&record.id)
        .bind(&schema)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn board(&self, id_or_name: &str, tenant: Option<&str>) -> Result<BoardRecord> {
        if is_board_id(id_or_name) {
            let row = sqlx::query("SELECT * FROM boards WHERE id = $1")
                .bind(id_or_name)
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                return board_from_row(&row);
            }
        }
        let row = sqlx::query(
            "SELECT * FROM boards WHERE COALESCE(tenant, '') = COALESCE($1, '') AND name = $2",
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
            "SELECT {SUMMARY_COLUMNS} FROM boards b WHERE $1::text IS NULL OR b.tenant = $1 ORDER BY b.created_at DESC, b.id DESC"
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
        let mut tx = self.pool.begin().await?;
        let version = write_board(
            &mut tx,
            board,
            expected_version,
            write,
            self.snapshot_every,
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    async fn commit_board_schema(
        &self,
        board: &str,
        expected_version: u64,
        write: &BoardWrite,
        schema: &Value,
    ) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let version = write_board(
            &mut tx,
            board,
            expected_version,
            write,
            self.snapshot_every,
            Some(schema),
        )
        .await?;
        tx.commit().await?;
        Ok(version)
    }

    async fn board_schemas(&self, board: &str) -> Result<Vec<BoardSchemaRecord>> {
        let current: Option<String> = sqlx::query_scalar("SELECT schema FROM boards WHERE id = $1")
            .bind(board)
            .fetch_optional(&self.pool)
            .await?;
        let current = current.ok_or_else(|| StoreError::NoSuchBoard(board.to_owned()))?;
        // A database opened read-only before schema 14 has no history: one schema, from 0.
        let has_history: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('board_schemas')::text")
                .fetch_one(&self.pool)
                .await?;
        if has_history.is_none() {
            return Ok(vec![BoardSchemaRecord {
                from_version: 0,
                schema: decode(&format!("schema of board {board}"), &current)?,
            }]);
        }
        let rows = sqlx::query(
            "SELECT from_version, schema FROM board_schemas WHERE board_id = $1 ORDER BY from_version",
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
        let tx = self.pool.begin().await?;
        self.commit_step_with_board_in(
            tx,
            task,
            expected_task_version,
            commit,
            board,
            expected_board_version,
            write,
        )
        .await
    }

    async fn board_writes(&self, board: &str, from: u64, to: u64) -> Result<Vec<BoardWriteRecord>> {
        self.board_exists(board).await?;
        let (from, to) = (from.min(i64::MAX as u64), to.min(i64::MAX as u64));
        let rows = sqlx::query(
            "SELECT * FROM board_writes WHERE board_id = $1 AND version BETWEEN $2 AND $3 ORDER BY version",
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
            sqlx::query_scalar("SELECT initial_state FROM boards WHERE id = $1")
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
            "SELECT version, state FROM board_snapshots WHERE board_id = $1 AND version <= $2 ORDER BY version DESC LIMIT 1",
        )
        .bind(board)
        .bind(version.min(i64::MAX as u64) as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| snapshot_from_row(board, &row)).transpose()
    }

    async fn attach_task(&self, board: &str, task: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        // Locked against a concurrent delete while the membership is written.
        lock_board_for_membership(&mut tx, board).await?;
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM tasks WHERE id = $1 FOR KEY SHARE")
                .bind(task)
                .fetch_optional(&mut *tx)
                .await?;
        if found.is_none() {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        // Two racing attaches of one task: the primary key lets one in; both then read the
        // board it holds.
        sqlx::query(
            "INSERT INTO board_members (task_id, board_id, attached_at) VALUES ($1, $2, $3) ON CONFLICT (task_id) DO NOTHING",
        )
        .bind(task)
        .bind(board)
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        let attached: String =
            sqlx::query_scalar("SELECT board_id FROM board_members WHERE task_id = $1")
                .bind(task)
                .fetch_one(&mut *tx)
                .await?;
        if attached != board {
            return Err(StoreError::AttachedElsewhere {
                task: task.to_owned(),
                board: board.to_owned(),
                attached,
            });
        }
        tx.commit().await?;
        Ok(())
    }

    async fn create_board_task(
        &self,
        board: &str,
        task: NewTask,
        initial_state: &Value,
    ) -> Result<TaskRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        // Locked against a concurrent delete until the membership is written.
        lock_board_for_membership(&mut tx, board).await?;
        super::tasks::insert_task(&mut tx, &id, &task, initial_state, None, now).await?;
        sqlx::query(
            "INSERT INTO board_members (task_id, board_id, attached_at) VALUES ($1, $2, $3)",
        )
        .bind(&id)
        .bind(board)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.task(&id).await
    }

    async fn task_board(&self, task: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT board_id FROM board_members WHERE task_id = $1")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn board_members(&self, board: &str) -> Result<Vec<String>> {
        self.board_exists(board).await?;
        let rows =
            sqlx::query("SELECT task_id FROM board_members WHERE board_id = $1 ORDER BY seq")
                .bind(board)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|row| Ok(row.try_get("task_id")?)).collect()
    }

    async fn delete_board(&self, board: &str) -> Result<()> {
        let deleted = sqlx::query("DELETE FROM boards WHERE id = $1")
            .bind(board)
            .execute(&self.pool)
            .await?;
        if deleted.rows_affected() != 1 {
            return Err(StoreError::NoSuchBoard(board.to_owned()));
        }
        Ok(())
    }
}

/// Locks a board's row against a concurrent delete for the rest of `tx` (a membership is about
/// to be written); `NoSuchBoard` when there is none.
async fn lock_board_for_membership(conn: &mut PgConnection, board: &str) -> Result<()> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM boards WHERE id = $1 FOR KEY SHARE")
        .bind(board)
        .fetch_optional(conn)
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(StoreError::NoSuchBoard(board.to_owned())),
    }
}
