//! What the HTTP service needs, on SQLite (`service.rs`): API keys, tasks owned by tenants and
//! events. Writes go through the group-commit writer; every other write appends its own events
//! (`ops_steps.rs`, `ops_tasks.rs`).
//!
//! Event positions are the `events` row ids in decimal. SQLite has one writer at a time, which
//! holds the write lock from its transaction's first write to its commit, so ids are handed out
//! in commit order; AUTOINCREMENT never reuses one. A reader that sees event `n` therefore sees
//! every event before it, and resuming after `n` never skips one.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::{AssertSqlSafe, Row};

use super::SqliteStore;
use super::ops::{Reply, Write};
use super::ops_keys::{NewKey as NewKeyWrite, RevokeKey};
use super::ops_tasks::{OwnedTask, TaskRow};
use super::queue::unexpected;
use crate::model::{NewTask, TaskRecord, TaskState, TaskSummary};
use crate::rows::{summary_from_row, to_json};
use crate::service::*;
use crate::service_rows::{
    KEY_COLUMNS, bad_position, event_from_row, is_id_prefix, key_from_row, page_limit,
    parse_counter,
};
use crate::{Result, StoreError, Tasks, now_millis};

impl SqliteStore {
    /// The full id of the API key `id_or_prefix` names.
    async fn resolve_key(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim().to_ascii_lowercase();
        if !is_id_prefix(&wanted) {
            return Err(StoreError::NoSuchKey(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM api_keys WHERE id >= ?1 AND id < ?1 || '~' ORDER BY id LIMIT 2",
        )
        .bind(&wanted)
        .fetch_all(&self.pool)
        .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NoSuchKey(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ if ids.contains(&wanted) => Ok(wanted),
            _ => {
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM api_keys WHERE id >= ?1 AND id < ?1 || '~'",
                )
                .bind(&wanted)
                .fetch_one(&self.pool)
                .await?;
                Err(StoreError::AmbiguousKey {
                    prefix: wanted,
                    count: count as usize,
                })
            }
        }
    }

    async fn key_by_id(&self, id: &str) -> Result<KeyRecord> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NoSuchKey(id.to_owned()))?;
        key_from_row(&row)
    }
}

#[async_trait]
impl Keys for SqliteStore {
    async fn create_key(&self, key: &NewKey) -> Result<KeyRecord> {
        let record = KeyRecord {
            id: uuid::Uuid::now_v7().to_string(),
            tenant: key.tenant.clone(),
            label: key.label.clone(),
            scopes: key.scopes.clone(),
            created_at: now_millis(),
            revoked_at: None,
        };
        self.write_done(Write::NewKey(NewKeyWrite {
            id: record.id.clone(),
            tenant: record.tenant.clone(),
            label: record.label.clone(),
            secret_hash: key.secret_hash.clone(),
            scopes: key.scopes.as_ref().map(to_json),
            now: record.created_at,
        }))
        .await?;
        Ok(record)
    }

    async fn key_by_hash(&self, secret_hash: &str) -> Result<Option<KeyRecord>> {
        if let Some(key) = self.readers.key_by_hash(secret_hash) {
            return key;
        }
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE secret_hash = ?");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(secret_hash)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(key_from_row).transpose()
    }

    async fn key_and_task_state(
        &self,
        secret_hash: &str,
        task: &str,
    ) -> (Result<Option<KeyRecord>>, Result<TaskState>) {
        let (key, state) = self.readers.together(|| {
            (
                self.readers.key_by_hash(secret_hash),
                self.readers.task_state(task),
            )
        });
        let key = match key {
            Some(key) => key,
            None => self.key_by_hash(secret_hash).await,
        };
        let state = match state {
            Some(state) => state,
            None => self.task_state(task).await,
        };
        (key, state)
    }

    async fn list_keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>> {
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE ?1 IS NULL OR tenant = ?1 ORDER BY created_at, id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(key_from_row).collect()
    }

    async fn revoke_key(&self, id_or_prefix: &str) -> Result<KeyRecord> {
        let id = self.resolve_key(id_or_prefix).await?;
        self.write_done(Write::RevokeKey(RevokeKey {
            id: id.clone(),
            now: now_millis(),
        }))
        .await?;
        self.key_by_id(&id).await
    }
}

#[async_trait]
impl Tenancy for SqliteStore {
    async fn create_owned_task(
        &self,
        task: NewTask,
        initial_state: &Value,
        owner: &TaskOwner,
    ) -> Result<(TaskRecord, bool)> {
        let reply = self
            .write(Write::OwnedTask(OwnedTask {
                row: TaskRow::owned(&task, initial_state, owner),
                batch: owner.batch.clone(),
                now: now_millis(),
            }))
            .await?;
        match reply {
            Reply::Task(id, created) => Ok((self.task(&id).await?, created)),
            other => Err(unexpected(other)),
        }
    }

    async fn task_tenant(&self, task: &str) -> Result<Option<String>> {
        let tenant: Option<Option<String>> =
            sqlx::query_scalar("SELECT tenant FROM tasks WHERE id = ?")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?;
        tenant.ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }

    async fn list_tasks_page(&self, query: &TaskQuery) -> Result<Vec<TaskSummary>> {
        // Only the filters asked for are in the statement, so each listing uses its index
        // (`tasks_by_tenant` for a tenant's, the primary key otherwise).
        let mut sql = String::from(
            "SELECT id, skill_name, status, version, model, created_at, updated_at, labels FROM tasks WHERE 1 = 1",
        );
        let mut binds: Vec<&str> = Vec::new();
        if let Some(tenant) = &query.tenant {
            sql.push_str(" AND tenant = ?");
            binds.push(tenant);
        }
        if let Some(status) = query.status {
            sql.push_str(" AND status = ?");
            binds.push(status.as_str());
        }
        if let Some(skill) = &query.skill {
            sql.push_str(" AND skill_name = ?");
            binds.push(skill);
        }
        if let Some((key, value)) = &query.label {
            // json_each rather than a JSON path: a label's name may hold any character. Only
            // string values match, as on PostgreSQL; a row whose labels are not JSON matches
            // nothing instead of failing the listing.
            sql.push_str(
                " AND CASE WHEN json_valid(labels) THEN EXISTS (SELECT 1 FROM json_each(labels) l \
                 WHERE l.key = ? AND l.type = 'text' AND l.value = ?) ELSE 0 END",
            );
            binds.push(key);
            binds.push(value);
        }
        if let Some(batch) = &query.batch {
            sql.push_str(" AND batch_id = ?");
            binds.push(batch);
        }
        if let Some(after) = &query.after {
            sql.push_str(" AND id < ?");
            binds.push(after);
        }
        sql.push_str(" ORDER BY id DESC LIMIT ?");
        let mut statement = sqlx::query(AssertSqlSafe(sql));
        for bind in binds {
            statement = statement.bind(bind);
        }
        let rows = statement
            .bind(page_limit(query.limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(summary_from_row).collect())
    }

    async fn task_totals(
        &self,
        tasks: &[String],
    ) -> Result<std::collections::HashMap<String, TaskTotals>> {
        super::report::task_totals(self, tasks).await
    }

    async fn list_batches_page(
        &self,
        query: &BatchQuery,
    ) -> Result<Vec<crate::queue::BatchRecord>> {
        super::report::list_batches_page(self, query).await
    }

    async fn batch_tenant(&self, batch: &str) -> Result<Option<String>> {
        super::report::batch_tenant(self, batch).await
    }
}

#[async_trait]
impl Events for SqliteStore {
    async fn latest_event_position(&self, query: &EventQuery) -> Result<Option<String>> {
        // Ids are handed out in commit order (module doc): the largest one committed is the
        // last event any reader can see; a later one gets a larger id.
        let mut sql = String::from("SELECT MAX(id) FROM events WHERE 1 = 1");
        let mut binds: Vec<&str> = Vec::new();
        if let Some(tenant) = &query.tenant {
            sql.push_str(" AND tenant = ?");
            binds.push(tenant);
        }
        if let Some(task) = &query.task {
            sql.push_str(" AND task_id = ?");
            binds.push(task);
        }
        let mut statement = sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(sql));
        for bind in binds {
            statement = statement.bind(bind);
        }
        let last = statement.fetch_one(&self.pool).await?;
        Ok(last.map(|id| id.to_string()))
    }

    async fn events_after(&self, query: &EventQuery) -> Result<Vec<EventRecord>> {
        let after = match &query.after {
            None => 0,
            Some(position) => parse_counter(position).ok_or_else(|| bad_position(position))?,
        };
        let mut sql = String::from(
            "SELECT id, task_id, tenant, kind, step, data, created_at FROM events WHERE id > ?",
        );
        let mut binds: Vec<&str> = Vec::new();
        if let Some(tenant) = &query.tenant {
            sql.push_str(" AND tenant = ?");
            binds.push(tenant);
        }
        if let Some(task) = &query.task {
            sql.push_str(" AND task_id = ?");
            binds.push(task);
        }
        sql.push_str(" ORDER BY id LIMIT ?");
        let mut statement = sqlx::query(AssertSqlSafe(sql)).bind(after);
        for bind in binds {
            statement = statement.bind(bind);
        }
        let rows = statement
            .bind(page_limit(query.limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.try_get("id")?;
                event_from_row(row, id.to_string())
            })
            .collect()
    }
}
