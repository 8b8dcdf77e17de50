//! What the queue bench's steps cost the PostgreSQL server, read from the server itself between
//! two samples: statements (`pg_stat_statements`, where the server loads it), their execution
//! time, WAL bytes written, and — when the server runs on this machine — the CPU time of its
//! processes. Together with the wire's round trips (`wire`) and the workers' own CPU time these
//! are the measurements the capacity model in the Performance guide rests on.
//!
//! Every figure is a difference of two server-wide counters, so it counts whatever else the
//! server did meanwhile (autovacuum, other clients): run the bench on a server nothing else
//! uses.

use std::time::Duration;

use serde::Serialize;
use sqlx::{Connection, PgConnection, Row};

/// How long the probe waits for the server on each of its own statements.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A connection of the probe's own and the counters read at the start.
pub struct ServerCost {
    conn: PgConnection,
    /// The schema of the `pg_stat_statements` views, quoted (the URL's search_path may not
    /// include it); else why they cannot be read.
    statements: Result<String, String>,
    postmaster: Option<u32>,
    before: Sample,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// `pg_stat_statements`: calls and execution time of the current database's statements.
    calls: i64,
    exec_ms: f64,
    /// Entries the view evicted to make room (`pg_stat_statements_info.dealloc`): the sums
    /// above are comparable only while it stays the same.
    evicted: i64,
    /// The server's WAL position, in bytes.
    wal: i64,
    /// CPU time of the server's processes (live ones and the exited ones the postmaster reaped).
    cpu: Option<Duration>,
}

/// The server's cost per accepted step between `ServerCost::start` and `ServerCost::finish`.
#[derive(Debug, Clone, Serialize)]
pub struct ServerCostReport {
    /// Statements per step as `pg_stat_statements` counts them (top-level statements: a
    /// function call is one), when the server loads it; else why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statements_per_step: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement_exec_us_per_step: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_stat_statements: Option<String>,
    pub wal_bytes_per_step: f64,
    /// CPU time of every PostgreSQL process per step (a server on this machine only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_step: Option<f64>,
}

impl ServerCost {
    /// Connects to `url` (a `postgres://` URL) and reads the counters; `None` for any other
    /// location. `pg_stat_statements` is used when the server preloads it (the extension is
    /// created in the database if it is missing, which needs a superuser).
    pub async fn start(url: &str) -> Result<Option<Self>, String> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Ok(None);
        }
        // Without the store's own parameters (`max_connections`, `transaction_pooler`).
        let url = skillstate_store::postgres_server_url(url).map_err(|e| e.to_string())?;
        let url = url.as_str();
        let mut conn = tokio::time::timeout(TIMEOUT, PgConnection::connect(url))
            .await
            .map_err(|_| format!("server cost: connecting to {url} took over {TIMEOUT:?}"))?
            .map_err(|e| format!("server cost: cannot connect to {url}: {e}"))?;
        let statements = enable_statements(&mut conn).await;
        let postmaster = if is_local(url) {
            let backend: i32 = query_scalar(&mut conn, "SELECT pg_backend_pid()").await?;
            u32::try_from(backend).ok().and_then(parent_of)
        } else {
            None
        };
        let mut probe = Self {
            conn,
            statements,
            postmaster,
            before: Sample::default(),
        };
        probe.before = probe.sample().await?;
        Ok(Some(probe))
    }

    /// Reads the counters again and divides what they grew by by `steps`.
    pub async fn finish(mut self, steps: u64) -> Result<ServerCostReport, String> {
        let after = self.sample().await?;
        let before = self.before;
        let per_step = |total: f64| total / steps.max(1) as f64;
        let statements = match self.statements {
            Ok(_) if after.evicted != before.evicted => Err(format!(
                "{} entries were evicted during the run (pg_stat_statements.max is too small for what the server ran meanwhile): run again on a quiet server",
                after.evicted - before.evicted
            )),
            other => other.map(|_| ()),
        };
        Ok(ServerCostReport {
            // The sample's own read of the view is one call of the current database.
            statements_per_step: statements
                .is_ok()
                .then(|| per_step((after.calls - before.calls - 1).max(0) as f64)),
            statement_exec_us_per_step: statements
                .is_ok()
                .then(|| per_step((after.exec_ms - before.exec_ms) * 1000.0)),
            pg_stat_statements: statements.err(),
            wal_bytes_per_step: per_step((after.wal - before.wal) as f64),
            server_cpu_us_per_step: after
                .cpu
                .zip(before.cpu)
                .map(|(after, before)| per_step(after.saturating_sub(before).as_secs_f64() * 1e6)),
        })
    }

    async fn sample(&mut self) -> Result<Sample, String> {
        let wal: i64 = query_scalar(
            &mut self.conn,
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
        )
        .await?;
        let (calls, exec_ms, evicted) = if let Ok(schema) = &self.statements {
            let sql = format!(
                "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8, \
                 (SELECT dealloc FROM {schema}.pg_stat_statements_info) \
                 FROM {schema}.pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            );
            let row = tokio::time::timeout(
                TIMEOUT,
                sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(&mut self.conn),
            )
            .await
            .map_err(|_| format!("server cost: reading pg_stat_statements took over {TIMEOUT:?}"))?
            .map_err(|e| format!("server cost: reading pg_stat_statements: {e}"))?;
            (
                row.get::<i64, _>(0),
                row.get::<f64, _>(1),
                row.get::<i64, _>(2),
            )
        } else {
            (0, 0.0, 0)
        };
        Ok(Sample {
            calls,
            exec_ms,
            evicted,
            wal,
            cpu: self.postmaster.and_then(server_cpu),
        })
    }
}

async fn query_scalar<T>(conn: &mut PgConnection, sql: &'static str) -> Result<T, String>
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    tokio::time::timeout(TIMEOUT, sqlx::query_scalar::<_, T>(sql).fetch_one(conn))
        .await
        .map_err(|_| format!("server cost: `{sql}` took over {TIMEOUT:?}"))?
        .map_err(|e| format!("server cost: `{sql}`: {e}"))
}

/// Makes `pg_stat_statements` readable in the current database and names its schema, or says
/// why it cannot be read.
async fn enable_statements(conn: &mut PgConnection) -> Result<String, String> {
    let preload: String =
        query_scalar(conn, "SELECT current_setting('shared_preload_libraries')").await?;
    if !preload
        .split(',')
        .any(|library| library.trim() == "pg_stat_statements")
    {
        return Err(format!(
            "not loaded (shared_preload_libraries = '{preload}'; to count statements: ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements', restart the server)"
        ));
    }
    tokio::time::timeout(
        TIMEOUT,
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&mut *conn),
    )
    .await
    .map_err(|_| "CREATE EXTENSION pg_stat_statements timed out".to_owned())?
    .map_err(|e| format!("CREATE EXTENSION pg_stat_statements: {e} (it needs a superuser)"))?;
    // The schema name comes from the server's catalogue, quoted by the server.
    let schema: String = query_scalar(
        conn,
        "SELECT quote_ident(n.nspname) FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
         WHERE e.extname = 'pg_stat_statements'",
    )
    .await?;
    Ok(schema)
}

/// Whether the URL's host is this machine (so the server's processes are visible in /proc).
fn is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = if host_port.ends_with(']') {
        host_port
    } else {
        host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host)
    };
    matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "")
}

/// The fields of /proc/PID/stat after the process name.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: the fields start after the last `)`.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn parent_of(pid: u32) -> Option<u32> {
    // After the name: state (0), ppid (1).
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// CPU time of the postmaster, its live children and the children it has reaped.
fn server_cpu(postmaster: u32) -> Option<Duration> {
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&ticks| ticks > 0)? as f64;
    // After the name: utime (11), stime (12), cutime (13), cstime (14).
    let ticks = |fields: &[String], from: usize, to: usize| -> u64 {
        fields[from..=to]
            .iter()
            .filter_map(|field| field.parse::<u64>().ok())
            .sum()
    };
    let own = stat_fields(postmaster)?;
    if own.len() < 15 {
        return None;
    }
    let mut total = ticks(&own, 11, 14);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(fields) = stat_fields(pid)
            && fields.len() >= 15
            && fields[1] == postmaster.to_string()
        {
            total += ticks(&fields, 11, 12);
        }
    }
    Some(Duration::from_secs_f64(total as f64 / ticks_per_sec))
}

#[cfg(test)]
mod tests {
    use super::is_local;

    #[test]
    fn local_hosts_are_recognised() {
        assert!(is_local("postgres://postgres@127.0.0.1:5432/test"));
        assert!(is_local("postgres://localhost/test?sslmode=disable"));
        assert!(is_local("postgresql://u:p@[::1]:5432/db"));
        assert!(is_local("postgresql://[::1]/db"));
        assert!(!is_local("postgres://postgres@db.example:5432/test"));
        assert!(!is_local("postgres://postgres@10.0.0.7/test"));
    }
}
