//! Shared set-up for the service tests: a real store (a SQLite file, or a PostgreSQL schema of
//! its own), a task factory over the shipped skills and the real warehouse environment, API
//! keys, and one way to send requests either through the router in-process (tower `oneshot`)
//! or over a real socket on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used)]

#[path = "../../../../test-support/skip.rs"]
pub mod skip;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use serde_json::Value;
use skillstate_core::Skill;
use skillstate_core::skill::EnvironmentSettings;
use skillstate_envs::oracle::OracleModel;
use skillstate_providers::ModelProvider;
use skillstate_runtime::{NoProgress, Runner, TaskOptions, prepare_task, presented_tools};
use skillstate_server::{
    ApiError, AppState, FieldError, ResolvedRequest, ResolvedSkill, ServerConfig, TaskFactory,
    UpgradeTarget, check_initial_state, hash_secret, new_key_secret, skill_dir,
};
use skillstate_store::{
    NewKey, NewTask, PostgresStore, SqliteStore, Store, Synchronous, TaskRecord,
};
use skillstate_tools::Environment;
use sqlx::{AssertSqlSafe, Connection};
use tower::ServiceExt;

pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

pub fn skills_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills")
}

/// Builds tasks from the shipped skills the way a server does: the skill from the skills
/// directory, its built-in environment (with the request's overrides), the `oracle` model.
pub struct EnvFactory {
    pub skills_dir: PathBuf,
}

fn invalid(pointer: &str, message: String) -> ApiError {
    ApiError::invalid(
        message.clone(),
        vec![FieldError::new("field", pointer, message)],
    )
}

#[async_trait]
impl TaskFactory for EnvFactory {
    async fn prepare(&self, request: &ResolvedRequest) -> Result<(NewTask, Value), ApiError> {
        let dir = skill_dir(&self.skills_dir, &request.skill)?;
        let skill = Skill::load(&dir)
            .map_err(|errors| ApiError::Internal(errors.to_string()))?
            .skill;
        if request.model != "oracle" {
            return Err(invalid(
                "/model",
                format!(
                    "model `{}` is not offered here; use `oracle`",
                    request.model
                ),
            ));
        }
        let Some(mut settings) = skill.settings().environment.clone() else {
            return Err(invalid(
                "/skill",
                format!("skill `{}` has no built-in environment", request.skill),
            ));
        };
        if request.input.is_some() {
            return Err(invalid(
                "/input",
                "this skill's environment supplies its own observations; drop `input`".into(),
            ));
        }
        for (key, value) in &request.environment {
            settings.params.insert(key.clone(), value.clone());
        }
        let mut env = skillstate_envs::build_environment(&settings)
            .map_err(|error| invalid("/environment", error.to_string()))?;
        let initial = match &request.state {
            Some(state) => {
                check_initial_state(&skill, state)?;
                state.clone()
            }
            None => skill.definition.initial_state.clone(),
        };
        let mut options = TaskOptions::new(&request.model, request.context.strategy());
        options.context_budget = request.budget.map(|b| b as usize);
        options.environment = Some(serde_json::to_value(&settings).unwrap());
        let task = prepare_task(&skill, env.as_mut(), &options)?;
        Ok((task, initial))
    }

    async fn fork_world(
        &self,
        task: &TaskRecord,
    ) -> Result<Option<Box<dyn Environment>>, ApiError> {
        Ok(world_of(task))
    }

    async fn upgrade_target(
        &self,
        task: &TaskRecord,
        skill: &ResolvedSkill,
    ) -> Result<UpgradeTarget, ApiError> {
        let dir = match &skill.dir {
            Some(dir) => dir.clone(),
            None => skill_dir(&self.skills_dir, &skill.name)?,
        };
        let loaded = Skill::load(&dir)
            .map_err(|errors| invalid("/skill", errors.to_string()))?
            .skill;
        let probe = TaskRecord {
            skill: loaded.definition.clone(),
            ..task.clone()
        };
        let env = world_of(&probe)
            .ok_or_else(|| invalid("/skill", "the task has no built-in environment".into()))?;
        let tools = presented_tools(&loaded, env.as_ref())
            .map_err(|error| invalid("/skill", error.to_string()))?;
        Ok(UpgradeTarget {
            skill: loaded,
            tools,
        })
    }
}

/// Writes the shipped warehouse skill into `skills/warehouse` at `version` (skill.toml), its
/// shelves kept under `field`, with `migration` (named by the version it starts from) when
/// given: a skills directory as an operator deploys one version after another.
pub fn deploy_warehouse(
    skills: &Path,
    version: &str,
    field: &str,
    migration: Option<(&str, Value)>,
) {
    let source = skills_dir().join("warehouse");
    let dir = skills.join("warehouse");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("migrations")).unwrap();
    std::fs::copy(source.join("SKILL.md"), dir.join("SKILL.md")).unwrap();
    let toml = std::fs::read_to_string(source.join("skill.toml")).unwrap();
    std::fs::write(
        dir.join("skill.toml"),
        format!("version = \"{version}\"\n{toml}"),
    )
    .unwrap();
    let rename = |text: String| text.replace("\"inventory\"", &format!("\"{field}\""));
    for file in ["state.schema.json", "state.init.json"] {
        let text = std::fs::read_to_string(source.join(file)).unwrap();
        std::fs::write(dir.join(file), rename(text)).unwrap();
    }
    if let Some((from, patch)) = migration {
        std::fs::write(
            dir.join("migrations").join(format!("{from}.json")),
            patch.to_string(),
        )
        .unwrap();
    }
}

/// A fresh instance of a stored task's built-in environment.
pub fn world_of(task: &TaskRecord) -> Option<Box<dyn Environment>> {
    let settings: EnvironmentSettings = serde_json::from_value(task.environment.clone()?).ok()?;
    skillstate_envs::build_environment(&settings).ok()
}

/// Runs a stored task to its end in-process with the oracle, as a worker would.
pub async fn run_to_end(store: Arc<dyn Store>, task_id: &str) {
    let model = Arc::new(OracleModel::for_environment("warehouse").unwrap());
    run_with(store, task_id, model).await;
}

/// Runs a stored task to its end in-process with `model`.
pub async fn run_with(store: Arc<dyn Store>, task_id: &str, model: Arc<dyn ModelProvider>) {
    let task = store.task(task_id).await.unwrap();
    let mut env = world_of(&task).expect("a built-in environment");
    let mut observer = NoProgress;
    Runner::new(store, model, env.as_mut(), &mut observer)
        .run(task_id)
        .await
        .unwrap();
}

/// Where a test's store lives.
pub enum Backend {
    Sqlite,
    Postgres,
}

/// One empty store for one test, removed at the end.
pub struct Db {
    pub store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    postgres: Option<(String, String)>,
}

pub fn postgres_url() -> Option<String> {
    match std::env::var("SKILLSTATE_TEST_POSTGRES_URL") {
        Ok(url) if url == "off" => None,
        Ok(url) if !url.is_empty() => Some(url),
        _ => Some(DEFAULT_POSTGRES_URL.to_owned()),
    }
}

impl Db {
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skillstate.db");
        let store = SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
            .await
            .unwrap();
        Self {
            store: Arc::new(store),
            _dir: Some(dir),
            postgres: None,
        }
    }

    /// A PostgreSQL schema of its own; `None` (recorded as a visible skip) when the tests
    /// are told not to use PostgreSQL. An unreachable server is a failure.
    pub async fn postgres() -> anyhow::Result<Option<Self>> {
        let Some(url) = postgres_url() else {
            skip::skip_test(
                "SKILLSTATE_TEST_POSTGRES_URL=off",
                "unset it to use postgres://postgres@127.0.0.1:5432/test, or point it at a PostgreSQL server",
            );
            return Ok(None);
        };
        let connection = sqlx::PgConnection::connect(&url).await.with_context(|| {
            format!(
                "cannot reach PostgreSQL at {url}; start it, point SKILLSTATE_TEST_POSTGRES_URL elsewhere, or set it to `off`"
            )
        })?;
        connection.close().await?;
        let schema = format!("server_{}", uuid::Uuid::now_v7().simple());
        let store = PostgresStore::open_in_schema(&url, &schema).await?;
        Ok(Some(Self {
            store: Arc::new(store),
            _dir: None,
            postgres: Some((url, schema)),
        }))
    }

    /// A second, independent handle on the same database, as a restarted server opens it.
    pub async fn reopen(&self) -> Arc<dyn Store> {
        if let Some((url, schema)) = &self.postgres {
            return Arc::new(PostgresStore::open_in_schema(url, schema).await.unwrap());
        }
        let path = self._dir.as_ref().unwrap().path().join("skillstate.db");
        Arc::new(
            SqliteStore::open(path.to_str().unwrap(), Synchronous::Full)
                .await
                .unwrap(),
        )
    }

    /// A connection of its own to this PostgreSQL database, in the store's schema; `None` on
    /// SQLite.
    pub async fn pg_connection(&self) -> Option<sqlx::PgConnection> {
        let (url, schema) = self.postgres.as_ref()?;
        let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(url)
            .unwrap()
            .options([("search_path", schema.as_str())]);
        Some(sqlx::PgConnection::connect_with(&options).await.unwrap())
    }

    pub async fn destroy(self) {
        if let Some((url, schema)) = &self.postgres {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
}

/// The service over one store, with its keys.
pub struct Harness {
    pub db: Db,
    pub state: AppState,
}

impl Harness {
    pub async fn new(db: Db) -> Self {
        Self::with_config(db, ServerConfig::default())
    }

    pub fn with_config(db: Db, config: ServerConfig) -> Self {
        let factory = Arc::new(EnvFactory {
            skills_dir: skills_dir(),
        });
        let state = AppState::with_config(db.store.clone(), factory, config);
        Self { db, state }
    }

    /// The service with another task factory.
    pub fn with_factory(db: Db, factory: Arc<dyn TaskFactory>) -> Self {
        let state = AppState::with_config(db.store.clone(), factory, ServerConfig::default());
        Self { db, state }
    }

    pub fn store(&self) -> Arc<dyn Store> {
        self.db.store.clone()
    }

    pub fn router(&self) -> Router {
        skillstate_server::router(self.state.clone())
    }

    /// A new key of `tenant`: its secret and its id.
    pub async fn key(&self, tenant: &str) -> (String, String) {
        let secret = new_key_secret();
        let record = self
            .store()
            .create_key(&NewKey {
                tenant: tenant.into(),
                label: format!("test key of {tenant}"),
                secret_hash: hash_secret(&secret),
                scopes: None,
            })
            .await
            .unwrap();
        (secret, record.id)
    }
}

/// An answer, whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "not JSON ({error}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts the status; shows the body when it differs.
    pub fn expect(&self, status: u16) -> &Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        self
    }

    /// Asserts a problem+json of `status` and returns it.
    pub fn problem(&self, status: u16) -> Value {
        self.expect(status);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{status}: {}",
            String::from_utf8_lossy(&self.body)
        );
        let problem = self.json();
        assert_eq!(problem["status"], status);
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .starts_with("urn:skillstate:problem:")
        );
        assert!(problem["title"].is_string() && problem["detail"].is_string());
        assert!(problem["instance"].as_str().unwrap().starts_with('/'));
        problem
    }
}

/// Creates a warehouse task the oracle runs (seed 5, `events` events) through `api` with
/// `key`; its id.
pub async fn create_oracle_task(api: &dyn Transport, key: &str, events: u64) -> String {
    let created = api
        .send(
            Call::post(
                "/v1/tasks",
                &serde_json::json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 5, "events": events}}),
            )
            .key(key),
        )
        .await;
    created.expect(201).json()["task"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A request, before it is sent.
pub struct Call {
    pub method: Method,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

impl Call {
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn get(path: impl Into<String>) -> Self {
        Self::new(Method::GET, path)
    }

    pub fn post(path: impl Into<String>, body: &Value) -> Self {
        Self::new(Method::POST, path).json(body)
    }

    pub fn delete(path: impl Into<String>) -> Self {
        Self::new(Method::DELETE, path)
    }

    pub fn key(self, secret: &str) -> Self {
        self.header("authorization", &format!("Bearer {secret}"))
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn json(self, body: &Value) -> Self {
        self.raw("application/json", serde_json::to_vec(body).unwrap())
    }

    pub fn raw(mut self, content_type: &str, body: Vec<u8>) -> Self {
        self.headers
            .push(("content-type".into(), content_type.into()));
        self.body = Some(body);
        self
    }
}

/// How requests reach the service.
#[async_trait]
pub trait Transport: Send + Sync {
    async fn send(&self, call: Call) -> Reply;
}

/// Through the router, in-process.
pub struct InProcess(pub Router);

#[async_trait]
impl Transport for InProcess {
    async fn send(&self, call: Call) -> Reply {
        let mut request = Request::builder().method(call.method).uri(&call.path);
        for (name, value) in &call.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(call.body.map(Body::from).unwrap_or_else(Body::empty))
            .unwrap();
        let response = self.0.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }
}

/// A real server on 127.0.0.1, driven by an HTTP client.
pub struct Socket {
    pub base: String,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Socket {
    pub async fn start(state: AppState) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(skillstate_server::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Self {
            base,
            client,
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Signals the shutdown and waits (bounded) for the server to return.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(20), server)
                .await
                .expect("the server stops within its grace period")
                .unwrap()
                .unwrap();
        }
    }
}

#[async_trait]
impl Transport for Socket {
    async fn send(&self, call: Call) -> Reply {
        let mut request = self
            .client
            .request(call.method, format!("{}{}", self.base, call.path));
        for (name, value) in &call.headers {
            request = request.header(name, value);
        }
        if let Some(body) = call.body {
            request = request.body(body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap().to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }
}
