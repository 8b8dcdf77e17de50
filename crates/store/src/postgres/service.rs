//! What the HTTP service needs, on PostgreSQL (`service.rs`): API keys and tasks owned by
//! tenants. Events are in `events.rs`.

use async_trait::async_trait;
use serde_json::Value;
use sqlx::AssertSqlSafe;

use super::PostgresStore;
use super::tasks::insert_task;
use crate::model::{NewTask, TaskRecord, TaskState, TaskSummary};
use crate::rows::{summary_from_row, to_json};
use crate::service::*;
use crate::service_rows::{KEY_COLUMNS, is_id_prefix, key_from_row, page_limit};
use crate::{Result, StoreError, Tasks, now_millis};

/// How often a create with a used idempotency key looks for the task that used it, when that
/// task vanishes in between (deleted right after it was found to exist).
const IDEMPOTENT_ATTEMPTS: usize = 3;

impl PostgresStore {
    /// The full id of the API key `id_or_prefix` names.
    async fn resolve_key(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim().to_ascii_lowercase();
        if !is_id_prefix(&wanted) {
            return Err(StoreError::NoSuchKey(id_or_prefix.to_owned()));
        }
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM api_keys WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%' ORDER BY id LIMIT 2",
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
                    "SELECT COUNT(*) FROM api_keys WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%'",
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
}

#[async_trait]
impl Keys for PostgresStore {
    async fn create_key(&self, key: &NewKey) -> Result<KeyRecord> {
        let record = KeyRecord {
            id: uuid::Uuid::now_v7().to_string(),
            tenant: key.tenant.clone(),
            label: key.label.clone(),
            scopes: key.scopes.clone(),
            created_at: now_millis(),
            revoked_at: None,
        };
        let inserted = sqlx::query(
            "INSERT INTO api_keys (id, tenant, label, secret_hash, scopes, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&record.id)
        .bind(&record.tenant)
        .bind(&record.label)
        .bind(&key.secret_hash)
        .bind(key.scopes.as_ref().map(to_json))
        .bind(record.created_at)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(record),
            // The id is new, so the unique violation is the secret hash's.
            Err(error)
                if error
                    .as_database_error()
                    .is_some_and(|e| e.is_unique_violation()) =>
            {
                let tenant = self
                    .key_by_hash(&key.secret_hash)
                    .await?
                    .map(|k| k.tenant)
                    .unwrap_or_default();
                Err(StoreError::DuplicateKey {
                    hash_prefix: key.secret_hash.chars().take(12).collect(),
                    tenant,
                })
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn key_by_hash(&self, secret_hash: &str) -> Result<Option<KeyRecord>> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE secret_hash = $1");
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
        (
            self.key_by_hash(secret_hash).await,
            self.task_state(task).await,
        )
    }

    async fn list_keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>> {
        let sql = format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE $1::text IS NULL OR tenant = $1 ORDER BY created_at, id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(key_from_row).collect()
    }

    async fn revoke_key(&self, id_or_prefix: &str) -> Result<KeyRecord> {
        let id = self.resolve_key(id_or_prefix).await?;
        let sql = format!(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 RETURNING {KEY_COLUMNS}"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(now_millis())
            .bind(&id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::NoSuchKey(id.clone()))?;
        key_from_row(&row)
    }
}

#[async_trait]
impl Tenancy for PostgresStore {
    async fn create_owned_task(
        &self,
        task: NewTask,
        initial_state: &Value,
        owner: &TaskOwner,
    ) -> Result<(TaskRecord, bool)> {
        for _ in 0..IDEMPOTENT_ATTEMPTS {
            let id = uuid::Uuid::now_v7().to_string();
            let mut tx = self.pool.begin().await?;
            if insert_task(
                &mut tx,
                &id,
                &task,
                initial_state,
                Some(owner),
                now_millis(),
            )
            .await?
            {
                super::db::commit(tx).await?;
                return Ok((self.task(&id).await?, true));
            }
            tx.rollback().await?;
            // The key was used: the conflicting insert has committed (ON CONFLICT waited for
            // it), so this statement's fresh snapshot sees its task.
            let earlier: Option<String> = sqlx::query_scalar(
                "SELECT id FROM tasks WHERE tenant = $1 AND idempotency_key = $2",
            )
            .bind(&owner.tenant)
            .bind(&owner.idempotency_key)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(earlier) = earlier {
                match self.task(&earlier).await {
                    Ok(record) => return Ok((record, false)),
                    Err(StoreError::NotFound(_)) => continue,
                    Err(error) => return Err(error),
                }
            }
        }
        Err(StoreError::IdempotencyRace {
            tenant: owner.tenant.clone(),
            key: owner.idempotency_key.clone().unwrap_or_default(),
        })
    }

    async fn task_tenant(&self, task: &str) -> Result<Option<String>> {
        let tenant: Option<Option<String>> =
            sqlx::query_scalar("SELECT tenant FROM tasks WHERE id = $1")
                .bind(task)
                .fetch_optional(&self.pool)
                .await?;
        tenant.ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }

    async fn list_tasks_page(&self, query: &TaskQuery) -> Result<Vec<TaskSummary>> {
        // Only the filters asked for are in the statement, so each listing uses its index
        // (`tasks_by_tenant` for a tenant's, the primary key otherwise).
        let mut sql = String::from(
            "SELECT id, skill_name, status, version, model, created_at, updated_at, labels FROM tasks WHERE true",
        );
        // Each condition's placeholders are numbered after the values bound so far.
        let mut binds: Vec<&str> = Vec::new();
        if let Some(tenant) = &query.tenant {
            binds.push(tenant);
            sql.push_str(&format!(" AND tenant = ${}", binds.len()));
        }
        if let Some(status) = query.status {
            binds.push(status.as_str());
            sql.push_str(&format!(" AND status = ${}", binds.len()));
        }
        if let Some(skill) = &query.skill {
            binds.push(skill);
            sql.push_str(&format!(" AND skill_name = ${}", binds.len()));
        }
        if let Some((key, value)) = &query.label {
            // Only string values match, as on SQLite; labels that are not JSON match nothing
            // (skillstate_jsonb is NULL for them) instead of failing the listing.
            binds.push(key);
            binds.push(value);
            sql.push_str(&format!(
                " AND skillstate_jsonb(labels) @> jsonb_build_object(${}::text, ${}::text)",
                binds.len() - 1,
                binds.len()
            ));
        }
        if let Some(batch) = &query.batch {
            binds.push(batch);
            sql.push_str(&format!(" AND batch_id = ${}", binds.len()));
        }
        if let Some(after) = &query.after {
            binds.push(after);
            sql.push_str(&format!(" AND id < ${}", binds.len()));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", binds.len() + 1));
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
