//! A task's inbox on PostgreSQL (`inbox.rs`). Posting updates the task's row first, so it is
//! serialised with a worker's settle of the same task by the row lock: whichever commits
//! second sees the other (a settle after a post finds the message waiting and keeps the task
//! queued; a post after a settle queues it again).

use async_trait::async_trait;
use sqlx::AssertSqlSafe;

use super::PostgresStore;
use super::events::insert_events;
use crate::inbox::{
    Inbox, MESSAGE_COLUMNS, MessageRecord, NewMessage, message_event_data, message_from_row,
    not_waiting,
};
use crate::{Result, StoreError, now_millis};

#[async_trait]
impl Inbox for PostgresStore {
    async fn post_message(&self, task: &str, message: &NewMessage) -> Result<MessageRecord> {
        self.pool
            .unit(|| async move {
                let now = now_millis();
                let mut tx = self.pool.begin().await?;
                let queued =
                    sqlx::query("UPDATE tasks SET queue = 'queued', not_before = NULL WHERE id = $1")
                        .bind(task)
                        .execute(&mut *tx)
                        .await?;
                if queued.rows_affected() == 0 {
                    return Err(StoreError::NotFound(task.to_owned()));
                }
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO inbox (task_id, kind, text, author, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
                )
                .bind(task)
                .bind(message.kind.as_str())
                .bind(&message.text)
                .bind(&message.author)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
                insert_events(
                    &mut tx,
                    task,
                    vec![("message", None, message_event_data(id, message))],
                    now,
                )
                .await?;
                super::db::commit(tx).await?;
                Ok(MessageRecord {
                    id,
                    task_id: task.to_owned(),
                    kind: message.kind,
                    text: message.text.clone(),
                    author: message.author.clone(),
                    created_at: now,
                    delivered_step: None,
            })
            })
            .await
    }

    async fn pending_messages(&self, task: &str) -> Result<Vec<MessageRecord>> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM inbox WHERE task_id = $1 AND delivered_step IS NULL ORDER BY id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(task)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn messages(&self, task: &str) -> Result<Vec<MessageRecord>> {
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM inbox WHERE task_id = $1 ORDER BY id");
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
        self.pool
            .unit(|| async move {
                let now = now_millis();
                let mut tx = self.pool.begin().await?;
                let marked = sqlx::query(
                    "UPDATE inbox SET delivered_step = $1 WHERE id = ANY($2) AND task_id = $3 AND delivered_step IS NULL",
                )
                .bind(step as i64)
                .bind(ids)
                .bind(task)
                .execute(&mut *tx)
                .await?;
                if marked.rows_affected() != ids.len() as u64 {
                    return Err(not_waiting(task, step));
                }
                if let Some(text) = observation {
                    sqlx::query(
                        "INSERT INTO observations (task_id, step, text) VALUES ($1, $2, $3) \
                         ON CONFLICT (task_id, step) DO UPDATE SET text = excluded.text",
                    )
                    .bind(task)
                    .bind(step as i64)
                    .bind(text)
                    .execute(&mut *tx)
                    .await?;
                    let reopened = sqlx::query(
                        "UPDATE tasks SET status = 'running', outcome = NULL, updated_at = $1 \
                         WHERE id = $2 AND status IN ('completed', 'failed')",
                    )
                    .bind(now)
                    .bind(task)
                    .execute(&mut *tx)
                    .await?;
                    if reopened.rows_affected() == 1 {
                        insert_events(
                            &mut tx,
                            task,
                            vec![(
                                "status",
                                None,
                                r#"{"status":"running","outcome":null}"#.to_owned(),
                            )],
                            now,
                        )
                        .await?;
                    }
                }
                super::db::commit(tx).await?;
                Ok(())
            })
            .await
    }
}
