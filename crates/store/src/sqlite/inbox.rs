//! A task's inbox on SQLite (`inbox.rs`). Each write runs its own `BEGIN IMMEDIATE`
//! transaction on the writer's turn, so it is ordered with every step commit and settle.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Connection};

use super::SqliteStore;
use crate::inbox::{
    Inbox, MESSAGE_COLUMNS, MessageRecord, NewMessage, message_event_data, message_from_row,
    not_waiting,
};
use crate::{Result, StoreError, now_millis};

#[async_trait]
impl Inbox for SqliteStore {
    async fn post_message(&self, task: &str, message: &NewMessage) -> Result<MessageRecord> {
        let now = now_millis();
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        // Queued at once, also while a worker holds it (its settle then keeps it queued).
        let queued =
            sqlx::query("UPDATE tasks SET queue = 'queued', not_before = NULL WHERE id = ?")
                .bind(task)
                .execute(&mut *tx)
                .await?;
        if queued.rows_affected() == 0 {
            return Err(StoreError::NotFound(task.to_owned()));
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO inbox (task_id, kind, text, author, created_at) VALUES (?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(task)
        .bind(message.kind.as_str())
        .bind(&message.text)
        .bind(&message.author)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
             SELECT id, tenant, 'message', version, ?, ? FROM tasks WHERE id = ?",
        )
        .bind(message_event_data(id, message))
        .bind(now)
        .bind(task)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(MessageRecord {
            id,
            task_id: task.to_owned(),
            kind: message.kind,
            text: message.text.clone(),
            author: message.author.clone(),
            created_at: now,
            delivered_step: None,
        })
    }

    async fn pending_messages(&self, task: &str) -> Result<Vec<MessageRecord>> {
        // The runner asks before every step; the answer is almost always "nothing".
        if self.readers.inbox_waiting(task) == Some(false) {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM inbox WHERE task_id = ? AND delivered_step IS NULL ORDER BY id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn messages(&self, task: &str) -> Result<Vec<MessageRecord>> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM inbox WHERE task_id = ? ORDER BY id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn deliver_messages(
        &self,
        task: &str,
        step: u64,
        observation: Option<&str>,
        ids: &[i64],
    ) -> Result<()> {
        let now = now_millis();
        let mut conn = self.write_conn().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        for id in ids {
            let marked = sqlx::query(
                "UPDATE inbox SET delivered_step = ? WHERE id = ? AND task_id = ? AND delivered_step IS NULL",
            )
            .bind(step as i64)
            .bind(id)
            .bind(task)
            .execute(&mut *tx)
            .await?;
            if marked.rows_affected() != 1 {
                return Err(not_waiting(task, step));
            }
        }
        if let Some(text) = observation {
            sqlx::query(
                "INSERT INTO observations (task_id, step, text) VALUES (?, ?, ?) \
                 ON CONFLICT (task_id, step) DO UPDATE SET text = excluded.text",
            )
            .bind(task)
            .bind(step as i64)
            .bind(text)
            .execute(&mut *tx)
            .await?;
            let reopened = sqlx::query(
                "UPDATE tasks SET status = 'running', outcome = NULL, updated_at = ? \
                 WHERE id = ? AND status IN ('completed', 'failed')",
            )
            .bind(now)
            .bind(task)
            .execute(&mut *tx)
            .await?;
            if reopened.rows_affected() == 1 {
                sqlx::query(
                    "INSERT INTO events (task_id, tenant, kind, step, data, created_at) \
                     SELECT id, tenant, 'status', version, '{\"status\":\"running\",\"outcome\":null}', ? FROM tasks WHERE id = ?",
                )
                .bind(now)
                .bind(task)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}
