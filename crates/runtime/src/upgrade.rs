//! Moving a task to another version of its skill (`skillstate upgrade`).
//!
//! An upgrade is a step of the task's journal, authored by whoever asked for it (the operator,
//! an API key): its patch takes the state to the migrated one (core's `plan_upgrade`: the
//! migrations that apply, then the new version's schema, read-only rule and budget), and the
//! step records the version the task runs from then on (`StepCommit::upgrade`, stored once in
//! `skill_versions`). So replay and hash checks cover it, and a prompt of any step rebuilds
//! with the version it was rendered from (`frame.rs::rebuild_prompt`).
//!
//! It commits as a state write does: only while nobody holds the task's execution lease,
//! checked in the step's own transaction (`Leases::commit_unleased_step`), so it never lands
//! inside a runner's work; a task a runner is driving is refused (`Busy`), as is one whose
//! last action is in flight after a crash (`Pending`), and a task that moved on since it was
//! read (`Stale`). A task whose action waits for a human (approval, a reply) is upgraded
//! between steps: the upgrade is scheduled (`Tasks::schedule_upgrade`, checked now against the
//! state, which cannot change while the task waits) and the runner that settles the action
//! commits it under its lease before the next model call (`Runner::upgrade_scheduled`), so the
//! action finishes under the version that proposed it. The observation the task's next step
//! would have read carries over to the step after the upgrade, with a note that the skill
//! changed.
//!
//! Without `apply` nothing is written: the answer is the plan (the migrated state's diff) or
//! the refusal, exactly as applying would give it then.

use std::sync::Arc;

use serde_json::{Value, json};
use skillstate_core::upgrade::{UpgradePlan, plan_upgrade};
use skillstate_core::write_only::{SecretValues, WriteOnly};
use skillstate_core::{Rejection, Skill, ToolSpec};
use skillstate_store::{SkillChange, StepCommit, Store, StoreError, TaskRecord, TaskStatus};

use crate::state_write::{AuthoredStep, authored_step, pending_action};

/// One upgrade: `task` to `to` (its skill compiled, and the tools as its tasks present them).
pub struct Upgrade<'a> {
    pub task: &'a str,
    pub to: &'a Skill,
    pub tools: &'a [ToolSpec],
    /// Who asks, recorded as the step's author (`operator`, an API key id).
    pub author: &'a str,
    /// Commit it; otherwise only say what it would do.
    pub apply: bool,
}

/// A skill version as a report names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionName {
    pub hash: String,
    /// skill.toml's `version`, when it has one.
    pub version: Option<String>,
}

impl std::fmt::Display for VersionName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = &self.hash[..self.hash.len().min(12)];
        match &self.version {
            Some(version) => write!(f, "{version} ({short})"),
            None => write!(f, "{short}"),
        }
    }
}

/// What an upgrade did, or would do.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Upgraded {
    pub task: String,
    pub from: VersionName,
    pub to: VersionName,
    /// The migrations run, by the version each starts from.
    pub migrations: Vec<String>,
    /// RFC 6902 operations from the state before to the state after (empty: unchanged), as a
    /// report may show them: every value either version marks write-only, and every
    /// write-only value of the state before wherever the migration put it, reads
    /// `"[redacted]"` ([`Shown`]). The journal keeps the real patch.
    pub diff: Value,
    /// The step that records it (`apply`), or would.
    pub step: u64,
    /// Whether it was committed.
    pub applied: bool,
    /// Whether it waits for the task's waiting action to be settled (committed then, by the
    /// runner that settles it).
    pub scheduled: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The task already runs this version.
    #[error("task {task} already runs {version}")]
    Unchanged { task: String, version: VersionName },
    /// The target is another skill.
    #[error("task {task} runs skill `{runs}`, not `{target}`: point --to at a version of `{runs}`")]
    OtherSkill {
        task: String,
        runs: String,
        target: String,
    },
    /// The migrated state fails the new version's checks; each rejection has its pointer.
    #[error("task {task} cannot move to {to}: {}", .rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Refused {
        task: String,
        to: VersionName,
        rejections: Vec<Rejection>,
    },
    /// A runner holds the task's lease.
    #[error(
        "task {task} is being run by {holder}: it is upgraded between runs; try again once it stops or pauses"
    )]
    Busy { task: String, holder: String },
    /// An action of the task is in flight or waits for a human.
    #[error(
        "task {task} has an action at step {step} that is {what}: settle it first (approve, reject or reply), then upgrade"
    )]
    Pending {
        task: String,
        step: u64,
        what: &'static str,
    },
    /// The task took a step between its read and the upgrade's commit.
    #[error("task {task} moved on to version {actual} meanwhile: run the upgrade again")]
    Stale { task: String, actual: u64 },
}

/// What a report of an upgrade may show of the task's state: its patch and its problems with
/// the write-only values of both versions hidden. A migration may move a value from a
/// write-only location to one the new version shows; the values the old version hid are
/// scrubbed wherever they land, so a dry run never shows what the old version kept hidden.
pub struct Shown {
    before: WriteOnly,
    after: WriteOnly,
    hidden: SecretValues,
}

impl Shown {
    /// For `task` moving to `to`.
    pub fn of(task: &TaskRecord, to: &skillstate_core::SkillDefinition) -> Self {
        Self::between(&task.skill.schema, &task.state, &to.schema)
    }

    /// For `state`, a document of schema `before`, moving to schema `after` (a task's state,
    /// a board's).
    pub fn between(before: &Value, state: &Value, after: &Value) -> Self {
        let before = WriteOnly::of_schema(before);
        let after = WriteOnly::of_schema(after);
        let mut hidden = SecretValues::default();
        before.collect(state, &mut hidden);
        Self {
            before,
            after,
            hidden,
        }
    }

    /// `patch` (RFC 6902 operations from the state before) as a report shows it.
    pub fn patch(&self, patch: &Value) -> Value {
        let mut shown = patch.clone();
        self.before.redact_patch(&mut shown);
        self.after.redact_patch(&mut shown);
        self.hidden.scrub_json(&mut shown);
        shown
    }

    /// `rejections` with nothing the old version hid in their messages.
    pub fn rejections(&self, rejections: Vec<Rejection>) -> Vec<Rejection> {
        rejections
            .into_iter()
            .map(|mut rejection| {
                rejection.message = self.hidden.scrub(&rejection.message).into_owned();
                rejection
            })
            .collect()
    }
}

/// The note the step after an upgrade opens with.
fn upgraded_note(from: &VersionName, to: &VersionName) -> String {
    format!(
        "(The skill was upgraded from {from} to {to} since the last step; the procedure, tools and state shown are the new version's.)"
    )
}

/// Plans `upgrade` and, with `apply`, commits it.
pub async fn upgrade_task(
    store: &Arc<dyn Store>,
    upgrade: &Upgrade<'_>,
) -> Result<Upgraded, UpgradeError> {
    let task = store.task(upgrade.task).await?;
    let change = SkillChange {
        skill: upgrade.to.definition.clone(),
        tools: upgrade.tools.to_vec(),
    };
    let to = version_name(&change.skill, &change.tools);
    let from = version_name(&task.skill, &task.tools);
    if task.skill.name != change.skill.name {
        return Err(UpgradeError::OtherSkill {
            task: task.id,
            runs: task.skill.name,
            target: change.skill.name,
        });
    }
    if from.hash == to.hash {
        return Err(UpgradeError::Unchanged {
            task: task.id,
            version: to,
        });
    }
    let shown = Shown::of(&task, &upgrade.to.definition);
    let plan = plan_upgrade(
        task.skill.settings.version.as_ref(),
        &task.state,
        upgrade.to,
    )
    .map_err(|rejections| UpgradeError::Refused {
        task: task.id.clone(),
        to: to.clone(),
        rejections: shown.rejections(rejections),
    })?;
    let step = task.version + 1;
    let mut upgraded = Upgraded {
        task: task.id.clone(),
        from,
        to,
        migrations: plan.migrations.iter().map(ToString::to_string).collect(),
        diff: shown.patch(&plan.patch),
        step,
        applied: false,
        scheduled: false,
    };
    if let Some((step, what)) =
        pending_action(store.as_ref(), &task.id, task.version, task.status).await?
    {
        if !matches!(
            task.status,
            TaskStatus::AwaitingApproval | TaskStatus::AwaitingInput
        ) {
            return Err(UpgradeError::Pending {
                task: task.id,
                step,
                what,
            });
        }
        // Waiting for a human: between steps is after the action is settled.
        upgraded.scheduled = true;
        if upgrade.apply {
            match store
                .schedule_upgrade(&task.id, task.version, Some((&change, upgrade.author)))
                .await
            {
                Ok(()) => {}
                Err(StoreError::Conflict { actual, .. }) => {
                    return Err(UpgradeError::Stale {
                        task: task.id,
                        actual,
                    });
                }
                Err(other) => return Err(other.into()),
            }
        }
        return Ok(upgraded);
    }
    if !upgrade.apply {
        return Ok(upgraded);
    }
    let commit = upgrade_step(&upgraded, plan, change, upgrade.author);
    match store
        .commit_unleased_step(&task.id, task.version, &commit)
        .await
    {
        Ok(()) => {
            upgraded.applied = true;
            Ok(upgraded)
        }
        Err(StoreError::Conflict { actual, .. }) => Err(UpgradeError::Stale {
            task: task.id,
            actual,
        }),
        Err(StoreError::Leased { lease, .. }) => Err(UpgradeError::Busy {
            task: task.id,
            holder: lease.holder,
        }),
        Err(other) => Err(other.into()),
    }
}

impl crate::step_loop::Runner<'_> {
    /// Commits the upgrade scheduled for `task` while it waited on an action, once that action
    /// is settled (no intent pending), under the runner's lease, before the next model call.
    /// Returns the task as it is after it, or `None` when nothing was scheduled or the action
    /// still waits. An upgrade the state no longer passes is dropped with a warning (the state
    /// cannot change while a task waits, so this takes a change made outside skillstate).
    pub(crate) async fn upgrade_scheduled(
        &mut self,
        task: &TaskRecord,
    ) -> Result<Option<TaskRecord>, crate::RuntimeError> {
        let Some(scheduled) = task.upgrade_to.clone() else {
            return Ok(None);
        };
        if pending_action(self.store.as_ref(), &task.id, task.version, task.status)
            .await?
            .is_some()
        {
            return Ok(None);
        }
        let change = self.store.skill_version(&scheduled.hash).await?;
        let skill = Skill::from_definition(change.skill.clone()).map_err(|message| {
            crate::RuntimeError::StoredTask {
                task: task.id.clone(),
                message,
            }
        })?;
        let from = version_name(&task.skill, &task.tools);
        let to = version_name(&change.skill, &change.tools);
        let plan = match plan_upgrade(task.skill.settings.version.as_ref(), &task.state, &skill) {
            Ok(plan) => plan,
            Err(rejections) => {
                tracing::warn!(
                    task = %task.id,
                    to = %to,
                    problems = %rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
                    "the scheduled upgrade no longer fits the task's state; dropped"
                );
                self.store
                    .schedule_upgrade(&task.id, task.version, None)
                    .await?;
                return Ok(None);
            }
        };
        let upgraded = Upgraded {
            task: task.id.clone(),
            from,
            to,
            migrations: plan.migrations.iter().map(ToString::to_string).collect(),
            diff: Shown::of(task, &skill.definition).patch(&plan.patch),
            step: task.version + 1,
            applied: true,
            scheduled: true,
        };
        let commit = upgrade_step(&upgraded, plan, change, &scheduled.author);
        self.check_lease()?;
        self.writer()
            .write(
                &task.id,
                skillstate_store::LeasedWrite::Step {
                    expected_version: task.version,
                    commit: &commit,
                },
            )
            .await?;
        Ok(Some(self.store.task(&task.id).await?))
    }
}

/// The journal step that records `upgraded`.
fn upgrade_step(
    upgraded: &Upgraded,
    plan: UpgradePlan,
    change: SkillChange,
    author: &str,
) -> StepCommit {
    let output = json!({
        "upgrade": {
            "from": upgraded.from,
            "to": upgraded.to,
            "migrations": upgraded.migrations,
        }
    });
    let note = upgraded_note(&upgraded.from, &upgraded.to);
    let mut commit = authored_step(
        upgraded.step,
        AuthoredStep {
            output: output.to_string(),
            patch: plan.patch,
            state_hash: plan.state_hash,
            new_state: plan.new_state,
            author,
            note: &note,
        },
    );
    commit.upgrade = Some(change);
    commit
}

/// How reports name the version of `skill` and `tools`.
pub fn version_name(skill: &skillstate_core::SkillDefinition, tools: &[ToolSpec]) -> VersionName {
    VersionName {
        hash: skillstate_store::spec_hash_of(skill, tools),
        version: skill.settings.version.as_ref().map(ToString::to_string),
    }
}
