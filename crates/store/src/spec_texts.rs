//! A skill version as stored (`skill_versions`, schema 13): the skill and tools texts of a new
//! task and the hash that addresses them, shared by both backends.

use crate::model::NewTask;
use crate::rows::{spec_hash, to_json};

/// A skill version's row: its content texts, their hash, the skill's name and human version.
#[derive(Debug, Clone)]
pub(crate) struct SpecTexts {
    pub(crate) hash: String,
    pub(crate) name: String,
    pub(crate) version: Option<String>,
    pub(crate) skill: String,
    pub(crate) tools: String,
}

impl SpecTexts {
    pub(crate) fn of(task: &NewTask) -> Self {
        Self::new(&task.skill, &task.tools)
    }

    pub(crate) fn new(
        skill: &skillstate_core::SkillDefinition,
        tools: &[skillstate_core::ToolSpec],
    ) -> Self {
        let skill_text = to_json(skill);
        let tools_text = to_json(&tools);
        Self {
            hash: spec_hash(&skill_text, &tools_text),
            name: skill.name.clone(),
            version: skill.settings.version.as_ref().map(ToString::to_string),
            skill: skill_text,
            tools: tools_text,
        }
    }
}

/// The hash a skill version is stored under (`skill_versions.hash`): SHA-256 of its skill and
/// tools texts as stored.
pub fn spec_hash_of(
    skill: &skillstate_core::SkillDefinition,
    tools: &[skillstate_core::ToolSpec],
) -> String {
    SpecTexts::new(skill, tools).hash
}

/// A `task_versions` row joined with its version: from step, hash, skill.toml version.
pub(crate) type TaskVersionRow = (i64, String, Option<String>);

/// A listed version: hash, name, version, created at, tasks on it, tasks that ran it, bytes.
pub(crate) type VersionSummaryRow = (String, String, Option<String>, i64, i64, i64, i64);

pub(crate) fn task_version((from_step, hash, version): TaskVersionRow) -> crate::TaskVersion {
    crate::TaskVersion {
        from_step: from_step.max(0) as u64,
        hash,
        version,
    }
}

pub(crate) fn version_summary(
    (hash, name, version, created_at, tasks, ran, bytes): VersionSummaryRow,
) -> crate::SkillVersionSummary {
    crate::SkillVersionSummary {
        hash,
        name,
        version,
        created_at,
        tasks: tasks.max(0) as u64,
        former_tasks: (ran - tasks).max(0) as u64,
        bytes: bytes.max(0) as u64,
    }
}

/// The version stored under `hash` from its texts (`None`: not stored), checked against it.
pub(crate) fn stored_version(
    hash: &str,
    texts: Option<(String, String)>,
) -> crate::Result<crate::SkillChange> {
    let (skill, tools) =
        texts.ok_or_else(|| crate::StoreError::NotFound(format!("skill version {hash}")))?;
    let (skill, tools) = crate::rows::verified_spec(
        &format!("skill version {hash}"),
        &skill,
        &tools,
        Some(Some(hash)),
    )?;
    Ok(crate::SkillChange { skill, tools })
}
