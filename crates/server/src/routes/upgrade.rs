//! Moving tasks to the version of their skill the server holds now (docs/skill-versions.md, "Skill versions
//! and upgrades"): one task (`POST /v1/tasks/{id}:upgrade`) or every task of the tenant on a
//! skill, a page at a time (`POST /v1/tasks:upgrade`). Dry run unless `apply`; each task's
//! outcome is its own, so one refusal never blocks the others.
//!
//! The target is built by the factory from the skill the server's policy resolves (the skills
//! directory as it is now) with the tools the task's world presents; the upgrade itself is the
//! runtime's (`skillstate_runtime::upgrade`): a step of the task's journal authored by the API
//! key, committed only while no runner holds the task, scheduled when an action waits for a
//! human. What a response shows of the state is redacted there (`Shown`): write-only values of
//! either version never appear in a diff or a refusal.

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skillstate_runtime::upgrade::{Upgrade, UpgradeError, Upgraded, upgrade_task, version_name};
use skillstate_store::{TaskQuery, TaskRecord};
use utoipa::ToSchema;

use super::owned_task;
use crate::auth::Caller;
use crate::context::AppState;
use crate::context::is_task_id;
use crate::json::optional_json;
use crate::problem::{ApiError, FieldError, Problem};
use crate::views::SkillVersionView;

/// Most tasks one `POST /v1/tasks:upgrade` moves; the rest come with `cursor`.
pub const MAX_UPGRADE_PAGE: u32 = 100;
const DEFAULT_UPGRADE_PAGE: u32 = 20;

/// An upgrade of one task.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpgradeRequest {
    /// The skill to move to: a directory of the server's skills directory (default: the one
    /// named like the task's skill). It must be a version of the task's skill.
    #[serde(default)]
    pub skill: Option<String>,
    /// Commit the upgrade; without it nothing is written and the answer is what it would do.
    #[serde(default)]
    pub apply: bool,
}

/// What an upgrade did, or would do.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UpgradeView {
    pub task: String,
    /// `moved` (committed), `scheduled` (stored, committed once the task's waiting action is
    /// settled), `planned` (a dry run: nothing written; `scheduled` then says whether applying
    /// it would wait for the action).
    #[schema(example = "moved")]
    pub outcome: String,
    pub from: SkillVersionView,
    pub to: SkillVersionView,
    /// The migrations run, by the version each starts from, oldest first.
    pub migrations: Vec<String>,
    /// RFC 6902 operations from the state before to the state after (empty: the state is
    /// kept as it is); write-only values of either version read `"[redacted]"`.
    #[schema(value_type = Vec<Object>)]
    pub diff: Value,
    /// The step of the journal that records the upgrade (or will).
    pub step: u64,
    pub applied: bool,
    pub scheduled: bool,
}

impl UpgradeView {
    /// `done`, asked for with `apply` or as a dry run.
    fn of(done: Upgraded, apply: bool) -> Self {
        // Scheduled with `apply`: stored, committed by whoever settles the action; a dry run
        // of a waiting task is `planned` with `scheduled` saying applying it would wait.
        let outcome = match (done.applied, done.scheduled && apply) {
            (true, _) => "moved",
            (false, true) => "scheduled",
            (false, false) => "planned",
        };
        let (applied, outcome) = (done.applied, outcome.to_owned());
        Self {
            task: done.task,
            outcome,
            from: SkillVersionView::of(done.from),
            to: SkillVersionView::of(done.to),
            migrations: done.migrations,
            diff: done.diff,
            step: done.step,
            applied,
            scheduled: done.scheduled,
        }
    }
}

/// `POST /v1/tasks/{id}:<method>`: the custom methods of a task (`:upgrade`). The router
/// cannot match a parameter followed by a suffix, so `{id}` holds both, split here.
pub async fn task_method(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let id = match super::upgrade_target_id(&id, "task", "GET, DELETE") {
        Ok(id) => id,
        Err(response) => return Ok(*response),
    };
    let body: UpgradeRequest = optional_json(request, &state).await?;
    upgrade_one(&state, &caller, id, body)
        .await
        .map(|view| axum::Json(view).into_response())
}

/// Moves a task to the version of its skill the server holds now.
///
/// The version is the skill directory's on the server as it is at the request (`skill`, or the
/// one named like the task's skill). If the new state schema accepts the task's state, the
/// upgrade needs nothing else; otherwise the new version's `migrations/` take the state there,
/// and the migrated state passes every check of a state write (schema, budget, read-only
/// locations), or the upgrade is refused with each error's pointer and nothing changes.
///
/// Dry run unless `apply`. Applied, the upgrade is a step of the task's journal authored by
/// this API key. A task a runner is driving is refused (409, retry once it stops or pauses); a
/// task waiting for an approval or a reply is scheduled: committed by whoever settles the
/// action, so the action finishes under the version that proposed it.
#[utoipa::path(
    post,
    path = "/v1/tasks/{id}:upgrade",
    operation_id = "upgradeTask",
    summary = "Move a task to the server's version of its skill",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = UpgradeRequest, content_type = "application/json", description = "Optional: no body is a dry run to the skill named like the task's"),
    responses(
        (status = 200, description = "What the upgrade did (`moved`, `scheduled`) or would do (`planned`)", body = UpgradeView),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such task for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The task runs that version already, a runner is driving it, or its action is in flight", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No such skill, another skill, or the migrated state refused (each error with its pointer into the migrated state)", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Building the new version took too long", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub(crate) async fn upgrade_one(
    state: &AppState,
    caller: &Caller,
    id: &str,
    request: UpgradeRequest,
) -> Result<UpgradeView, ApiError> {
    let task = owned_task(state, caller, id).await?;
    let name = request.skill.as_deref().unwrap_or(&task.skill.name);
    let skill = state.policy.resolve_skill(name, "/skill")?;
    upgrade_owned(state, caller, &task, &skill, request.apply)
        .await
        .map(|done| UpgradeView::of(done, request.apply))
        .map_err(ApiError::from)
}

/// Why one task was not upgraded: the new version could not be built for it, or the upgrade
/// was refused.
enum Failed {
    Target(ApiError),
    Upgrade(UpgradeError),
}

impl From<Failed> for ApiError {
    fn from(failed: Failed) -> Self {
        match failed {
            Failed::Target(error) => error,
            Failed::Upgrade(error) => upgrade_error(error),
        }
    }
}

/// The upgrade of a task the caller owns to `skill`.
async fn upgrade_owned(
    state: &AppState,
    caller: &Caller,
    task: &TaskRecord,
    skill: &crate::policy::ResolvedSkill,
    apply: bool,
) -> Result<Upgraded, Failed> {
    // Loading a skill and rebuilding a world may compute at length: off the async workers,
    // under the work deadline (nothing is written until it is back).
    let target = {
        let (factory, task, skill) = (state.factory.clone(), task.clone(), skill.clone());
        state
            .offload
            .run("building the new version of the skill", async move {
                factory.upgrade_target(&task, &skill).await
            })
            .await
            .and_then(|built| built)
            .map_err(Failed::Target)?
    };
    let upgrade = Upgrade {
        task: &task.id,
        to: &target.skill,
        tools: &target.tools,
        author: &caller.key_id,
        apply,
    };
    upgrade_task(&state.store, &upgrade)
        .await
        .map_err(Failed::Upgrade)
}

/// The problem for each way an upgrade fails.
fn upgrade_error(error: UpgradeError) -> ApiError {
    match error {
        UpgradeError::Store(error) => error.into(),
        UpgradeError::Unchanged { version, .. } => ApiError::conflict(format!(
            "the task already runs {version}; there is nothing to upgrade"
        )),
        UpgradeError::OtherSkill { runs, target, .. } => ApiError::invalid(
            format!("the task runs skill `{runs}`, not `{target}`"),
            vec![FieldError::new(
                "field",
                "/skill",
                format!("name a version of `{runs}`, the task's skill"),
            )],
        ),
        UpgradeError::Refused { to, rejections, .. } => ApiError::invalid(
            format!("the migrated state does not fit {to}; nothing changed"),
            rejections
                .iter()
                .map(|r| {
                    let mut error = FieldError::from_rejection(r, "");
                    error.message = format!("{} (pointer into the migrated state)", r.message);
                    error
                })
                .collect(),
        ),
        UpgradeError::Busy { .. } => ApiError::Conflict {
            detail: "a runner is driving the task right now; it is upgraded between runs: try again once it stops or pauses".into(),
            retry_after: Some(1),
        },
        UpgradeError::Pending { step, what, .. } => ApiError::conflict(format!(
            "the task's action at step {step} is {what}; settle it first (approve, reject or reply), then upgrade"
        )),
        UpgradeError::Stale { actual, .. } => ApiError::Conflict {
            detail: format!(
                "the task moved on to version {actual} while the upgrade was planned; send it again"
            ),
            retry_after: Some(0),
        },
    }
}

/// Which tasks to upgrade, a page at a time.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpgradeTasksRequest {
    /// The skill to move to: a directory of the server's skills directory. Every task of the
    /// tenant on another version of it is a candidate.
    #[schema(example = "warehouse")]
    pub skill: String,
    /// Only tasks on this version: skill.toml's `version`, or a content hash (a prefix of at
    /// least 6 hexadecimal digits).
    #[serde(default)]
    #[schema(example = "1.2.0")]
    pub from: Option<String>,
    /// Only the tasks of this batch.
    #[serde(default)]
    pub batch: Option<String>,
    /// Commit each upgrade; without it nothing is written.
    #[serde(default)]
    pub apply: bool,
    /// Most tasks looked at in this request (default 20).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// One task's outcome in a many-task upgrade.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UpgradeOutcome {
    pub task: String,
    /// `moved`, `scheduled`, `planned`, `refused`, or `skipped` (already on the version, or
    /// on a version other than `from`).
    #[schema(example = "moved")]
    pub outcome: String,
    /// What the upgrade did or would do (`moved`, `scheduled`, `planned`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeView>,
    /// Why it was refused or skipped, as the single-task route would answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// A page of a many-task upgrade.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UpgradePage {
    /// The version moved to (`null` when no task of the page got that far).
    pub to: Option<SkillVersionView>,
    /// Each task looked at, in listing order (newest first).
    pub results: Vec<UpgradeOutcome>,
    pub moved: u64,
    pub scheduled: u64,
    pub planned: u64,
    pub refused: u64,
    pub skipped: u64,
    /// Send it back as `cursor` for the next page; `null` after the last.
    pub next_cursor: Option<String>,
}

/// Moves every task of the tenant on another version of a skill to the server's version,
/// a page at a time.
///
/// Each task is upgraded as `POST /v1/tasks/{id}:upgrade` would (dry run unless `apply`), and
/// its outcome is its own: a refusal (with the problem the single route would answer) never
/// blocks the others. Pass `next_cursor` back as `cursor` until it is `null`.
#[utoipa::path(
    post,
    path = "/v1/tasks:upgrade",
    operation_id = "upgradeTasks",
    summary = "Move the tenant's tasks on a skill to the server's version of it",
    tag = "tasks",
    request_body(content = UpgradeTasksRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Each task's outcome", body = UpgradePage),
        (status = 400, description = "Malformed JSON, or a bad cursor, batch or limit", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing, unknown or revoked API key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "This server cannot build versions of skills", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not a JSON body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No such skill on the server, or `from` is not a version", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Internal error", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Building the new version took too long", body = Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = []))
)]
pub async fn upgrade_tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    crate::json::ApiJson(request): crate::json::ApiJson<UpgradeTasksRequest>,
) -> Result<axum::Json<UpgradePage>, ApiError> {
    let limit = request.limit.unwrap_or(DEFAULT_UPGRADE_PAGE);
    if !(1..=MAX_UPGRADE_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range; give 1 to {MAX_UPGRADE_PAGE}"
        )));
    }
    for (field, value, what) in [
        (
            "cursor",
            &request.cursor,
            "pass back `next_cursor` unchanged",
        ),
        ("batch", &request.batch, "take one from GET /v1/batches"),
    ] {
        if let Some(value) = value
            && !is_task_id(value)
        {
            return Err(ApiError::bad_request(format!(
                "{field} `{value}` is not one this server gave; {what}"
            )));
        }
    }
    if let Some(from) = &request.from
        && !crate::factory::is_version_pin(from)
    {
        return Err(ApiError::invalid(
            format!("`{from}` is not a version"),
            vec![FieldError::new(
                "field",
                "/from",
                "give skill.toml's version (1.2.0) or a content hash of at least 6 hexadecimal digits, as `skillstate skills` lists them",
            )],
        ));
    }
    let skill = state.policy.resolve_skill(&request.skill, "/skill")?;
    let page = state
        .store
        .list_tasks_page(&TaskQuery {
            tenant: caller.tenant_filter(),
            status: None,
            skill: Some(skill.name.clone()),
            label: None,
            batch: request.batch.clone(),
            after: request.cursor.clone(),
            limit: limit + 1,
        })
        .await?;
    let more = page.len() > limit as usize;
    let page = &page[..page.len().min(limit as usize)];
    let next_cursor = if more {
        page.last().map(|t| t.id.clone())
    } else {
        None
    };
    let mut results = Vec::new();
    let mut to = None;
    for summary in page {
        let task = match owned_task(&state, &caller, &summary.id).await {
            Ok(task) => task,
            // Deleted since it was listed.
            Err(ApiError::NotFound { .. }) => continue,
            Err(other) => return Err(other),
        };
        let skipped = |why: String| UpgradeOutcome {
            task: task.id.clone(),
            outcome: "skipped".into(),
            upgrade: None,
            problem: Some(ApiError::conflict(why).problem()),
        };
        let runs = version_name(&task.skill, &task.tools);
        if let Some(from) = &request.from
            && !crate::factory::pin_names(from, &runs)
        {
            results.push(skipped(format!("the task runs {runs}, not {from}")));
            continue;
        }
        let outcome = match upgrade_owned(&state, &caller, &task, &skill, request.apply).await {
            Ok(done) => {
                to.get_or_insert_with(|| SkillVersionView::of(done.to.clone()));
                let view = UpgradeView::of(done, request.apply);
                UpgradeOutcome {
                    task: task.id.clone(),
                    outcome: view.outcome.clone(),
                    upgrade: Some(view),
                    problem: None,
                }
            }
            Err(Failed::Upgrade(UpgradeError::Unchanged { version, .. })) => {
                skipped(format!("the task already runs {version}"))
            }
            Err(failed) => UpgradeOutcome {
                task: task.id.clone(),
                outcome: "refused".into(),
                upgrade: None,
                problem: Some(ApiError::from(failed).problem()),
            },
        };
        results.push(outcome);
    }
    let count = |what: &str| results.iter().filter(|r| r.outcome == what).count() as u64;
    Ok(axum::Json(UpgradePage {
        to,
        moved: count("moved"),
        scheduled: count("scheduled"),
        planned: count("planned"),
        refused: count("refused"),
        skipped: count("skipped"),
        results,
        next_cursor,
    }))
}
