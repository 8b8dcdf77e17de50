//! The server backend: PostgreSQL, for several runners sharing one store. One module per
//! concern: `tasks.rs`, `journal.rs`, `leases.rs`, `queue.rs` (with `rate.rs` and `report.rs`),
//! `service.rs` (keys, tenants) and `events.rs`; this one connects and resolves ids.
//!
//! It keeps the SQLite backend's behaviour to the byte: the same text in every JSON column, the
//! same snapshot rule, the same errors. Where SQLite serialises writers with `BEGIN IMMEDIATE`,
//! this backend relies on row locks under READ COMMITTED: a conditional `UPDATE` waits for a
//! concurrent writer of the same row and then re-checks its `WHERE` against the committed row,
//! which is what turns a second commit of the same version into a `Conflict`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};

use db::Db;

use crate::migrate::{check_postgres, migrate_postgres};
use crate::{DEFAULT_SNAPSHOT_EVERY, OpenMode, Result, StoreError};

mod boards;
mod db;
mod events;
mod inbox;
mod journal;
mod leases;
mod lent;
mod partitions;
mod queue;
mod rate;
mod recall;
mod report;
mod service;
mod step_fn;
mod tasks;
mod wake;

pub(crate) use partitions::migrate as migrate_partitions;

/// The server's clock in unix milliseconds, as SQL: leases, claims, backoffs and rate windows
/// are timed by it, so workers on machines with skewed clocks agree.
pub(super) const NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// Server connections one store opens at most, unless `max_connections` says otherwise: enough
/// for a few runners and the CLI next to a server (PostgreSQL's default limit is 100 per
/// server). Half are the pool's, for transactions; lone statements (a step's commit, claims,
/// reads) have the other half (`lent.rs`). All are opened as they are needed.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;
/// The bounds of `max_connections`: one of each kind at least; PostgreSQL's own limit is the
/// server's `max_connections`, shared by every client.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<u32> = 2..=1000;
/// Long enough to ride out a burst of concurrent commits, short enough that a dead server
/// surfaces as an error instead of a hang.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PostgresStore {
    /// Every statement and transaction goes through it (`db.rs`).
    pool: Db,
    snapshot_every: u64,
    /// Idle workers' wake-up signal, started by the first that asks (`wake.rs`).
    wake: wake::Signal,
}

/// A task by its id (`$1`): every column (`tenant` came with schema 5, and read-only opens read
/// older schemas too: `rows::later_text_column`) and the skill and tools of the version it runs
/// (`skill_versions`, schema 13), checked against `t.spec_hash` when decoded.
pub(super) const TASK_BY_ID: &str = "SELECT t.*, v.skill, v.tools FROM tasks t LEFT JOIN skill_versions v ON v.hash = t.spec_hash WHERE t.id = $1";

impl PostgresStore {
    /// Opens `url` (`postgres://user@host:port/db`, with libpq-style query parameters such as
    /// `options=-c search_path=name`) and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_mode(url, OpenMode::ReadWrite).await
    }

    /// Opens `url`; with `OpenMode::Existing` nothing is created or migrated, and a database
    /// without skillstate tables is reported as such.
    pub async fn open_mode(url: &str, mode: OpenMode) -> Result<Self> {
        Self::open_with(url, mode, false).await
    }

    /// Opens `url` in `mode`; `transaction_pooler` (`[store] transaction_pooler`, or
    /// `transaction_pooler=true` in the URL's query) says the server is reached through a pooler
    /// that lends a connection for one transaction at a time, such as PgBouncer in
    /// `pool_mode = transaction`: the client then keeps no prepared statement between
    /// transactions, runs every statement inside a transaction, and sends no startup parameter
    /// such a pooler refuses (`db.rs`; docs/storage.md, PostgreSQL).
    pub async fn open_with(url: &str, mode: OpenMode, transaction_pooler: bool) -> Result<Self> {
        Self::open_configured(
            url,
            mode,
            &Connections {
                transaction_pooler,
                max_connections: None,
            },
        )
        .await
    }

    /// Opens `url` in `mode` with `settings` (`[store]`); the URL's own `transaction_pooler`
    /// and `max_connections` parameters take precedence.
    pub async fn open_configured(
        url: &str,
        mode: OpenMode,
        settings: &Connections,
    ) -> Result<Self> {
        let (options, settings) = connect_options(url, settings)?;
        Self::connect(url, options, None, mode, settings).await
    }

    /// Like [`open`](Self::open), but keeps every table in `schema`, which is created when
    /// missing. The schema is set as `search_path` at connection startup, so every pooled
    /// connection uses it, including ones opened later.
    pub async fn open_in_schema(url: &str, schema: &str) -> Result<Self> {
        if !is_plain_identifier(schema) {
            return Err(StoreError::Open {
                location: redact(url),
                message: format!(
                    "`{schema}` is not a usable schema name; use letters, digits and `_`, starting with a letter or `_`, at most 63 characters"
                ),
            });
        }
        let (options, settings) = connect_options(url, &Connections::default())?;
        if settings.transaction_pooler {
            return Err(pooler_refuses_options(url));
        }
        let options = options.options([("search_path", format!("\"{schema}\""))]);
        Self::connect(url, options, Some(schema), OpenMode::ReadWrite, settings).await
    }

    async fn connect(
        url: &str,
        options: PgConnectOptions,
        schema: Option<&str>,
        mode: OpenMode,
        settings: Connections,
    ) -> Result<Self> {
        let transaction_pooler = settings.transaction_pooler;
        let open_error = |e: sqlx::Error| {
            let message = e.to_string();
            // PgBouncer refuses startup parameters it does not know (`extra_float_digits`,
            // `options`) unless told to ignore them; with the setting on, none is sent.
            if !transaction_pooler && message.contains("unsupported startup parameter") {
                return StoreError::TransactionPooler { message };
            }
            StoreError::Open {
                location: redact(url),
                message,
            }
        };
        // One plain connection first: the pool retries a refused or rejected connection until
        // its acquire timeout and then reports only "timed out", while this fails at once
        // with the server's actual answer (refused, bad password, no such database).
        let mut probe = PgConnection::connect_with(&options)
            .await
            .map_err(open_error)?;
        if let Some(schema) = schema {
            // The name was checked by `is_plain_identifier`, so quoting it is enough.
            let sql = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
            if let Err(error) = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut probe).await {
                // Two sessions creating the same schema at once can both pass the existence
                // check; the loser fails on the catalog's unique index although the schema now
                // exists, which is all that was asked for.
                let raced = error
                    .as_database_error()
                    .is_some_and(|e| e.is_unique_violation());
                if !raced {
                    return Err(error.into());
                }
            }
        }
        probe.close().await?;
        let total = settings.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        let pool = Db::connect(
            options,
            total / 2,
            total - total / 2,
            ACQUIRE_TIMEOUT,
            transaction_pooler,
        )
        .await
        .map_err(open_error)?;
        match mode {
            OpenMode::ReadWrite => migrate_postgres(pool.pool(), transaction_pooler).await?,
            OpenMode::Existing => check_postgres(&pool, &redact(url)).await?,
        }
        let store = Self {
            pool,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            wake: Default::default(),
        };
        if mode == OpenMode::ReadWrite
            && let Err(error) = store.ensure_partitions().await
        {
            // Rows of tasks whose period has no partition yet go to the DEFAULT partition:
            // nothing fails, the next open or gc tries again.
            tracing::warn!(%error, "could not create the next journal partitions");
        }
        Ok(store)
    }

    /// Writes a full snapshot every `k` steps (`k` ≥ 1).
    pub fn with_snapshot_every(mut self, k: u64) -> Self {
        self.snapshot_every = k.max(1);
        self
    }

    pub fn pool(&self) -> &PgPool {
        self.pool.pool()
    }

    pub(super) async fn resolve_id(&self, id_or_prefix: &str) -> Result<String> {
        let wanted = id_or_prefix.trim();
        if wanted.is_empty() || !wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(StoreError::NotFound(id_or_prefix.to_owned()));
        }
        // PostgreSQL's LIKE is case-sensitive where SQLite's is not; ids are lowercase. The
        // range bounds let a generic plan use the primary key: every id character sorts below
        // `~`, and the column is COLLATE "C".
        let lower = wanted.to_ascii_lowercase();
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%' ORDER BY id LIMIT 2",
        )
        .bind(&lower)
        .fetch_all(&self.pool)
        .await?;
        match ids.as_slice() {
            [] => Err(StoreError::NotFound(id_or_prefix.to_owned())),
            [one] => Ok(one.clone()),
            _ => {
                if let Some(exact) = ids.iter().find(|id| **id == lower) {
                    return Ok(exact.clone());
                }
                let count: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM tasks WHERE id >= $1 AND id < $1 || '~' AND id LIKE $1 || '%'",
                )
                .bind(&lower)
                .fetch_one(&self.pool)
                .await?;
                Err(StoreError::Ambiguous {
                    prefix: wanted.to_owned(),
                    count: count as usize,
                })
            }
        }
    }

    pub(super) async fn current_version(&self, task: &str) -> Result<u64> {
        let version: Option<i64> = sqlx::query_scalar("SELECT version FROM tasks WHERE id = $1")
            .bind(task)
            .fetch_optional(&self.pool)
            .await?;
        version
            .map(|v| v as u64)
            .ok_or_else(|| StoreError::NotFound(task.to_owned()))
    }

    pub(super) async fn sum_bytes(&self, sql: &'static str, task: &str) -> Result<u64> {
        let value: Option<i64> = sqlx::query_scalar(sql)
            .bind(task)
            .fetch_one(&self.pool)
            .await?;
        Ok(value.unwrap_or(0) as u64)
    }
}

/// How a store reaches its server: through a transaction pooler or not, with how many
/// connections (`[store]`, or the URL's `transaction_pooler` and `max_connections`
/// parameters, which sqlx does not see).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Connections {
    pub transaction_pooler: bool,
    /// `None`: [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: Option<u32>,
}

/// The connect options of `url` and its connection settings: `settings`, overridden by the
/// URL's own parameters.
fn connect_options(url: &str, settings: &Connections) -> Result<(PgConnectOptions, Connections)> {
    let (bare, from_url) = take_store_parameters(url)?;
    let settings = Connections {
        transaction_pooler: settings.transaction_pooler || from_url.transaction_pooler,
        max_connections: from_url.max_connections.or(settings.max_connections),
    };
    if let Some(n) = settings.max_connections
        && !MAX_CONNECTIONS_RANGE.contains(&n)
    {
        return Err(StoreError::Open {
            location: redact(url),
            message: format!(
                "max_connections = {n} is out of range: give {} to {} (half for transactions, half for single statements)",
                MAX_CONNECTIONS_RANGE.start(),
                MAX_CONNECTIONS_RANGE.end()
            ),
        });
    }
    let pooler = settings.transaction_pooler;
    let options = PgConnectOptions::from_str(&bare).map_err(|e| StoreError::Open {
        location: redact(url),
        message: e.to_string(),
    })?;
    let options = if pooler {
        // A transaction pooler lends a server connection per transaction: a statement prepared
        // in one is gone (or another client's) in the next, so none is kept. Startup
        // parameters reach only the server connection the pooler opened for someone else, and
        // PgBouncer 1.18 refuses those it does not track: `extra_float_digits` is not sent
        // (PostgreSQL 12 and later print floats exactly without it), and `options` is refused
        // here with the way out.
        if options.get_options().is_some() {
            return Err(pooler_refuses_options(url));
        }
        options.statement_cache_capacity(0).extra_float_digits(None)
    } else {
        options
    };
    // libpq's default `prefer` tries TLS first. To a server on this machine that buys nothing
    // (no network to protect; `prefer` never verified the server anyway), and the handshake
    // cost about 90 ms per connection here (two small writes stalled by Nagle's algorithm
    // against delayed ACKs): every process, pool connection and CLI command paid it. An
    // explicit `sslmode` in the URL or PGSSLMODE is followed as given.
    let chose_tls = names_ssl_mode(url) || std::env::var_os("PGSSLMODE").is_some();
    let options = if !chose_tls && is_local_host(options.get_host()) {
        options.ssl_mode(PgSslMode::Disable)
    } else {
        options
    };
    Ok((options, settings))
}

/// `url` without the store's own query parameters (`transaction_pooler`, `max_connections`),
/// and their values.
pub(crate) fn take_store_parameters(url: &str) -> Result<(String, Connections)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Connections::default()));
    };
    let mut settings = Connections::default();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        if key == "max_connections" {
            let n = value.parse::<u32>().map_err(|_| StoreError::Open {
                location: redact(url),
                message: format!(
                    "`max_connections={value}` is not a number of connections; give {} to {}",
                    MAX_CONNECTIONS_RANGE.start(),
                    MAX_CONNECTIONS_RANGE.end()
                ),
            })?;
            settings.max_connections = Some(n);
            continue;
        }
        if key != "transaction_pooler" {
            kept.push(pair);
            continue;
        }
        settings.transaction_pooler = match value.to_ascii_lowercase().as_str() {
            "true" | "1" | "on" | "yes" => true,
            "false" | "0" | "off" | "no" => false,
            other => {
                return Err(StoreError::Open {
                    location: redact(url),
                    message: format!(
                        "`transaction_pooler={other}` is not a setting; use `transaction_pooler=true` (through PgBouncer in transaction mode) or leave it out"
                    ),
                });
            }
        };
    }
    let bare = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((bare, settings))
}

/// Why a schema (`search_path`) cannot be chosen per connection through a transaction pooler.
fn pooler_refuses_options(url: &str) -> StoreError {
    StoreError::Open {
        location: redact(url),
        message: "through a transaction pooler (`transaction_pooler`) the connection cannot carry startup `options` such as `-c search_path=…`: the pooler does not pass them on to the server connections it lends. Set the schema where every server connection gets it: on the role (`ALTER ROLE name IN DATABASE db SET search_path = schema`) or in the pooler's database entry (pgbouncer.ini: `connect_query = 'SET search_path = schema'`)".to_owned(),
    }
}

/// Whether the URL's query sets `sslmode` (or its alias `ssl-mode`).
fn names_ssl_mode(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query.split('&').any(|pair| {
            let key = pair.split_once('=').map_or(pair, |(key, _)| key);
            key.eq_ignore_ascii_case("sslmode") || key.eq_ignore_ascii_case("ssl-mode")
        })
    })
}

/// A loopback address, `localhost`, or a Unix socket directory.
fn is_local_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.starts_with('/')
        || bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Schema names are spliced into SQL and into the startup options, so only names that need no
/// escaping in either are accepted.
fn is_plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

/// The URL without its password (in the user info or a `password` parameter), for error
/// messages that end up in terminals and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<&str> = query
                .split('&')
                .map(|pair| {
                    if pair.starts_with("password=") {
                        "password=***"
                    } else {
                        pair
                    }
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[async_trait::async_trait]
impl crate::Release for PostgresStore {
    async fn release(&self) {
        self.pool.pool().close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(url: &str) -> PgSslMode {
        match connect_options(url, &Connections::default()) {
            Ok((options, _)) => options.get_ssl_mode(),
            Err(error) => panic!("{url}: {error}"),
        }
    }

    #[test]
    fn the_url_sets_the_connections_and_a_bad_count_names_the_parameter() {
        let settings = |url: &str, given: Connections| connect_options(url, &given).map(|(_, s)| s);
        let url = "postgres://u@127.0.0.1/db?max_connections=48&application_name=w";
        let from_url = settings(url, Connections::default()).expect("a valid URL");
        assert_eq!(from_url.max_connections, Some(48));
        assert!(!from_url.transaction_pooler);
        // The URL wins over `[store]`; `[store]` applies where the URL says nothing.
        let configured = Connections {
            transaction_pooler: false,
            max_connections: Some(8),
        };
        assert_eq!(settings(url, configured).unwrap().max_connections, Some(48));
        assert_eq!(
            settings("postgres://u@127.0.0.1/db", configured)
                .unwrap()
                .max_connections,
            Some(8)
        );
        // The parameter is the store's: sqlx never sees it.
        let (bare, _) = take_store_parameters(url).unwrap();
        assert_eq!(bare, "postgres://u@127.0.0.1/db?application_name=w");
        for bad in [
            "max_connections=many",
            "max_connections=-1",
            "max_connections=1",
            "max_connections=5000",
        ] {
            let error = settings(
                &format!("postgres://u@127.0.0.1/db?{bad}"),
                Connections::default(),
            )
            .expect_err(bad)
            .to_string();
            assert!(
                error.contains("max_connections") && error.contains("2 to 1000"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn a_server_on_this_machine_is_reached_without_tls_unless_the_url_asks_for_it() {
        if std::env::var_os("PGSSLMODE").is_some() {
            return;
        }
        for local in [
            "postgres://u@127.0.0.1:5432/db",
            "postgres://u@localhost/db?options=-c%20search_path%3Ds",
            "postgres://u@[::1]:5432/db",
        ] {
            assert!(matches!(mode(local), PgSslMode::Disable), "{local}");
        }
        assert!(matches!(
            mode("postgres://u@127.0.0.1/db?sslmode=require"),
            PgSslMode::Require
        ));
        assert!(matches!(
            mode("postgres://u@localhost/db?ssl-mode=verify-full"),
            PgSslMode::VerifyFull
        ));
        // Elsewhere, libpq's default stands.
        assert!(matches!(
            mode("postgres://u@db.example.com/db"),
            PgSslMode::Prefer
        ));
    }
}
