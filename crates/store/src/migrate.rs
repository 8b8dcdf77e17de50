//! Embedded, versioned schema migrations. Each migration runs in its own transaction together
//! with the row that records it, so a crash leaves the schema at a known version.

use sqlx::{AssertSqlSafe, PgPool, SqlitePool};

use crate::{StoreError, now_millis};

pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

pub const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "leases",
        sql: include_str!("../migrations/sqlite/0002_leases.sql"),
    },
    Migration {
        version: 3,
        name: "queue",
        sql: include_str!("../migrations/sqlite/0003_queue.sql"),
    },
    Migration {
        version: 4,
        name: "output_tokens",
        sql: include_str!("../migrations/sqlite/0004_output_tokens.sql"),
    },
    Migration {
        version: 5,
        name: "service",
        sql: include_str!("../migrations/sqlite/0005_service.sql"),
    },
    Migration {
        version: 6,
        name: "inbox",
        sql: include_str!("../migrations/sqlite/0006_inbox.sql"),
    },
    // SQLite only: PostgreSQL keeps skill and tools in `tasks` (TOAST).
    Migration {
        version: 7,
        name: "task_specs",
        sql: include_str!("../migrations/sqlite/0007_task_specs.sql"),
    },
    Migration {
        version: 8,
        name: "boards",
        sql: include_str!("../migrations/sqlite/0008_boards.sql"),
    },
    Migration {
        version: 9,
        name: "board_snapshots",
        sql: include_str!("../migrations/sqlite/0009_board_snapshots.sql"),
    },
    Migration {
        version: 10,
        name: "spec_hash",
        sql: include_str!("../migrations/sqlite/0010_spec_hash.sql"),
    },
    Migration {
        version: 11,
        name: "recall",
        sql: include_str!("../migrations/sqlite/0011_recall.sql"),
    },
    Migration {
        version: 12,
        name: "world_step",
        sql: include_str!("../migrations/sqlite/0012_world_step.sql"),
    },
    Migration {
        version: 13,
        name: "skill_versions",
        sql: include_str!("../migrations/sqlite/0013_skill_versions.sql"),
    },
    Migration {
        version: 14,
        name: "board_schemas",
        sql: include_str!("../migrations/sqlite/0014_board_schemas.sql"),
    },
    Migration {
        version: 15,
        name: "trace_context",
        sql: include_str!("../migrations/sqlite/0015_trace_context.sql"),
    },
    Migration {
        version: 16,
        name: "recall_deferred",
        sql: include_str!("../migrations/sqlite/0016_recall_deferred.sql"),
    },
    Migration {
        version: 17,
        name: "carried_observations",
        sql: include_str!("../migrations/sqlite/0017_carried_observations.sql"),
    },
];

pub const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "leases",
        sql: include_str!("../migrations/postgres/0002_leases.sql"),
    },
    Migration {
        version: 3,
        name: "queue",
        sql: include_str!("../migrations/postgres/0003_queue.sql"),
    },
    Migration {
        version: 4,
        name: "output_tokens",
        sql: include_str!("../migrations/postgres/0004_output_tokens.sql"),
    },
    Migration {
        version: 5,
        name: "service",
        sql: include_str!("../migrations/postgres/0005_service.sql"),
    },
    Migration {
        version: 6,
        name: "inbox",
        sql: include_str!("../migrations/postgres/0006_inbox.sql"),
    },
    Migration {
        version: 7,
        name: "claim_by_batch",
        sql: include_str!("../migrations/postgres/0007_claim_by_batch.sql"),
    },
    Migration {
        version: 8,
        name: "boards",
        sql: include_str!("../migrations/postgres/0008_boards.sql"),
    },
    Migration {
        version: 9,
        name: "board_snapshots",
        sql: include_str!("../migrations/postgres/0009_board_snapshots.sql"),
    },
    Migration {
        version: 10,
        name: "spec_hash",
        sql: include_str!("../migrations/postgres/0010_spec_hash.sql"),
    },
    Migration {
        version: 11,
        name: "recall",
        sql: include_str!("../migrations/postgres/0011_recall.sql"),
    },
    Migration {
        version: 12,
        name: "world_step",
        sql: include_str!("../migrations/postgres/0012_world_step.sql"),
    },
    Migration {
        version: 13,
        name: "skill_versions",
        sql: include_str!("../migrations/postgres/0013_skill_versions.sql"),
    },
    Migration {
        version: 14,
        name: "board_schemas",
        sql: include_str!("../migrations/postgres/0014_board_schemas.sql"),
    },
    Migration {
        version: 15,
        name: "trace_context",
        sql: include_str!("../migrations/postgres/0015_trace_context.sql"),
    },
    Migration {
        version: 16,
        name: "step_function",
        sql: include_str!("../migrations/postgres/0016_step_function.sql"),
    },
    Migration {
        version: 17,
        name: "work_notify",
        sql: include_str!("../migrations/postgres/0017_work_notify.sql"),
    },
    // Runs online, in several transactions (src/postgres/partitions.rs); its SQL is the last
    // one's.
    Migration {
        version: 18,
        name: "partitions",
        sql: include_str!("../migrations/postgres/0018_partitions.sql"),
    },
    Migration {
        version: 19,
        name: "carried_observations",
        sql: include_str!("../migrations/postgres/0019_carried_observations.sql"),
    },
    Migration {
        version: 20,
        name: "leaner_step",
        sql: include_str!("../migrations/postgres/0020_leaner_step.sql"),
    },
];

/// The PostgreSQL migration that runs online, in several transactions of its own.
const POSTGRES_ONLINE: i64 = 18;

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
        if migration.name == "spec_hash" {
            record_spec_hashes_sqlite(&mut tx).await?;
        }
        if migration.name == "recall" {
            index_journal_sqlite(&mut tx).await?;
        }
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

/// Migration 10's Rust step on SQLite: the recorded hash of every earlier task's skill and
/// tools (SQLite has no SHA-256 of its own), then the trigger that freezes them, again.
async fn record_spec_hashes_sqlite(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
) -> Result<(), StoreError> {
    // A thousand at a time: a big database's specs are never all in memory.
    let mut after: i64 = 0;
    loop {
        let rows: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT rowid, skill, tools FROM task_specs WHERE rowid > ? ORDER BY rowid LIMIT 1000",
        )
        .bind(after)
        .fetch_all(&mut **tx)
        .await?;
        let Some((last, _, _)) = rows.last() else {
            break;
        };
        after = *last;
        for (rowid, skill, tools) in rows {
            sqlx::query("UPDATE task_specs SET spec_hash = ? WHERE rowid = ?")
                .bind(crate::rows::spec_hash(&skill, &tools))
                .bind(rowid)
                .execute(&mut **tx)
                .await?;
        }
    }
    sqlx::raw_sql(
        "CREATE TRIGGER task_specs_frozen BEFORE UPDATE ON task_specs \
         BEGIN SELECT RAISE(ABORT, 'a task''s skill and tools are frozen at its creation'); END",
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A journal row as migration 11 reads it: task, step, output, patch, action.
type JournalRow = (String, i64, String, Option<String>, Option<String>);

/// Migration 11's Rust step on SQLite: the recall entries of every accepted step already in
/// the journal (core's `step_entries`), a thousand rows at a time.
async fn index_journal_sqlite(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
) -> Result<(), StoreError> {
    let mut after = (String::new(), -1_i64);
    loop {
        let rows: Vec<JournalRow> = sqlx::query_as(
            "SELECT task_id, step, output, patch, action FROM journal \
             WHERE verdict = 'accepted' AND (task_id > ?1 OR (task_id = ?1 AND step > ?2)) \
             ORDER BY task_id, step LIMIT 1000",
        )
        .bind(&after.0)
        .bind(after.1)
        .fetch_all(&mut **tx)
        .await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = (last.0.clone(), last.1);
        for (task, step, output, patch, action) in rows {
            for entry in journal_row_entries(&output, patch.as_deref(), action.as_deref()) {
                sqlx::query(
                    "INSERT INTO recall_entries (task_id, step, kind, pointer, text) VALUES (?, ?, ?, ?, ?)",
                )
                .bind(&task)
                .bind(step)
                .bind(entry.kind.as_str())
                .bind(entry.pointer)
                .bind(entry.text)
                .execute(&mut **tx)
                .await?;
            }
        }
    }
    Ok(())
}

/// Migration 11's Rust step on PostgreSQL, as on SQLite.
async fn index_journal_postgres(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
) -> Result<(), StoreError> {
    let mut after = (String::new(), -1_i64);
    loop {
        let rows: Vec<JournalRow> = sqlx::query_as(
            "SELECT task_id, step, output, patch, action FROM journal \
             WHERE verdict = 'accepted' AND (task_id, step) > ($1, $2) \
             ORDER BY task_id, step LIMIT 1000",
        )
        .bind(&after.0)
        .bind(after.1)
        .fetch_all(&mut **tx)
        .await?;
        let Some(last) = rows.last() else {
            break;
        };
        after = (last.0.clone(), last.1);
        for (task, step, output, patch, action) in rows {
            for entry in journal_row_entries(&output, patch.as_deref(), action.as_deref()) {
                sqlx::query(
                    "INSERT INTO recall_entries (task_id, step, kind, pointer, text) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&task)
                .bind(step)
                .bind(entry.kind.as_str())
                .bind(entry.pointer)
                .bind(entry.text)
                .execute(&mut **tx)
                .await?;
            }
        }
    }
    Ok(())
}

/// A stored journal row's recall entries (its patch and action as stored JSON text).
fn journal_row_entries(
    output: &str,
    patch: Option<&str>,
    action: Option<&str>,
) -> Vec<skillstate_core::recall::IndexEntry> {
    let patch = patch.and_then(|p| serde_json::from_str(p).ok());
    let action = action.and_then(|a| serde_json::from_str(a).ok());
    skillstate_core::recall::step_entries(output, patch.as_ref(), action.as_ref())
}

/// Applies every pending PostgreSQL migration; `transaction_pooler`: the server is reached
/// through one (no session-level lock can be held then).
pub async fn migrate_postgres(pool: &PgPool, transaction_pooler: bool) -> Result<(), StoreError> {
    migrate_postgres_until(pool, i64::MAX, transaction_pooler).await
}

/// Applies the PostgreSQL migrations up to `target` (tests build databases of an older schema
/// with it, to migrate them later).
pub async fn migrate_postgres_to(pool: &PgPool, target: i64) -> Result<(), StoreError> {
    migrate_postgres_until(pool, target, false).await
}

async fn migrate_postgres_until(
    pool: &PgPool,
    target: i64,
    transaction_pooler: bool,
) -> Result<(), StoreError> {
    let supported = POSTGRES.last().map(|m| m.version).unwrap_or(0);
    for migration in POSTGRES.iter().take_while(|m| m.version <= target) {
        if migration.version == POSTGRES_ONLINE {
            crate::postgres::migrate_partitions(
                pool,
                migration,
                POSTGRES_MIGRATION_LOCK,
                transaction_pooler,
            )
            .await?;
            continue;
        }
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
        if migration.name == "recall" {
            index_journal_postgres(&mut tx).await?;
        }
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

/// For read-only opens: the database holds a skillstate schema this version can read, and
/// nothing is created or changed.
pub async fn check_sqlite(pool: &SqlitePool, location: &str) -> Result<(), StoreError> {
    let has_table: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
    )
    .fetch_optional(pool)
    .await?;
    if has_table.is_none() {
        return Err(StoreError::NoSchema {
            location: location.to_owned(),
        });
    }
    let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
        .fetch_one(pool)
        .await?;
    check_version(current, SQLITE, location)
}

/// The PostgreSQL twin of [`check_sqlite`]; looks in the connection's `search_path`. `pool` is
/// the backend's executor, which knows how to reach the server through a transaction pooler.
pub async fn check_postgres<'c, E>(pool: E, location: &str) -> Result<(), StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres> + Copy,
{
    let has_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('schema_migrations')::text")
            .fetch_one(pool)
            .await?;
    if has_table.is_none() {
        return Err(StoreError::NoSchema {
            location: location.to_owned(),
        });
    }
    let current: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
        .fetch_one(pool)
        .await?;
    check_version(current, POSTGRES, location)
}

/// Read-only commands read any schema version from 1 up to the newest this build knows; the
/// columns older versions lack are only used by commands that write (and migrate first), and
/// SQLite's task reads find skill and tools in `tasks` before schema 7 (`sqlite/mod.rs`).
fn check_version(
    current: Option<i64>,
    migrations: &[Migration],
    location: &str,
) -> Result<(), StoreError> {
    let supported = migrations.last().map(|m| m.version).unwrap_or(0);
    match current {
        None | Some(..=0) => Err(StoreError::NoSchema {
            location: location.to_owned(),
        }),
        Some(found) if found > supported => Err(StoreError::SchemaTooNew { found, supported }),
        Some(_) => Ok(()),
    }
}
