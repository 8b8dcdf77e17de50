//! The backend's one way to the server: every statement and every transaction goes through
//! [`Db`], which is where two things are decided once for the whole store.
//!
//! **Dead connections.** The pool does not ping a connection before handing it out (that ping
//! was one round trip per checkout, several per step). A dead connection is found instead by
//! the statement that uses it: an I/O error, a closed socket, or the server's own
//! `57P01 admin_shutdown` / `57P02` / `57P03` / class `08` answer ([`is_connection_lost`]).
//! Such a failure marks the time; every pooled connection opened before it is then discarded
//! at its next checkout (`before_acquire` compares the connection's age, no round trip), so a
//! restarted server costs one failed statement, not one per pooled connection. Statements
//! outside a transaction (a step's commit, claims, reads) run on connections the store keeps
//! itself ([`Db::lend`], `lent.rs`), because sqlx pings every connection given back to its pool;
//! the same rule retires those. What is retried
//! on a fresh connection, pausing 20 ms and doubling up to 0.5 s between attempts, for up to
//! the pool's acquire timeout (a server that restarts within it is ridden out):
//! - `BEGIN` ([`Db::begin`]): nothing of the transaction was sent yet;
//! - a whole transaction that failed before its `COMMIT` was sent ([`Db::unit`] around units
//!   that commit through [`commit`]): the server rolled it back when the connection died, and
//!   the unit runs again from its first read;
//! - a single read outside a transaction (`SELECT`).
//!
//! A `COMMIT` whose answer was lost is not retried blindly: whether it was recorded is
//! unknown ([`StoreError::CommitUnknown`]). The units a worker runs on every step read the
//! answer from the database on a fresh connection ([`Db::checked_unit`]) and run again only
//! when their rows are not there: a step (its journal row: step, attempt, time, answer; the
//! task's version check refuses a second one anyway), an action's result (its intent is done
//! with this result), a status, the settling of a claim (the lease is gone). The others report
//! it. A write outside a transaction is retried only where running it twice is harmless (a
//! claim, whose lost answer leaves a lease that expires; renewing or releasing a lease).
//!
//! **Transaction poolers** (`[store] transaction_pooler`, PgBouncer in `pool_mode =
//! transaction`). Such a pooler lends a server connection for one transaction only, and sqlx
//! prepares a statement (Parse, Sync) and runs it (Bind, Execute, Sync) in two exchanges: outside
//! a transaction the two may reach different server connections. So with the setting on, the
//! client keeps no statement between transactions (statement cache off) and a statement outside
//! a transaction runs in one of its own. The pooler must drop the server-side statements each
//! transaction leaves behind (`server_reset_query = DEALLOCATE ALL`,
//! `server_reset_query_always = 1`: docs/storage.md, PostgreSQL).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt, stream};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::{Either, Execute, Executor, PgPool, Postgres, SqlStr, Transaction};

use super::lent::{Lent, LentConnection};
use crate::{Result, StoreError};

/// The store's pool and how it reaches the server.
#[derive(Clone, Debug)]
pub(super) struct Db {
    pool: PgPool,
    /// Connections for statements outside a transaction, given back without sqlx's ping
    /// (`lent.rs`).
    lent: Arc<Lent>,
    transaction_pooler: bool,
    health: Arc<Health>,
    /// How long lost connections are retried for: a server restarting within it is ridden
    /// out (the pool's acquire timeout).
    window: Duration,
}

/// How long the server lets one of the store's sessions sit idle inside a transaction.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "SET idle_in_transaction_session_timeout = '15s'";

/// The pause between attempts after a lost connection, doubling up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Attempts after lost connections, within a time window.
struct Retry {
    until: Instant,
    pause: Duration,
}

impl Retry {
    fn new(window: Duration) -> Self {
        Self {
            until: Instant::now() + window,
            pause: FIRST_PAUSE,
        }
    }

    /// Waits before the next attempt; `false` when the window is over.
    async fn pause(&mut self) -> bool {
        if Instant::now() + self.pause > self.until {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }
}

/// When a connection was last found dead, in milliseconds since `base` (0: never).
#[derive(Debug)]
struct Health {
    base: Instant,
    lost_at: AtomicU64,
}

impl Health {
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    fn mark_lost(&self) {
        self.lost_at.fetch_max(self.now(), Ordering::SeqCst);
    }

    /// Whether a connection of `age` was opened after the last connection was found dead.
    fn usable(&self, age: Duration) -> bool {
        let lost = self.lost_at.load(Ordering::SeqCst);
        let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        lost == 0 || self.now().saturating_sub(age) > lost
    }
}

/// Whether `error` says the connection itself is gone (rather than the statement failing):
/// I/O errors, and the server's answers for a connection it is closing or cannot serve.
pub(super) fn is_connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now; class 08
            // connection_exception.
            matches!(&*code, "57P01" | "57P02" | "57P03") || code.starts_with("08")
        }),
        _ => false,
    }
}

impl Db {
    /// `max_connections` in all: the pool's for transactions, and as many again lent to lone
    /// statements (`lent.rs`).
    pub(super) async fn connect(
        options: PgConnectOptions,
        max_connections: u32,
        lent_connections: u32,
        acquire_timeout: Duration,
        transaction_pooler: bool,
    ) -> std::result::Result<Self, sqlx::Error> {
        let health = Arc::new(Health {
            base: Instant::now(),
            lost_at: AtomicU64::new(0),
        });
        let checked = health.clone();
        // A client frozen inside a transaction (stopped, swapped out, cut off) would hold its
        // row locks for as long as it stays frozen, and a task's lease could not be taken over
        // meanwhile: the server ends such a session instead. Store transactions send their
        // statements back to back, so none sits idle this long. Set on each new connection, not
        // as a startup `options` parameter, which PgBouncer refuses; a URL that sets it keeps
        // its own; through a transaction pooler a session setting would outlive the
        // transaction, so the pooler's own applies (PgBouncer's `idle_transaction_timeout`).
        let bound_idle = !transaction_pooler
            && !options
                .get_options()
                .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"));
        let pool = PgPoolOptions::new()
            .after_connect(move |connection, _meta| {
                Box::pin(async move {
                    if bound_idle {
                        connection.execute(IDLE_IN_TRANSACTION_TIMEOUT).await?;
                    }
                    Ok(())
                })
            })
            .max_connections(max_connections)
            .acquire_timeout(acquire_timeout)
            // No ping per checkout: a dead connection is found by the statement that uses it
            // (module docs).
            .test_before_acquire(false)
            .before_acquire(move |_connection, meta| {
                let usable = checked.usable(meta.age);
                Box::pin(async move { Ok(usable) })
            })
            .connect_with(options)
            .await?;
        Ok(Self {
            pool,
            lent: Arc::new(Lent::new(lent_connections)),
            transaction_pooler,
            health,
            window: acquire_timeout,
        })
    }

    pub(super) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A connection for one statement outside a transaction (`lent.rs`): give it back after a
    /// statement that succeeded.
    pub(super) async fn lend(&self) -> std::result::Result<LentConnection<'_>, sqlx::Error> {
        let health = &self.health;
        self.lent
            .lend(&self.pool, self.window, |age| health.usable(age))
            .await
    }

    /// One write sent alone, as its own transaction on the server (a function such as
    /// `skillstate_commit_step`): one round trip on a lent connection. A lost connection leaves
    /// its outcome unknown ([`Db::after_lone_write`]). Through a transaction pooler it runs
    /// inside a transaction of its own (Parse and Bind must reach the same server connection).
    pub(super) async fn write_alone(
        &self,
        query: sqlx::query::Query<'_, Postgres, PgArguments>,
    ) -> Result<PgRow> {
        if self.transaction_pooler {
            let mut tx = self.begin().await?;
            let row = query.fetch_one(&mut *tx).await?;
            commit(tx).await?;
            return Ok(row);
        }
        let mut lent = self.lend().await?;
        match query.fetch_one(lent.connection()).await {
            Ok(row) => {
                lent.give_back();
                Ok(row)
            }
            Err(error) => {
                if reusable_after(&error) {
                    lent.give_back();
                }
                Err(self.after_lone_write(error.into()))
            }
        }
    }

    /// Whether the store runs behind a transaction pooler (`[store] transaction_pooler`).
    pub(super) fn transaction_pooler(&self) -> bool {
        self.transaction_pooler
    }

    /// The error of a write sent as a single statement outside a transaction (its own
    /// transaction on the server): a lost connection leaves its outcome unknown, as a lost
    /// `COMMIT` answer does ([`StoreError::CommitUnknown`], which [`Db::checked_unit`] settles
    /// by reading), never a plain error that would run it again blindly.
    pub(super) fn after_lone_write(&self, error: StoreError) -> StoreError {
        match error {
            StoreError::Database(error) if is_connection_lost(&error) => {
                self.health.mark_lost();
                StoreError::CommitUnknown {
                    message: error.to_string(),
                }
            }
            other => other,
        }
    }

    /// Starts a transaction. A `BEGIN` that finds its connection dead is sent again on a fresh
    /// connection (nothing of the transaction was sent), within the retry window.
    pub(super) async fn begin(
        &self,
    ) -> std::result::Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut retry = Retry::new(self.window);
        loop {
            match self.pool.begin().await {
                Err(error) if is_connection_lost(&error) => {
                    self.health.mark_lost();
                    tracing::debug!(%error, "a connection was dead at BEGIN; retrying on a fresh one");
                    if !retry.pause().await {
                        return Err(error);
                    }
                }
                other => return other,
            }
        }
    }

    /// Runs one transaction unit (`run` begins it and commits it through [`commit`]) and runs
    /// it again when it failed on a lost connection before its `COMMIT` was sent: the server
    /// rolled that attempt back, and the next reads everything afresh. Within the retry window.
    pub(super) async fn unit<T, F, Fut>(&self, mut run: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut retry = Retry::new(self.window);
        loop {
            match run().await {
                Err(StoreError::Database(error)) if is_connection_lost(&error) => {
                    self.health.mark_lost();
                    tracing::debug!(%error, "a transaction lost its connection before COMMIT; running it again");
                    if !retry.pause().await {
                        return Err(StoreError::Database(error));
                    }
                }
                other => return other,
            }
        }
    }

    /// [`unit`](Self::unit) for a unit that can tell from the database whether it was
    /// recorded (`recorded`: its own rows are there). When the answer to its `COMMIT` was lost
    /// ([`StoreError::CommitUnknown`]), the outcome is read on a fresh connection: recorded,
    /// it is done (`T::default()`); not recorded, the server rolled it back and it runs again.
    pub(super) async fn checked_unit<T, F, Fut, C, CFut>(
        &self,
        mut run: F,
        recorded: C,
    ) -> Result<T>
    where
        T: Default,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
        C: FnOnce() -> CFut,
        CFut: Future<Output = Result<bool>>,
    {
        match self.unit(&mut run).await {
            Err(StoreError::CommitUnknown { message }) => {
                tracing::warn!(%message, "the answer to a COMMIT was lost; reading whether it was recorded");
                if recorded().await? {
                    Ok(T::default())
                } else {
                    self.unit(&mut run).await
                }
            }
            other => other,
        }
    }

    /// A statement outside a transaction, as a re-runnable copy.
    async fn run_alone(
        &self,
        statement: Statement,
    ) -> std::result::Result<Vec<Fetched>, sqlx::Error> {
        let mut retry = Retry::new(self.window);
        loop {
            match self.run_once(&statement).await {
                Err(error) if is_connection_lost(&error) => {
                    self.health.mark_lost();
                    if !statement.is_read() || !retry.pause().await {
                        return Err(error);
                    }
                }
                other => return other,
            }
        }
    }

    async fn run_once(
        &self,
        statement: &Statement,
    ) -> std::result::Result<Vec<Fetched>, sqlx::Error> {
        if self.transaction_pooler {
            // Parse and Bind must reach the same server connection: inside a transaction they do.
            let mut tx = self.begin().await?;
            let fetched = statement.run(&mut tx).await?;
            tx.commit().await?;
            Ok(fetched)
        } else {
            let mut lent = self.lend().await?;
            let fetched = statement.run(lent.connection()).await;
            if fetched.as_ref().err().is_none_or(reusable_after) {
                lent.give_back();
            }
            fetched
        }
    }
}

/// Whether a connection whose statement failed with `error` can serve the next one: the
/// server answered with an error of the statement's own (the connection is in a known state).
/// After anything else — a lost connection, a protocol or decoding error — it is dropped.
pub(super) fn reusable_after(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(_)) && !is_connection_lost(error)
}

/// Commits `tx`. A lost connection here leaves the outcome unknown, which is reported as such
/// (never as a plain database error that [`Db::unit`] would run again).
pub(super) async fn commit(tx: Transaction<'static, Postgres>) -> Result<()> {
    match tx.commit().await {
        Ok(()) => Ok(()),
        Err(error) if is_connection_lost(&error) => Err(StoreError::CommitUnknown {
            message: error.to_string(),
        }),
        Err(error) => Err(error.into()),
    }
}

type Fetched = Either<PgQueryResult, PgRow>;

/// A statement taken apart so that it can be sent again.
struct Statement {
    sql: SqlStr,
    arguments: Option<PgArguments>,
    persistent: bool,
}

impl Statement {
    fn take<'q, E: Execute<'q, Postgres>>(mut query: E) -> std::result::Result<Self, sqlx::Error> {
        let arguments = query.take_arguments().map_err(sqlx::Error::Encode)?;
        let persistent = query.persistent();
        Ok(Self {
            sql: query.sql(),
            arguments,
            persistent,
        })
    }

    /// A read (`SELECT`, or `WITH … SELECT`, writing nothing), which may run twice.
    fn is_read(&self) -> bool {
        let sql = self.sql.as_str().trim_start().to_ascii_uppercase();
        (sql.starts_with("SELECT") || sql.starts_with("WITH"))
            && ![
                "INSERT ",
                "UPDATE ",
                "DELETE ",
                "NEXTVAL",
                "SETVAL",
                "LOCK",
                "FOR UPDATE",
            ]
            .iter()
            .any(|word| sql.contains(word))
    }

    async fn run(
        &self,
        connection: &mut sqlx::PgConnection,
    ) -> std::result::Result<Vec<Fetched>, sqlx::Error> {
        match &self.arguments {
            Some(arguments) => {
                let query = sqlx::query_with(self.sql.clone(), arguments.clone())
                    .persistent(self.persistent);
                connection.fetch_many(query).try_collect().await
            }
            None => {
                connection
                    .fetch_many(sqlx::raw_sql(self.sql.clone()))
                    .try_collect()
                    .await
            }
        }
    }
}

/// Statements on the store's pool (`.fetch_one(&self.pool)`) go through [`Db`] like
/// transactions do.
impl<'c> Executor<'c> for &'c Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, std::result::Result<Fetched, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        let statement = Statement::take(query);
        stream::once(async move { db.run_alone(statement?).await })
            .map(|fetched| match fetched {
                Ok(all) => stream::iter(all.into_iter().map(Ok)).left_stream(),
                Err(error) => stream::iter([Err(error)]).right_stream(),
            })
            .flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        let statement = Statement::take(query);
        Box::pin(async move {
            let fetched = db.run_alone(statement?).await?;
            Ok(fetched.into_iter().find_map(|item| match item {
                Either::Right(row) => Some(row),
                Either::Left(_) => None,
            }))
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<sqlx::postgres::PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        (&self.pool).prepare_with(sql, parameters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_opened_before_a_loss_is_retired_and_one_opened_after_is_kept() {
        let health = Health {
            base: Instant::now() - Duration::from_secs(10),
            lost_at: AtomicU64::new(0),
        };
        assert!(health.usable(Duration::from_secs(5)));
        health.mark_lost();
        assert!(!health.usable(Duration::from_secs(5)));
        assert!(!health.usable(Duration::from_millis(2)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(health.usable(Duration::ZERO));
    }
}
