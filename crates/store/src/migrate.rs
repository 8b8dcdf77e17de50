//! Embedded, versioned schema migrations. Each migration runs in its own transaction together
//! with the row that records it, so a crash leaves the schema at a known version.

use sqlx::{AssertSqlSafe, PgPool, SqlitePool};

use crate::{StoreError, now_millis};

pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

pub const SQLITE: &[Migration] = &[Migration {
    version: 1,
    name: "init",
    sql: include_str!("../migrations/sqlite/0001_init.sql"),
}];

pub const POSTGRES: &[Migration] = &[Migration {
    version: 1,
    name: "init",
    sql: include_str!("../migrations/postgres/0001_init.sql"),
}];

/// Key of the transaction-scoped advisory lock that serialises migrations across processes.
/// Advisory locks are per database, not per schema, so stores in different schemas of one
/// database take turns migrating; migrations are short, and this keeps the key a constant.
const POSTGRES_MIGRATION_LOCK: i64 = 0x736b_696c_6c73_7401; // "skillst" + 1

pub async fn migrate_sqlite(pool: &SqlitePool) -> Result<(), StoreError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    let supported = SQLITE.last().map(|m| m.version).unwrap_or(0);
    for migration in SQLITE {
        // BEGIN IMMEDIATE takes the write lock first, so two processes opening a fresh file at
        // once cannot both apply the same migration.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
            .fetch_one(&mut *tx)
            .await?;
        let current = current.unwrap_or(0);
        if current > supported {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported,
            });
        }
        if current >= migration.version {
            tx.commit().await?;
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(migration.sql))
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)")
            .bind(migration.version)
            .bind(migration.name)
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
        .fetch_one(pool)
        .await?;
    if let Some(found) = current
        && found > supported
    {
        return Err(StoreError::SchemaTooNew { found, supported });
    }
    Ok(())
}

pub async fn migrate_postgres(pool: &PgPool) -> Result<(), StoreError> {
    let supported = POSTGRES.last().map(|m| m.version).unwrap_or(0);
    for migration in POSTGRES {
        let mut tx = pool.begin().await?;
        // Taken before anything else, including creating schema_migrations: two sessions
        // running `CREATE TABLE IF NOT EXISTS` at once can both pass the existence check and
        // one then fails on the catalog's unique index. The lock is released at commit or
        // rollback, so an error cannot leave it held.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(POSTGRES_MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
            .fetch_one(&mut *tx)
            .await?;
        let current = current.unwrap_or(0);
        if current > supported {
            return Err(StoreError::SchemaTooNew {
                found: current,
                supported,
            });
        }
        if current >= migration.version {
            tx.commit().await?;
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(migration.sql))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
        )
        .bind(migration.version)
        .bind(migration.name)
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    Ok(())
}
