//! PgBouncer in transaction mode in front of the test PostgreSQL server, for tests of the
//! PostgreSQL store through a transaction pooler: the store conformance suite's third backend,
//! the crash harness through the pooler (crates/cli/tests/crash_safety.rs) and
//! crates/store/tests/pgbouncer.rs. Included with `#[path]` like `skip.rs`; the including crate
//! needs anyhow, sqlx and tempfile.
//!
//! - [`Bouncer`]: a PgBouncer process of the test's own on a free loopback port, killed on drop
//!   (also when the test panics).
//! - [`Pooler`]: the PgBouncer a test goes through: the one `scripts/test` started for the whole
//!   run (`SKILLSTATE_TEST_PGBOUNCER_URL`), else one of the test's own; its settings are checked
//!   on PgBouncer's admin console, so a URL that is not a transaction pooler cannot pass for one.
//! - [`RoleSchema`]: a login role and a schema of the same name, the role's `search_path` set to
//!   the schema. PgBouncer pools server connections per database and user, so every server
//!   connection lent to that role works in that schema: the only way to choose a schema through
//!   a transaction pooler besides `connect_query` (startup `options` cannot pass one).
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::{AssertSqlSafe, Connection};

pub const INSTALL: &str = "apt-get install -y pgbouncer";

/// How long a statement or connection of these helpers may take: a stuck server or pooler
/// fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(30);

/// Where `scripts/test` puts the URL of the PgBouncer it started; `off` skips the tests (and
/// the conformance suite's third backend) that need one.
pub const POOLER_ENV: &str = "SKILLSTATE_TEST_PGBOUNCER_URL";

/// How a skipped pooler test is enabled again.
pub const ENABLE: &str = "unset it to let each test start a PgBouncer of its own (Debian's pgbouncer), or point it at a PgBouncer in transaction mode whose admin console admits the test user (scripts/test starts one)";

/// The settings docs/storage.md gives an operator for PgBouncer in transaction mode. Keep in
/// step with the configuration `scripts/test` writes for its PgBouncer.
pub const TRANSACTION_MODE: &str =
    "pool_mode = transaction\nserver_reset_query = DEALLOCATE ALL\nserver_reset_query_always = 1";

/// The PgBouncer program: `SKILLSTATE_TEST_PGBOUNCER`, else Debian's.
pub fn pgbouncer_program() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("SKILLSTATE_TEST_PGBOUNCER") {
        return Ok(PathBuf::from(path));
    }
    for candidate in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if Path::new(candidate).exists() {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "pgbouncer is not installed (the transaction-pooler tests need it): run `{INSTALL}` (scripts/test does when it runs as root), point SKILLSTATE_TEST_PGBOUNCER at it, or set {POOLER_ENV}=off to skip them"
    )
}

/// The test server's host, port, user and database, which PgBouncer connects to.
pub fn server_of(url: &str) -> anyhow::Result<(String, u16, String, String)> {
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .with_context(|| format!("SKILLSTATE_TEST_POSTGRES_URL `{url}` is not a postgres URL"))?;
    let database = options.get_database().unwrap_or("postgres").to_owned();
    Ok((
        options.get_host().to_owned(),
        options.get_port(),
        options.get_username().to_owned(),
        database,
    ))
}

/// A PgBouncer process of this test's own; killed on drop.
pub struct Bouncer {
    child: Child,
    port: u16,
    /// The test server's user, PgBouncer's `auth_user` and admin.
    user: String,
    dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bouncer {
    /// Starts PgBouncer with `settings` added to its `[pgbouncer]` section (`pool_mode` among
    /// them), serving `test`: the test server's database, logged into as the client's user.
    /// `databases` adds entries to `[databases]`. Trust authentication: the test server's user
    /// is in the auth file, any other role is looked up through it (`auth_user`, which must read
    /// `pg_shadow`: the test server's superuser), and it may use the admin console.
    pub fn start(server_url: &str, databases: &str, settings: &str) -> anyhow::Result<Self> {
        let program = pgbouncer_program()?;
        let (host, server_port, user, database) = server_of(server_url)?;
        let dir = tempfile::tempdir()?;
        let auth = dir.path().join("userlist.txt");
        std::fs::write(&auth, format!("\"{user}\" \"\"\n"))?;
        let ini = dir.path().join("pgbouncer.ini");
        // PgBouncer refuses to run as root; `-u` drops to an ordinary user, who must read the
        // files.
        let root = is_root();
        if root {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        }
        // A port found free can be taken before PgBouncer binds it: then it exits, and another
        // port is tried.
        let log_path = dir.path().join("pgbouncer.log");
        let mut attempts = 0;
        loop {
            attempts += 1;
            let port = free_port()?;
            std::fs::write(
                &ini,
                format!(
                    "[databases]\ntest = host={host} port={server_port} dbname={database}\n{databases}\n\
                     [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                     auth_type = trust\nauth_file = {}\nauth_user = {user}\nadmin_users = {user}\n\
                     max_client_conn = 1000\n{settings}\n",
                    auth.display()
                ),
            )?;
            let mut command = Command::new(&program);
            if root {
                use std::os::unix::fs::PermissionsExt;
                for path in [&ini, &auth] {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
                }
                command.arg("-u").arg("postgres");
            }
            let log = std::fs::File::create(&log_path)?;
            let mut child = command
                .arg(&ini)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", program.display()))?;
            match wait_listening(&mut child, port, &log_path, Duration::from_secs(10)) {
                Ok(()) => {
                    return Ok(Self {
                        child,
                        port,
                        user,
                        dir,
                    });
                }
                Err(error) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let lost_race = std::fs::read_to_string(&log_path)
                        .is_ok_and(|log| log.contains("Address already in use"));
                    if !lost_race || attempts >= 3 {
                        return Err(error);
                    }
                    eprintln!("{error}; trying another port");
                }
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `database` through this PgBouncer as the test server's user, `query` appended.
    pub fn url(&self, database: &str, query: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{database}{query}",
            self.user, self.port
        )
    }
}

/// Whether this process runs as root (PgBouncer and PostgreSQL's programs refuse to).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|line| line.starts_with("Uid:"))
            .is_some_and(|line| line.split_whitespace().nth(1) == Some("0"))
    })
}

/// Waits until `child` (PgBouncer) accepts connections on `port`, at most `limit`.
fn wait_listening(child: &mut Child, port: u16, log: &Path, limit: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let log = || std::fs::read_to_string(log).unwrap_or_default();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("pgbouncer exited ({status}) before listening:\n{}", log());
        }
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!(
                "pgbouncer did not listen on {address} within {limit:?}:\n{}",
                log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The PgBouncer (transaction mode, docs/storage.md's settings) a test goes through.
pub enum Pooler {
    /// `SKILLSTATE_TEST_PGBOUNCER_URL`: started by `scripts/test` for the whole run.
    Shared(String),
    /// One of this test's own, stopped with it.
    Own(Bouncer),
}

impl Pooler {
    /// The shared PgBouncer, else a new one of the test's own in front of `server_url`; `None`
    /// when `SKILLSTATE_TEST_PGBOUNCER_URL` is `off` (the caller records the skip). Either way
    /// its settings are checked first.
    pub async fn get(server_url: &str) -> anyhow::Result<Option<Self>> {
        let pooler = match std::env::var(POOLER_ENV) {
            Ok(url) if url == "off" => return Ok(None),
            Ok(url) if !url.is_empty() => Self::Shared(url),
            _ => Self::Own(Bouncer::start(server_url, "", TRANSACTION_MODE)?),
        };
        pooler.check_transaction_mode().await?;
        Ok(Some(pooler))
    }

    /// Whether the suite goes through a transaction pooler at all (`off` turns it off).
    pub fn enabled() -> bool {
        std::env::var(POOLER_ENV).map_or(true, |url| url != "off")
    }

    /// The pooler's URL: `postgres://user@host:port/database`.
    fn base(&self) -> String {
        match self {
            Self::Shared(url) => url.clone(),
            Self::Own(bouncer) => bouncer.url("test", ""),
        }
    }

    /// The pooler's database (the test server's) as `user`, `query` appended (`?…`).
    pub fn url_as(&self, user: &str, query: &str) -> anyhow::Result<String> {
        let (_, host, database) = split_url(&self.base())?;
        Ok(format!("postgres://{user}@{host}/{database}{query}"))
    }

    /// PgBouncer's admin console must show transaction mode and the reset settings
    /// docs/storage.md gives, or the third backend would not test what it claims to.
    async fn check_transaction_mode(&self) -> anyhow::Result<()> {
        let (user, host, _) = split_url(&self.base())?;
        let admin = format!("postgres://{user}@{host}/pgbouncer");
        // The admin console takes the simple query protocol only and no startup parameter
        // besides the usual ones.
        let options: sqlx::postgres::PgConnectOptions = admin.parse()?;
        let options = options.extra_float_digits(None).statement_cache_capacity(0);
        let mut conn = tokio::time::timeout(WAIT, sqlx::PgConnection::connect_with(&options))
            .await
            .with_context(|| format!("the PgBouncer admin console at {admin} did not answer within {WAIT:?}"))?
            .with_context(|| {
                format!(
                    "cannot reach the PgBouncer admin console at {admin}: is {POOLER_ENV} a PgBouncer whose `admin_users` names {user}? ({ENABLE})"
                )
            })?;
        let rows = tokio::time::timeout(
            WAIT,
            sqlx::raw_sql(AssertSqlSafe("SHOW CONFIG")).fetch_all(&mut conn),
        )
        .await
        .with_context(|| format!("SHOW CONFIG on the PgBouncer admin console took over {WAIT:?}"))?
        .context("SHOW CONFIG on the PgBouncer admin console")?;
        let _ = conn.close().await;
        use sqlx::Row;
        let setting = |key: &str| {
            rows.iter()
                .find(|row| row.try_get::<String, _>(0).ok().as_deref() == Some(key))
                .and_then(|row| row.try_get::<String, _>(1).ok())
                .unwrap_or_default()
        };
        for (key, wanted) in [
            ("pool_mode", "transaction"),
            ("server_reset_query", "DEALLOCATE ALL"),
            ("server_reset_query_always", "1"),
        ] {
            let found = setting(key);
            if found != wanted {
                bail!(
                    "the PgBouncer at {admin} has `{key} = {found}`; the transaction-pooler tests need `{key} = {wanted}` (docs/storage.md)"
                );
            }
        }
        Ok(())
    }
}

/// A pooler URL's user (with its password, if any), `host:port` and database.
fn split_url(url: &str) -> anyhow::Result<(String, String, String)> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .with_context(|| format!("{POOLER_ENV} `{url}` is not a postgres:// URL"))?;
    let rest = rest.split('?').next().unwrap_or(rest);
    let (authority, database) = rest
        .split_once('/')
        .with_context(|| format!("{POOLER_ENV} `{url}` names no database"))?;
    let (user, host) = authority.split_once('@').unwrap_or(("postgres", authority));
    Ok((user.to_owned(), host.to_owned(), database.to_owned()))
}

/// A login role and a schema of the same name on the test server, the role's `search_path`
/// set to the schema: every server connection PgBouncer lends that role works in it.
pub struct RoleSchema {
    server_url: String,
    pub name: String,
}

impl RoleSchema {
    /// A new role and schema named `<prefix>_<pid>_<n>_<time>`, created through a direct
    /// connection as the test server's user.
    pub async fn create(server_url: &str, prefix: &str) -> anyhow::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let name = format!(
            "{prefix}_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let role = Self {
            server_url: server_url.to_owned(),
            name,
        };
        let created = role
            .run(&format!(
                "CREATE ROLE {0} LOGIN; CREATE SCHEMA {0} AUTHORIZATION {0}; \
                 ALTER ROLE {0} SET search_path = {0}",
                role.name
            ))
            .await;
        if let Err(error) = created {
            let _ = role.drop_now().await;
            return Err(error.context(format!(
                "creating the role and schema {} on PostgreSQL at {server_url}",
                role.name
            )));
        }
        Ok(role)
    }

    /// The schema on the test server directly (as its user, the schema as `search_path`).
    pub fn direct_url(&self) -> String {
        let separator = if self.server_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!(
            "{}{separator}options=-c%20search_path%3D{}",
            self.server_url, self.name
        )
    }

    /// Drops the schema with everything in it and the role, after ending the role's sessions
    /// (PgBouncer's idle server connections would outlive the role otherwise).
    pub async fn drop_now(&self) -> anyhow::Result<()> {
        self.run(&format!(
            "ALTER ROLE {0} NOLOGIN; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'; \
             DROP SCHEMA IF EXISTS {0} CASCADE; DROP ROLE IF EXISTS {0}",
            self.name
        ))
        .await
        .with_context(|| format!("dropping the role and schema {}", self.name))
    }

    async fn run(&self, sql: &str) -> anyhow::Result<()> {
        let mut conn = tokio::time::timeout(WAIT, sqlx::PgConnection::connect(&self.server_url))
            .await
            .with_context(|| {
                format!(
                    "PostgreSQL at {} did not answer within {WAIT:?}",
                    self.server_url
                )
            })?
            .with_context(|| {
                format!(
                    "cannot reach PostgreSQL at {}; start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, point SKILLSTATE_TEST_POSTGRES_URL elsewhere, or set it to `off`",
                    self.server_url
                )
            })?;
        tokio::time::timeout(
            WAIT,
            sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(&mut conn),
        )
        .await
        .with_context(|| format!("`{sql}` took over {WAIT:?}"))??;
        conn.close().await?;
        Ok(())
    }
}
