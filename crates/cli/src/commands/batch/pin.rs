//! `skill_version` pinning: a batch line (or `batch submit --skill-version`) names the version
//! of the skill its task is created on — a skill.toml version or a hash prefix from
//! `skillstate skills`. The skill directory of the batch file is used when it holds that
//! version; otherwise a version the database already keeps under the same skill name, with the
//! tools the task's world presents for it (which must give the pinned hash again). Anything
//! else refuses the line, naming it and the versions there are.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use skillstate_core::Skill;
use skillstate_core::skill::{EnvironmentSettings, SkillVersion};
use skillstate_runtime::upgrade::{VersionName, version_name};
use skillstate_runtime::{TaskOptions, presented_tools};
use skillstate_store::{QueuedTask, SkillVersionSummary, Store};
use skillstate_tools::UserRequest;

use super::inputs::TaskInput;
use super::submit::{apply_limits, prepare_unlimited};
use super::{db_flag, shown_db};
use crate::config::Config;
use crate::toolbox::{self, Toolbox};

/// Fewest hex characters of a hash that pin a version (as `skillstate upgrade --skill`).
pub const MIN_HASH_PREFIX: usize = 6;

/// A pinned skill version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// skill.toml's `version`, as it prints (`1.2.0`).
    Version(String),
    /// The start of a version's hash, lower case.
    Hash(String),
}

impl Pin {
    /// `text` as a pin: a semantic version, or at least [`MIN_HASH_PREFIX`] hex characters.
    /// The error says what to give instead.
    pub fn parse(text: &str) -> Result<Pin, String> {
        let text = text.trim();
        let hex = !text.is_empty() && text.chars().all(|c| c.is_ascii_hexdigit());
        if hex && text.len() >= MIN_HASH_PREFIX {
            return Ok(Pin::Hash(text.to_ascii_lowercase()));
        }
        match SkillVersion::parse(text) {
            Ok(version) => Ok(Pin::Version(version.to_string())),
            Err(_) if hex => Err(format!(
                "`{text}` is too short for a hash prefix: give at least {MIN_HASH_PREFIX} hex characters of a hash from `skillstate skills`, or a skill.toml version such as 1.2.0"
            )),
            Err(error) => Err(format!(
                "{error}; give a skill.toml version such as 1.2.0, or at least {MIN_HASH_PREFIX} hex characters of a hash from `skillstate skills`"
            )),
        }
    }

    fn matches(&self, hash: &str, version: Option<&str>) -> bool {
        match self {
            Pin::Version(wanted) => version == Some(wanted.as_str()),
            Pin::Hash(prefix) => hash.starts_with(prefix.as_str()),
        }
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pin::Version(text) | Pin::Hash(text) => f.write_str(text),
        }
    }
}

/// Which version a pinned line's task is created on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The skill directory's.
    Directory,
    /// The stored version with this hash.
    Stored(String),
}

/// Where the versions a refusal lists are: the skill directory and the database, as shown.
pub struct Places {
    pub skill_dir: String,
    pub db: String,
    /// ` --db <db>` for commands the messages print (empty for the default database).
    pub db_flag: String,
    /// Whether the database exists (one that does not keeps nothing yet).
    pub db_exists: bool,
}

/// The version `pin` names among the directory's (`directory`) and the stored versions of the
/// same skill (`stored`); the error (without the line) lists them and says what to do.
pub fn choose(
    pin: &Pin,
    skill: &str,
    directory: &VersionName,
    stored: &[SkillVersionSummary],
    places: &Places,
) -> Result<Choice, String> {
    if let Pin::Version(wanted) = pin
        && directory.version.as_deref() == Some(wanted.as_str())
    {
        return Ok(Choice::Directory);
    }
    let directory_matches = pin.matches(&directory.hash, directory.version.as_deref());
    let matching: Vec<&SkillVersionSummary> = stored
        .iter()
        .filter(|v| v.name == skill && v.hash != directory.hash)
        .filter(|v| pin.matches(&v.hash, v.version.as_deref()))
        .collect();
    match (directory_matches, matching.as_slice()) {
        (true, []) => Ok(Choice::Directory),
        (false, [only]) => Ok(Choice::Stored(only.hash.clone())),
        (false, []) => Err(format!(
            "no version of skill `{skill}` is `{pin}`: {}; pin one of these (its skill.toml version, or at least {MIN_HASH_PREFIX} characters of its hash), submit to the database that keeps `{pin}` (--db, or the batch file's `store:`), or point the batch file's `skill:` at a directory that holds it",
            listing(skill, directory, stored, places)
        )),
        _ => {
            let mut candidates: Vec<String> = Vec::new();
            if directory_matches {
                candidates.push(format!("{directory} (the skill directory)"));
            }
            candidates.extend(matching.iter().map(|v| named(v).to_string()));
            let what = match pin {
                Pin::Version(_) => {
                    format!(
                        "the database keeps several versions of skill `{skill}` numbered `{pin}`"
                    )
                }
                Pin::Hash(_) => {
                    format!("`{pin}` starts the hash of several versions of skill `{skill}`")
                }
            };
            Err(format!(
                "{what}: {}; pin one by more characters of its hash (`skillstate{} skills` shows them)",
                candidates.join(", "),
                places.db_flag
            ))
        }
    }
}

fn named(summary: &SkillVersionSummary) -> VersionName {
    VersionName {
        hash: summary.hash.clone(),
        version: summary.version.clone(),
    }
}

/// The versions there are: the directory's, then the stored ones of `skill`.
fn listing(
    skill: &str,
    directory: &VersionName,
    stored: &[SkillVersionSummary],
    places: &Places,
) -> String {
    let kept: Vec<String> = stored
        .iter()
        .filter(|v| v.name == skill)
        .map(|v| named(v).to_string())
        .collect();
    let database = if !places.db_exists {
        format!("the database {} does not exist yet", places.db)
    } else if kept.is_empty() {
        format!("the database {} keeps no version of it", places.db)
    } else {
        format!("the database {} keeps {}", places.db, kept.join(", "))
    };
    format!(
        "the skill directory {} holds {directory}, and {database}",
        places.skill_dir
    )
}

/// The skill directory of a batch, and the world its tasks are prepared in.
pub struct Directory<'a> {
    pub skill: &'a Skill,
    pub environment: Option<&'a EnvironmentSettings>,
    pub toolbox: Option<&'a Toolbox>,
}

/// A stored version, loaded to prepare tasks on.
struct Stored {
    skill: Skill,
    toolbox: Option<Toolbox>,
}

/// Resolves the pins of a batch's lines, reading the database only when a line needs it, and
/// prepares each line's task on its version.
pub struct Pinner<'a> {
    config: &'a Config,
    location: &'a str,
    places: Places,
    default: Option<Pin>,
    directory_version: Option<VersionName>,
    store: Option<Arc<dyn Store>>,
    stored: Option<Vec<SkillVersionSummary>>,
    loaded: HashMap<String, Stored>,
}

impl<'a> Pinner<'a> {
    /// Pins for the batch whose skill directory is shown as `skill_dir`, submitted to
    /// `location`; `default` is `--skill-version`, for lines without a `skill_version`.
    pub fn new(
        config: &'a Config,
        location: &'a str,
        skill_dir: String,
        default: Option<Pin>,
    ) -> Self {
        let db_exists = match skillstate_store::database_file(location) {
            Some(file) => file.exists(),
            None => !matches!(location, ":memory:" | "sqlite::memory:"),
        };
        Self {
            config,
            location,
            places: Places {
                skill_dir,
                db: shown_db(location),
                db_flag: db_flag(location),
                db_exists,
            },
            default,
            directory_version: None,
            store: None,
            stored: None,
            loaded: HashMap::new(),
        }
    }

    /// The task of `input`, on the version it (or `--skill-version`) pins; an unpinned line is
    /// prepared on the directory's version, as always.
    pub async fn task(
        &mut self,
        directory: &Directory<'_>,
        options: &TaskOptions,
        input: &TaskInput,
    ) -> Result<QueuedTask> {
        let (pin, field) = match (&input.skill_version, &self.default) {
            (Some(pin), _) => (pin.clone(), "skill_version"),
            (None, Some(pin)) => (pin.clone(), "skill_version (--skill-version)"),
            (None, None) => {
                return super::submit::prepare_one(
                    directory.skill,
                    directory.environment,
                    directory.toolbox,
                    options,
                    input,
                );
            }
        };
        let at = &input.at;
        let directory_version = match &self.directory_version {
            Some(version) => version.clone(),
            None => {
                let version = directory_version(directory)
                    .with_context(|| format!("{at}: {field}: the skill directory's version"))?;
                self.directory_version = Some(version.clone());
                version
            }
        };
        let wanted_in_directory = matches!(&pin, Pin::Version(v) if directory_version.version.as_deref() == Some(v.as_str()));
        if !wanted_in_directory {
            self.load_stored()
                .await
                .with_context(|| format!("{at}: {field}: cannot read the stored versions"))?;
        }
        let stored = self.stored.as_deref().unwrap_or_default();
        let choice = choose(
            &pin,
            directory.skill.name(),
            &directory_version,
            stored,
            &self.places,
        )
        .map_err(|message| anyhow!("{at}: {field}: {message}"))?;
        let (task, pinned) = match choice {
            Choice::Directory => {
                let task = prepare_unlimited(
                    directory.skill,
                    directory.environment,
                    directory.toolbox,
                    options,
                    input,
                )?;
                // A skill.toml version names the directory's version whatever tools a line's
                // parameters give; a hash names exactly one.
                let pinned = matches!(pin, Pin::Hash(_)).then(|| directory_version.clone());
                (task, pinned)
            }
            Choice::Stored(hash) => {
                let summary =
                    stored
                        .iter()
                        .find(|v| v.hash == hash)
                        .map(named)
                        .unwrap_or(VersionName {
                            hash: hash.clone(),
                            version: None,
                        });
                let source = self
                    .stored_version(&hash)
                    .await
                    .with_context(|| format!("{at}: {field}: the stored version {summary}"))?;
                let environment = source.skill.settings().environment.clone();
                let task = prepare_unlimited(
                    &source.skill,
                    environment.as_ref(),
                    source.toolbox.as_ref(),
                    options,
                    input,
                )?;
                (task, Some(summary))
            }
        };
        if let Some(pinned) = pinned {
            let made = version_name(&task.task.skill, &task.task.tools);
            if made.hash != pinned.hash {
                return Err(anyhow!(
                    "{at}: {field}: in this line's world version {pinned} presents other tools than the ones it was made with (the task would run {made}); a task is created only on the version pinned: pin the version this world gives (`skillstate{} skills` lists the stored ones), or change the line's `environment` so that it offers the same tools",
                    self.places.db_flag
                ));
            }
        }
        let mut task = task;
        apply_limits(&mut task, input);
        Ok(task)
    }

    /// Reads the stored versions once (none when the database does not exist yet).
    async fn load_stored(&mut self) -> Result<()> {
        if self.stored.is_some() {
            return Ok(());
        }
        if !self.places.db_exists {
            self.stored = Some(Vec::new());
            return Ok(());
        }
        let store = crate::config::open_existing(self.location)
            .await
            .with_context(|| format!("cannot open the database {}", self.places.db))?;
        let versions = store.skill_versions().await?;
        self.store = Some(store);
        self.stored = Some(versions);
        Ok(())
    }

    /// The stored version `hash`, its schema compiled and, for a skill without a built-in
    /// environment, its tool box built (once per batch).
    async fn stored_version(&mut self, hash: &str) -> Result<&Stored> {
        if !self.loaded.contains_key(hash) {
            let store = self.store.as_ref().context("the database is not open")?;
            let change = store.skill_version(hash).await?;
            let skill = Skill::from_definition(change.skill)
                .map_err(|e| anyhow!("cannot be loaded: {e}"))?;
            toolbox::check_skill_paths(skill.settings(), self.config)?;
            let toolbox = match &skill.settings().environment {
                Some(_) => None,
                None => {
                    let dir = std::path::Path::new(&self.places.skill_dir);
                    let place =
                        toolbox::work_place(skill.settings(), Some(dir), None, self.config)?;
                    Some(toolbox::build(skill.settings(), &place, self.config).await?)
                }
            };
            self.loaded
                .insert(hash.to_owned(), Stored { skill, toolbox });
        }
        self.loaded
            .get(hash)
            .context("the stored version was not loaded")
    }

    /// Stops the tool boxes of stored versions and lets go of the database.
    pub async fn close(self) {
        for stored in self.loaded.values() {
            if let Some(toolbox) = &stored.toolbox {
                toolbox.shutdown().await;
                toolbox.discard_own_work_dir();
            }
        }
        if let Some(store) = &self.store {
            store.release().await;
        }
    }
}

/// The directory's version as its tasks run it without parameters of their own: its skill
/// and the tools its world presents.
fn directory_version(directory: &Directory<'_>) -> Result<VersionName> {
    let env: Box<dyn skillstate_tools::Environment> =
        match (directory.environment, directory.toolbox) {
            (Some(settings), _) => skillstate_envs::build_environment(settings)?,
            (None, Some(toolbox)) => {
                Box::new(UserRequest::new(String::new()).with_tools(toolbox.tools.clone()))
            }
            (None, None) => anyhow::bail!("the skill has neither an environment nor tools"),
        };
    let tools = presented_tools(directory.skill, env.as_ref())?;
    Ok(version_name(&directory.skill.definition, &tools))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn stored(name: &str, version: Option<&str>, hash: &str) -> SkillVersionSummary {
        SkillVersionSummary {
            hash: hash.into(),
            name: name.into(),
            version: version.map(str::to_owned),
            created_at: 0,
            tasks: 1,
            former_tasks: 0,
            bytes: 10,
        }
    }

    fn places() -> Places {
        Places {
            skill_dir: "skills/warehouse".into(),
            db: "batch.db".into(),
            db_flag: " --db batch.db".into(),
            db_exists: true,
        }
    }

    #[test]
    fn pins_are_versions_or_hash_prefixes() {
        assert_eq!(Pin::parse("1.2.0"), Ok(Pin::Version("1.2.0".into())));
        assert_eq!(Pin::parse(" ABCDEF12 "), Ok(Pin::Hash("abcdef12".into())));
        let short = Pin::parse("abc12").unwrap_err();
        assert!(short.contains("too short for a hash prefix"), "{short}");
        let neither = Pin::parse("1.2").unwrap_err();
        assert!(neither.contains("not a semantic version"), "{neither}");
        assert!(neither.contains("at least 6 hex characters"), "{neither}");
    }

    #[test]
    fn the_directory_wins_then_the_one_stored_match() {
        let directory = VersionName {
            hash: "bbbbbb22".into(),
            version: Some("2.0.0".into()),
        };
        let versions = vec![
            stored("warehouse", Some("1.0.0"), "aaaaaa11"),
            stored("warehouse", Some("2.0.0"), "bbbbbb22"),
            stored("other", Some("3.0.0"), "cccccc33"),
        ];
        let pick = |pin: &str| {
            choose(
                &Pin::parse(pin).unwrap(),
                "warehouse",
                &directory,
                &versions,
                &places(),
            )
        };
        assert_eq!(pick("2.0.0"), Ok(Choice::Directory));
        assert_eq!(pick("bbbbbb"), Ok(Choice::Directory));
        assert_eq!(pick("1.0.0"), Ok(Choice::Stored("aaaaaa11".into())));
        assert_eq!(pick("AAAAAA1"), Ok(Choice::Stored("aaaaaa11".into())));
        let missing = pick("3.0.0").unwrap_err();
        assert!(
            missing.starts_with("no version of skill `warehouse` is `3.0.0`: the skill directory skills/warehouse holds 2.0.0 (bbbbbb22), and the database batch.db keeps 1.0.0 (aaaaaa11), 2.0.0 (bbbbbb22); pin one of these"),
            "{missing}"
        );
        let fresh = Places {
            db_exists: false,
            ..places()
        };
        let missing = choose(
            &Pin::Version("1.0.0".into()),
            "warehouse",
            &directory,
            &[],
            &fresh,
        )
        .unwrap_err();
        assert!(
            missing.contains("the database batch.db does not exist yet"),
            "{missing}"
        );
    }

    #[test]
    fn an_ambiguous_pin_is_refused_with_its_candidates() {
        let directory = VersionName {
            hash: "abcdef01".into(),
            version: Some("2.0.0".into()),
        };
        let versions = vec![
            stored("warehouse", Some("1.0.0"), "abcdef99"),
            stored("warehouse", Some("1.0.0"), "123456aa"),
        ];
        let pick = |pin: &str| {
            choose(
                &Pin::parse(pin).unwrap(),
                "warehouse",
                &directory,
                &versions,
                &places(),
            )
        };
        let prefix = pick("abcdef").unwrap_err();
        assert!(
            prefix.starts_with("`abcdef` starts the hash of several versions of skill `warehouse`: 2.0.0 (abcdef01) (the skill directory), 1.0.0 (abcdef99); pin one by more characters of its hash"),
            "{prefix}"
        );
        assert_eq!(pick("abcdef0"), Ok(Choice::Directory));
        let version = pick("1.0.0").unwrap_err();
        assert!(
            version.starts_with(
                "the database keeps several versions of skill `warehouse` numbered `1.0.0`: 1.0.0 (abcdef99), 1.0.0 (123456aa)"
            ),
            "{version}"
        );
    }
}
