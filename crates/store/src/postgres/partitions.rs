//! Retention by partition on PostgreSQL (docs/storage.md, "PostgreSQL: retention by
//! partition"): the per-step tables (`TABLES`) are partitioned by RANGE over `task_id`, whose
//! uuid v7 text orders tasks by creation time, so one partition per period holds every row of
//! the tasks created in it. This module
//!
//! - moves a database at schema 17 to partitioned tables online (`migrate`, schema 18): a
//!   database that holds rows keeps its tables as the first partition, attached without a scan
//!   thanks to a CHECK constraint validated beforehand, under a lock that does not block writes;
//! - creates the partitions of the current and the next period ahead of time (`ensure`, at
//!   every read-write open and at every `gc`);
//! - retires a partition whose tasks are all finished and old by dropping it (`retire`), then
//!   deletes its task rows as `delete_task` would (forks' parent links cleared, skill versions
//!   collected), instead of deleting its rows one by one.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};

use super::PostgresStore;
use super::tasks::collect_version;
use crate::migrate::Migration;
use crate::traits::RetiredPartition;
use crate::{Result, StoreError, now_millis};

/// Every per-step table, in the order a step's commit first writes them (`skillstate_commit_step`,
/// 0016), which is the order their locks are taken in here.
const TABLES: [&str; 6] = [
    "intents",
    "observations",
    "journal",
    "recall_entries",
    "snapshots",
    "events",
];

/// The tables whose primary key was `(id)`: a partitioned table's unique indexes must include
/// the partition key, so they get a unique index on `(id, task_id)` first, built concurrently.
const ID_TABLES: [&str; 2] = ["recall_entries", "events"];

/// The settings of partitioning, one row, made before the migration proper so that an
/// operator can choose the period first (a table with just `period_ms` will do; the columns
/// the store needs are added). `period_ms`: the length of a partition's period, 30 days unless
/// set (at least a second; a change applies to partitions created afterwards). `legacy_bound`:
/// the bound chosen for the tables that existed (kept, so a migration resumed after a crash
/// uses the same); `covered_to_ms`: the end of the newest partition ever created.
const SETTINGS: &str =
    "CREATE TABLE IF NOT EXISTS skillstate_partitioning (period_ms BIGINT NOT NULL);
ALTER TABLE skillstate_partitioning ADD COLUMN IF NOT EXISTS legacy_bound TEXT COLLATE \"C\",
    ADD COLUMN IF NOT EXISTS legacy_to_ms BIGINT, ADD COLUMN IF NOT EXISTS covered_to_ms BIGINT;
INSERT INTO skillstate_partitioning (period_ms) SELECT 2592000000
    WHERE NOT EXISTS (SELECT 1 FROM skillstate_partitioning)";

/// The period as the store reads it: a second at least.
const PERIOD: &str = "GREATEST(period_ms, 1000)";

/// How long a statement of this module waits for a lock before giving up (and trying again
/// later): while it waits, the statements queued behind it wait too.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '3s'";

/// Attempts at a step that needs a strong lock, pausing between them.
const LOCK_ATTEMPTS: u32 = 20;

/// Key of the transaction-scoped advisory lock that serialises creating and retiring
/// partitions ("skillst" + 2).
const PARTITION_LOCK: i64 = 0x736b_696c_6c73_7402;

/// Key of the session advisory lock held while migration 18 runs ("skillst" + 3).
const ONLINE_LOCK: i64 = 0x736b_696c_6c73_7403;

/// The uuid v7 text bound of unix milliseconds `ms`: its 48-bit timestamp as the first 12 hex
/// digits (`xxxxxxxx-xxxx`). Every uuid v7 made at or after `ms` sorts at or after it, every
/// one made before sorts before it.
pub(crate) fn uuid_bound(ms: i64) -> String {
    let ms = ms.clamp(0, (1_i64 << 48) - 1);
    format!("{:08x}-{:04x}", ms >> 16, ms & 0xffff)
}

/// The suffix of the partitions starting at `from_ms`: `p` and its UTC time, to the second.
fn suffix_of(from_ms: i64) -> String {
    let digits: String = crate::time::utc(from_ms)
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    format!("p{digits}")
}

/// The start of the period holding `ms`.
fn period_start(ms: i64, period: i64) -> i64 {
    ms.div_euclid(period) * period
}

/// The end of the period after `from` (periods are aligned to the epoch), at least a second
/// away so that partition names stay distinct.
fn period_end(from: i64, period: i64) -> i64 {
    let mut to = period_start(from, period) + period;
    if to - from < 1000 {
        to += period;
    }
    to
}

/// True for the server's "lock not available" (lock_timeout) and deadlock answers: the step
/// is tried again.
fn lock_refused(error: &StoreError) -> bool {
    match error {
        StoreError::Database(sqlx::Error::Database(e)) => {
            matches!(e.code().as_deref(), Some("55P03" | "40P01"))
        }
        _ => false,
    }
}

/// One row of `sql` (no parameters), sent as a simple query: outside a transaction, through a
/// transaction pooler, a prepared statement's parts may reach different server connections.
async fn simple_row(conn: &mut PgConnection, sql: String) -> Result<sqlx::postgres::PgRow> {
    Ok(sqlx::raw_sql(AssertSqlSafe(sql)).fetch_one(conn).await?)
}

/// The one value of `sql`'s one row, as [`simple_row`] reads it.
async fn simple_scalar<T>(conn: &mut PgConnection, sql: String) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    Ok(simple_row(conn, sql).await?.try_get(0)?)
}

/// Runs `sql` (several statements, no parameters) on `conn`.
async fn run(conn: &mut PgConnection, sql: String) -> Result<()> {
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn).await?;
    Ok(())
}

/// Migration 18 (`0018_partitions.sql`), online, in several transactions; each step can be
/// run again after a crash. One connection holds a session advisory lock of its own
/// (`ONLINE_LOCK`) throughout, so two processes do not run it at once, and the swap, which
/// records the version, also takes the migrations' lock `lock_key` for its transaction and
/// checks the version again. A process waiting for the session lock asks again every 200 ms
/// rather than waiting inside a statement: a statement waiting holds a snapshot, which
/// `CREATE INDEX CONCURRENTLY` in the holder would wait for in turn. Through a transaction
/// pooler, which cannot keep a session's lock, only the swap is serialised.
pub(crate) async fn migrate(
    pool: &PgPool,
    migration: &Migration,
    lock_key: i64,
    transaction_pooler: bool,
) -> Result<()> {
    let mut conn = pool.acquire().await?;
    if done(&mut conn, migration).await? {
        return Ok(());
    }
    // Tables partitioned already (a database whose recorded versions were rolled back, as
    // tests do to build older schemas): only the version is recorded.
    let partitioned: bool = simple_scalar(
        &mut conn,
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('journal') AND relkind = 'p')"
            .to_owned(),
    )
    .await?;
    if partitioned {
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock_key)
            .execute(&mut *tx)
            .await?;
        let recorded: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version >= $1)",
        )
        .bind(migration.version)
        .fetch_one(&mut *tx)
        .await?;
        if !recorded {
            record_version(&mut tx, migration).await?;
        }
        tx.commit().await?;
        return Ok(());
    }
    // The settings, under the migrations' lock (two sessions creating a table at once can
    // both pass IF NOT EXISTS).
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key)
        .execute(&mut *tx)
        .await?;
    run(&mut tx, SETTINGS.to_owned()).await?;
    tx.commit().await?;
    // A store without tasks: one transaction.
    let started = Instant::now();
    let empty: bool = simple_scalar(
        &mut conn,
        "SELECT NOT EXISTS (SELECT 1 FROM tasks)".to_owned(),
    )
    .await?;
    let mut attempt = 1;
    let fresh = empty
        && loop {
            match swap_fresh(&mut conn, migration, lock_key).await {
                Err(error) if try_again(&error, &mut attempt).await => {}
                other => break other,
            }
        }?;
    if fresh {
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "schema 18: new partitioned tables"
        );
        return Ok(());
    }
    if transaction_pooler {
        return migrate_locked(&mut conn, migration, lock_key).await;
    }
    loop {
        let locked: bool = simple_scalar(
            &mut conn,
            format!("SELECT pg_try_advisory_lock({ONLINE_LOCK})"),
        )
        .await?;
        if locked {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let outcome = migrate_locked(&mut conn, migration, lock_key).await;
    let unlocked = run(
        &mut conn,
        format!("SELECT pg_advisory_unlock({ONLINE_LOCK})"),
    )
    .await;
    if outcome.is_err() || unlocked.is_err() {
        // Closing the session lets go of the lock (and of anything half done).
        let _ = conn.detach().close().await;
    }
    outcome
}

/// Whether the migration is recorded already.
async fn done(conn: &mut PgConnection, migration: &Migration) -> Result<bool> {
    let current: Option<i64> = simple_scalar(
        conn,
        "SELECT MAX(version) FROM schema_migrations".to_owned(),
    )
    .await?;
    Ok(current.unwrap_or(0) >= migration.version)
}

/// The online path, for a store that holds tasks.
async fn migrate_locked(
    conn: &mut PgConnection,
    migration: &Migration,
    lock_key: i64,
) -> Result<()> {
    if done(conn, migration).await? {
        return Ok(());
    }
    let started = Instant::now();
    // The bound under which every existing id lies: the start of the period after next, so
    // that tasks created while the migration runs (uuid v7 of now) are under it too.
    let row = simple_row(
        conn,
        format!(
            "SELECT legacy_bound, legacy_to_ms, {PERIOD}, {} FROM skillstate_partitioning LIMIT 1",
            super::NOW_MS
        ),
    )
    .await?;
    let chosen: (Option<String>, Option<i64>, i64, i64) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    let (bound, bound_ms) = match chosen {
        (Some(bound), Some(ms), ..) => (bound, ms),
        (_, _, period, now) => {
            let ms = period_start(now, period) + 2 * period;
            let bound = uuid_bound(ms);
            run(
                conn,
                format!(
                    "UPDATE skillstate_partitioning SET legacy_bound = '{bound}', legacy_to_ms = {ms}"
                ),
            )
            .await?;
            (bound, ms)
        }
    };
    // An id the store did not make (not uuid v7 text) may lie above the bound: the CHECK
    // would refuse it. Such rows stay where they are only if they are under the bound.
    let above: Option<String> = simple_scalar(
        conn,
        format!("SELECT MAX(id) FROM tasks WHERE id >= '{bound}'"),
    )
    .await?;
    if let Some(id) = above {
        return Err(StoreError::Partitioning {
            message: format!(
                "task `{id}` has an id that is not a uuid v7 made before {}; schema 18 partitions the journal by task id, and such a task would fall outside the partition of the existing rows. Delete or rename it, then open the store again",
                crate::time::utc(bound_ms)
            ),
        });
    }
    // 1. A CHECK constraint, enforced for new rows at once, validated below without blocking
    //    writes: ATTACH PARTITION then needs no scan.
    for table in TABLES {
        let exists: bool = simple_scalar(
            conn,
            format!(
                "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass('{table}') \
                 AND conname = '{table}_legacy_bound')"
            ),
        )
        .await?;
        if !exists {
            let t = Instant::now();
            let sql = format!(
                "ALTER TABLE {table} ADD CONSTRAINT {table}_legacy_bound CHECK (task_id < '{bound}') NOT VALID"
            );
            let mut attempt = 1;
            loop {
                match in_transaction(conn, &sql).await {
                    Err(error) if try_again(&error, &mut attempt).await => {}
                    other => break other,
                }
            }?;
            tracing::info!(
                table,
                ms = t.elapsed().as_millis() as u64,
                "schema 18: CHECK added (ACCESS EXCLUSIVE, no scan)"
            );
        }
    }
    // 2. Validation scans each table under SHARE UPDATE EXCLUSIVE: reads and writes go on.
    for table in TABLES {
        let t = Instant::now();
        run(
            conn,
            format!("ALTER TABLE {table} VALIDATE CONSTRAINT {table}_legacy_bound"),
        )
        .await?;
        tracing::info!(
            table,
            ms = t.elapsed().as_millis() as u64,
            "schema 18: CHECK validated (SHARE UPDATE EXCLUSIVE)"
        );
    }
    // 3. The unique indexes the partitioned primary keys need, built concurrently (outside a
    //    transaction); an invalid one left by an interrupted build is built again.
    for table in ID_TABLES {
        let index = format!("{table}_id_task");
        let valid: Option<bool> = simple_scalar(
            conn,
            format!(
                "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('{index}'))"
            ),
        )
        .await?;
        if valid == Some(false) {
            run(conn, format!("DROP INDEX CONCURRENTLY {index}")).await?;
        }
        if valid != Some(true) {
            let t = Instant::now();
            run(
                conn,
                format!("CREATE UNIQUE INDEX CONCURRENTLY {index} ON {table} (id, task_id)"),
            )
            .await?;
            tracing::info!(
                table,
                ms = t.elapsed().as_millis() as u64,
                "schema 18: unique index built concurrently"
            );
        }
    }
    // 4. The swap, one short transaction.
    let t = Instant::now();
    let mut attempt = 1;
    loop {
        match swap_online(conn, migration, lock_key, &bound, bound_ms).await {
            Err(error) if try_again(&error, &mut attempt).await => {}
            other => break other,
        }
    }?;
    tracing::info!(
        swap_ms = t.elapsed().as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        "schema 18: tables swapped (ACCESS EXCLUSIVE)"
    );
    Ok(())
}

/// After `error` from a step that needs a strong lock: true (after a pause) when the lock was
/// not available in time (or the step lost a deadlock) and the step has been tried fewer than
/// `LOCK_ATTEMPTS` times, so it is tried again.
async fn try_again(error: &StoreError, attempt: &mut u32) -> bool {
    if !lock_refused(error) || *attempt >= LOCK_ATTEMPTS {
        return false;
    }
    tracing::info!(%error, attempt = *attempt, "schema 18: a lock was not available; trying again");
    *attempt += 1;
    tokio::time::sleep(Duration::from_millis(200)).await;
    true
}

/// `sql` in a transaction of its own that waits at most `LOCK_TIMEOUT` for a lock.
async fn in_transaction(conn: &mut PgConnection, sql: &str) -> Result<()> {
    let mut tx = conn.begin().await?;
    run(&mut tx, format!("{LOCK_TIMEOUT}; {sql}")).await?;
    tx.commit().await?;
    Ok(())
}

/// In the swap's transaction: the migrations' lock (already held by this session unless
/// through a transaction pooler), then whether another process recorded the migration
/// meanwhile (`false`: nothing to do), then the tasks table locked against writes (a step's
/// commit locks its task's row first, so taking this first keeps the swap out of a deadlock
/// with one) and the per-step tables.
async fn swap_locks(conn: &mut PgConnection, migration: &Migration, lock_key: i64) -> Result<bool> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_key)
        .execute(&mut *conn)
        .await?;
    let done: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version >= $1)")
            .bind(migration.version)
            .fetch_one(&mut *conn)
            .await?;
    if done {
        return Ok(false);
    }
    let mut sql = format!("{LOCK_TIMEOUT}; LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE;");
    for table in TABLES {
        sql.push_str(&format!(" LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;"));
    }
    run(conn, sql).await?;
    Ok(true)
}

async fn record_version(conn: &mut PgConnection, migration: &Migration) -> Result<()> {
    sqlx::query("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)")
        .bind(migration.version)
        .bind(migration.name)
        .bind(now_millis())
        .execute(conn)
        .await?;
    Ok(())
}

/// A store without tasks (so without rows in the per-step tables): the tables are replaced.
/// `false` when a task appeared meanwhile (the online path then runs); `true` also when
/// another process migrated meanwhile.
async fn swap_fresh(conn: &mut PgConnection, migration: &Migration, lock_key: i64) -> Result<bool> {
    let mut tx = conn.begin().await?;
    if !swap_locks(&mut tx, migration, lock_key).await? {
        tx.rollback().await?;
        return Ok(true);
    }
    let empty: bool = sqlx::query_scalar("SELECT NOT EXISTS (SELECT 1 FROM tasks)")
        .fetch_one(&mut *tx)
        .await?;
    if !empty {
        tx.rollback().await?;
        return Ok(false);
    }
    let mut sql = String::from(
        "ALTER SEQUENCE events_id_seq OWNED BY NONE; ALTER SEQUENCE recall_entries_id_seq OWNED BY NONE;",
    );
    for table in TABLES {
        sql.push_str(&format!(" DROP TABLE {table};"));
    }
    run(&mut tx, sql).await?;
    run(&mut tx, migration.sql.to_owned()).await?;
    record_version(&mut tx, migration).await?;
    tx.commit().await?;
    Ok(true)
}

/// The tables that hold rows become `<table>_legacy`, the partition of every id under
/// `bound`, attached to new partitioned tables of the old names without a scan.
async fn swap_online(
    conn: &mut PgConnection,
    migration: &Migration,
    lock_key: i64,
    bound: &str,
    bound_ms: i64,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    if !swap_locks(&mut tx, migration, lock_key).await? {
        tx.rollback().await?;
        return Ok(());
    }
    let mut sql = String::new();
    for table in TABLES {
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = to_regclass($1) ORDER BY 1",
        )
        .bind(table)
        .fetch_all(&mut *tx)
        .await?;
        for index in indexes {
            sql.push_str(&format!(" ALTER INDEX {index} RENAME TO {index}_legacy;"));
        }
        sql.push_str(&format!(" ALTER TABLE {table} RENAME TO {table}_legacy;"));
    }
    // Row triggers come back from the partitioned tables, cloned onto every partition.
    sql.push_str(" DROP TRIGGER IF EXISTS journal_forgotten ON journal_legacy;");
    sql.push_str(" DROP TRIGGER IF EXISTS observations_recalled ON observations_legacy;");
    for table in ID_TABLES {
        sql.push_str(&format!(
            " ALTER TABLE {table}_legacy ADD CONSTRAINT {table}_id_task_legacy UNIQUE USING INDEX {table}_id_task_legacy;"
        ));
    }
    run(&mut tx, sql).await?;
    run(&mut tx, migration.sql.to_owned()).await?;
    let mut sql = String::new();
    for table in TABLES {
        sql.push_str(&format!(
            " ALTER TABLE {table} ATTACH PARTITION {table}_legacy FOR VALUES FROM (MINVALUE) TO ('{bound}');"
        ));
        sql.push_str(&format!(
            " ALTER TABLE {table}_legacy DROP CONSTRAINT {table}_legacy_bound;"
        ));
    }
    run(&mut tx, sql).await?;
    sqlx::query(
        "INSERT INTO skillstate_partitions (suffix, from_ms, to_ms, lo, hi) VALUES ('legacy', NULL, $1, NULL, $2)",
    )
    .bind(bound_ms)
    .bind(bound)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE skillstate_partitioning SET covered_to_ms = $1")
        .bind(bound_ms)
        .execute(&mut *tx)
        .await?;
    record_version(&mut tx, migration).await?;
    tx.commit().await?;
    Ok(())
}

impl PostgresStore {
    /// Creates the partitions of the current period and the next one (by the server's clock)
    /// that do not exist yet, above the newest one. A period some of whose tasks already
    /// exist (their rows went to the DEFAULT partition: no process created its partition in
    /// time) is left to the DEFAULT partition. Does nothing before schema 18.
    pub async fn ensure_partitions(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let settings: Option<(i64, Option<i64>, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {PERIOD}, covered_to_ms, {} FROM skillstate_partitioning \
             WHERE to_regclass('skillstate_partitions') IS NOT NULL LIMIT 1",
            super::NOW_MS
        )))
        .fetch_optional(&mut *tx)
        .await
        .or_else(|e| match &e {
            // Before schema 18 there is no settings table.
            sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => Ok(None),
            _ => Err(e),
        })?;
        let Some((period, covered, now)) = settings else {
            tx.rollback().await?;
            return Ok(());
        };
        let current = period_start(now, period);
        let target = current + 2 * period;
        if covered.is_some_and(|c| c >= target) {
            tx.rollback().await?;
            return Ok(());
        }
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(PARTITION_LOCK)
            .execute(&mut *tx)
            .await?;
        run(&mut tx, LOCK_TIMEOUT.to_owned()).await?;
        // Read again under the lock: another process may have created them meanwhile.
        let covered: Option<i64> =
            sqlx::query_scalar("SELECT covered_to_ms FROM skillstate_partitioning LIMIT 1")
                .fetch_one(&mut *tx)
                .await?;
        // Periods nobody covered in time stay with the DEFAULT partition.
        let mut from = covered.map_or(current, |c| c.max(current));
        while from < target {
            let to = period_end(from, period);
            let (lo, hi) = (uuid_bound(from), uuid_bound(to));
            let taken: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE id >= $1 AND id < $2)",
            )
            .bind(&lo)
            .bind(&hi)
            .fetch_one(&mut *tx)
            .await?;
            if !taken {
                let suffix = suffix_of(from);
                let mut sql = String::new();
                for table in TABLES {
                    sql.push_str(&format!(
                        " CREATE TABLE {table}_{suffix} PARTITION OF {table} FOR VALUES FROM ('{lo}') TO ('{hi}');"
                    ));
                }
                run(&mut tx, sql).await?;
                sqlx::query(
                    "INSERT INTO skillstate_partitions (suffix, from_ms, to_ms, lo, hi) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&suffix)
                .bind(from)
                .bind(to)
                .bind(&lo)
                .bind(&hi)
                .execute(&mut *tx)
                .await?;
            }
            from = to;
        }
        sqlx::query("UPDATE skillstate_partitioning SET covered_to_ms = $1")
            .bind(from)
            .execute(&mut *tx)
            .await?;
        super::db::commit(tx).await
    }

    /// `Tasks::retire_partitions` on PostgreSQL: every partition whose period ended (a
    /// minute, or one period if shorter, ago by the server's clock) and whose tasks are all
    /// finished and last updated before `updated_before` is dropped, then its tasks deleted.
    pub(super) async fn retire(
        &self,
        updated_before: i64,
        dry_run: bool,
    ) -> Result<Vec<RetiredPartition>> {
        if !dry_run {
            // Partitions interrupted between their drop and their tasks' deletion first.
            let dropped: Vec<(String, Option<String>, String)> = sqlx::query_as(
                "SELECT suffix, lo, hi FROM skillstate_partitions WHERE dropped ORDER BY hi",
            )
            .fetch_all(&self.pool)
            .await?;
            for (suffix, lo, hi) in dropped {
                self.delete_range(&suffix, lo.as_deref(), &hi).await?;
            }
            if let Err(error) = self.ensure_partitions().await {
                tracing::warn!(%error, "could not create the next partitions; new tasks' rows go to the DEFAULT partition until they are");
            }
        }
        let candidates: Vec<(String, Option<String>, String, i64)> =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT p.suffix, p.lo, p.hi, p.to_ms FROM skillstate_partitions p, skillstate_partitioning s \
                 WHERE NOT p.dropped AND p.to_ms + LEAST(GREATEST(s.period_ms, 1000), 60000) <= {} ORDER BY p.hi",
                super::NOW_MS
            )))
            .fetch_all(&self.pool)
            .await?;
        let mut retired = Vec::new();
        for (suffix, lo, hi, to_ms) in candidates {
            match self
                .retire_one(&suffix, lo.as_deref(), &hi, updated_before, dry_run)
                .await
            {
                Ok(Some(tasks)) => {
                    if !dry_run {
                        self.delete_range(&suffix, lo.as_deref(), &hi).await?;
                    }
                    retired.push(RetiredPartition {
                        name: suffix,
                        to_ms,
                        tasks,
                    });
                }
                Ok(None) => {}
                Err(error) if lock_refused(&error) => {
                    tracing::warn!(%error, partition = suffix, "a partition was not dropped: a lock was not available in time; its tasks are deleted one by one");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(retired)
    }

    /// Drops the partitions `suffix` if every task in [lo, hi) is finished and older than
    /// `updated_before`, marking the range for deletion; returns its tasks, or `None` when
    /// one does not qualify. The tasks' rows are locked first, so none changes meanwhile; the
    /// drops hold ACCESS EXCLUSIVE on each partitioned table only until the commit that
    /// follows them.
    async fn retire_one(
        &self,
        suffix: &str,
        lo: Option<&str>,
        hi: &str,
        updated_before: i64,
        dry_run: bool,
    ) -> Result<Option<Vec<String>>> {
        let mut tx = self.pool.begin().await?;
        run(&mut tx, LOCK_TIMEOUT.to_owned()).await?;
        let lock = if dry_run { "" } else { " FOR UPDATE" };
        let tasks: Vec<(String, String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, status, updated_at FROM tasks WHERE id >= COALESCE($1, '') AND id < $2 ORDER BY id{lock}"
        )))
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut *tx)
        .await?;
        let all_done = tasks.iter().all(|(_, status, updated_at)| {
            matches!(status.as_str(), "completed" | "failed") && *updated_at < updated_before
        });
        if !all_done || dry_run {
            tx.rollback().await?;
            return Ok(all_done.then(|| tasks.into_iter().map(|(id, ..)| id).collect()));
        }
        let mut sql = String::new();
        for table in TABLES {
            sql.push_str(&format!(" DROP TABLE {table}_{suffix};"));
        }
        run(&mut tx, sql).await?;
        sqlx::query("UPDATE skillstate_partitions SET dropped = true WHERE suffix = $1")
            .bind(suffix)
            .execute(&mut *tx)
            .await?;
        super::db::commit(tx).await?;
        Ok(Some(tasks.into_iter().map(|(id, ..)| id).collect()))
    }

    /// Deletes the tasks in [lo, hi) of a dropped partition, as `delete_task` does: forks
    /// keep their rows and lose their parent link, skill versions no task names any more are
    /// collected. Their per-step rows went with the partition; the cascade finds none.
    async fn delete_range(&self, suffix: &str, lo: Option<&str>, hi: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        const RANGE: &str = "id >= COALESCE($1, '') AND id < $2";
        sqlx::query(
            "UPDATE tasks SET parent_task = NULL WHERE parent_task >= COALESCE($1, '') AND parent_task < $2",
        )
        .bind(lo)
        .bind(hi)
        .execute(&mut *tx)
        .await?;
        let versions: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT spec_hash FROM task_versions WHERE task_id >= COALESCE($1, '') AND task_id < $2 \
             UNION SELECT upgrade_to FROM tasks WHERE {RANGE} AND upgrade_to IS NOT NULL"
        )))
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(AssertSqlSafe(format!("DELETE FROM tasks WHERE {RANGE}")))
            .bind(lo)
            .bind(hi)
            .execute(&mut *tx)
            .await?;
        for hash in &versions {
            collect_version(&mut tx, hash).await?;
        }
        sqlx::query("DELETE FROM skillstate_partitions WHERE suffix = $1")
            .bind(suffix)
            .execute(&mut *tx)
            .await?;
        super::db::commit(tx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_order_uuid_v7_ids_by_their_time() {
        let at = 1_796_000_000_123_i64;
        let bound = uuid_bound(at);
        assert_eq!(bound.len(), 13);
        let id = |ms: i64| {
            let ts = uuid::Timestamp::from_unix(
                uuid::NoContext,
                (ms / 1000) as u64,
                ((ms % 1000) * 1_000_000) as u32,
            );
            uuid::Uuid::new_v7(ts).to_string()
        };
        assert!(id(at) > bound);
        assert!(id(at + 1) > bound);
        assert!(id(at - 1) < bound);
        assert!(uuid_bound(at - 1) < bound);
    }

    #[test]
    fn periods_are_aligned_and_names_distinct() {
        let period = 2_592_000_000;
        let from = period_start(1_796_000_000_123, period);
        assert_eq!(from % period, 0);
        assert_eq!(period_end(from, period), from + period);
        // After a change of period, the first partition ends on the new alignment.
        assert_eq!(period_end(4_000, 1_500), 6_000);
        assert_ne!(suffix_of(4_000), suffix_of(period_end(4_000, 1_500)));
        assert_eq!(suffix_of(0), "p19700101000000");
    }
}
