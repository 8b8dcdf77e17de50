//! Moving a task's state to another version of its skill, the pure part: the migrations that
//! apply (`skill/migrations.rs` says which), the migrated state, and the same state checks as
//! every other state write — the new version's schema and state budget, and read-only
//! locations: a migration may give a read-only location of the new schema its first value
//! (one the old state did not hold), but never change or remove a read-only value the task
//! holds, which came from its user or the runtime, not from the model.
//!
//! The step that records an upgrade journals `patch`, a JSON Patch from the old state to the
//! new one, so replay and time travel apply it like any other step's patch, whatever mix of
//! JSON Patch and merge-patch migrations made it.

use serde_json::Value;

use crate::json::{pointer_for_humans, state_hash};
use crate::patch::StatePatch;
use crate::skill::{Migration, Skill, SkillVersion};
use crate::tokens::count_tokens;
use crate::validate::{Document, Rejection, RejectionKind, schema_rejections};

/// A checked upgrade, ready to commit.
#[derive(Debug, Clone, PartialEq)]
pub struct UpgradePlan {
    /// The migrations it runs, oldest first (none when the state fits as it is).
    pub migrations: Vec<SkillVersion>,
    /// The state after them.
    pub new_state: Value,
    pub state_hash: String,
    /// RFC 6902 operations from the old state to the new one (empty when unchanged).
    pub patch: Value,
}

impl UpgradePlan {
    /// Whether the upgrade leaves the state as it is.
    pub fn keeps_state(&self) -> bool {
        self.patch.as_array().is_none_or(Vec::is_empty)
    }
}

/// The migrations of `target` that a task on version `from` runs (`None`: a skill without a
/// version, which runs them all): from the one whose range holds `from` (the newest named
/// `from` or older) on; every one when `from` is older than all of them; none when `from` is
/// this version or newer.
pub fn migrations_from<'a>(from: Option<&SkillVersion>, target: &'a Skill) -> Vec<&'a Migration> {
    let all = &target.definition.migrations;
    let Some(from) = from else {
        return all.iter().collect();
    };
    if target
        .settings()
        .version
        .as_ref()
        .is_some_and(|own| from >= own)
    {
        return Vec::new();
    }
    let start = all.iter().rposition(|m| m.from <= *from).unwrap_or(0);
    all[start..].iter().collect()
}

/// Migrates `state`, a state of version `from`, to `target` and checks the result; every
/// problem found is a rejection with its pointer (into the migrated state, or into the
/// migration file for a patch that does not apply).
pub fn plan_upgrade(
    from: Option<&SkillVersion>,
    state: &Value,
    target: &Skill,
) -> Result<UpgradePlan, Vec<Rejection>> {
    let mut migrated = state.clone();
    let mut ran = Vec::new();
    for migration in migrations_from(from, target) {
        let applied = StatePatch::from_value(&migration.patch)
            .and_then(|patch| patch.apply_in_place(&mut migrated));
        if let Err(problem) = applied {
            return Err(vec![Rejection {
                kind: RejectionKind::PatchApply,
                document: Document::State,
                message: format!(
                    "{} does not apply to the task's state: {}",
                    migration.file_name(),
                    problem.message
                ),
                pointer: problem.pointer,
            }]);
        }
        ran.push(migration.from.clone());
    }
    let checked = check_migrated(
        state,
        migrated,
        &target.schema,
        target.settings().budgets.state_tokens,
        &MigrationTerms::TASK,
    )?;
    Ok(UpgradePlan {
        migrations: ran,
        state_hash: checked.state_hash,
        new_state: checked.new_state,
        patch: checked.patch,
    })
}

/// How the checks of a migrated state name what they check: a task's state moving to a new
/// version of its skill, or a board's state moving to a new schema.
pub struct MigrationTerms {
    /// The document, as `pointer_for_humans` names it (`state`, `board`).
    pub document: &'static str,
    /// The migrated document (`the migrated state`).
    pub migrated: &'static str,
    /// Its new schema (`the new version's schema`).
    pub schema: &'static str,
    /// Who gave the read-only values the document holds.
    pub read_only_origin: &'static str,
    /// Its budget, as a message names it, and where the budget is set (with a leading space
    /// and in parentheses, or empty).
    pub budget: &'static str,
    pub budget_source: &'static str,
    /// Whose state the journaled patch applies to (`the task's state`).
    pub patched: &'static str,
}

impl MigrationTerms {
    /// A task moving to another version of its skill.
    pub const TASK: MigrationTerms = MigrationTerms {
        document: "state",
        migrated: "the migrated state",
        schema: "the new version's schema",
        read_only_origin: "is read-only in the new version and holds a value the task's user or runtime gave it",
        budget: "the new version's budget",
        budget_source: " ([budgets] state_tokens)",
        patched: "the task's state",
    };
}

/// A migrated document that passed its checks: the journaled patch and what it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Migrated {
    pub new_state: Value,
    pub state_hash: String,
    /// RFC 6902 operations from the old document to the new one (empty when unchanged).
    pub patch: Value,
}

/// The checks every migrated document passes, whatever migrated it (a skill version's
/// migrations, a board's): a read-only location of the new schema the old document holds keeps
/// its value (a migration may set one it does not hold yet), the new schema (every violation
/// with its pointer), and the budget of `budget` tokens. The document committed is the RFC 6902
/// patch from `state` applied to `state`, exactly as replay and time travel will rebuild it
/// (member order included, which a prompt shows).
pub fn check_migrated(
    state: &Value,
    migrated: Value,
    schema: &crate::StateSchema,
    budget: usize,
    terms: &MigrationTerms,
) -> Result<Migrated, Vec<Rejection>> {
    let mut rejections = Vec::new();
    // Read-only values the document holds stay as they are; new ones may be set.
    for pointer in schema.changed_read_only_locations(state, &migrated) {
        if state.pointer(&pointer).is_some() {
            rejections.push(Rejection {
                kind: RejectionKind::ReadOnly,
                document: Document::State,
                message: format!(
                    "{} {}: a migration may set a read-only location the {} does not hold yet, never change or remove one",
                    pointer_for_humans(&pointer, terms.document),
                    terms.read_only_origin,
                    terms.document
                ),
                pointer,
            });
        }
    }
    let problems = schema.violations(&migrated);
    if !problems.is_empty() {
        rejections.extend(schema_rejections(
            &problems,
            &schema.whole_view(),
            terms.migrated,
            terms.schema,
        ));
    }
    let compact = serde_json::to_string(&migrated).unwrap_or_default();
    if compact.len() > budget {
        let tokens = count_tokens(&compact);
        if tokens > budget {
            rejections.push(Rejection {
                kind: RejectionKind::StateBudget,
                document: Document::State,
                pointer: String::new(),
                message: format!(
                    "{} would be {tokens} tokens, over {} of {budget}{}",
                    terms.migrated, terms.budget, terms.budget_source
                ),
            });
        }
    }
    if !rejections.is_empty() {
        return Err(rejections);
    }
    let patch = serde_json::to_value(json_patch::diff(state, &migrated))
        .unwrap_or_else(|_| Value::Array(Vec::new()));
    let new_state = StatePatch::from_value(&patch)
        .and_then(|p| p.apply(state))
        .ok()
        .filter(|replayed| *replayed == migrated)
        .ok_or_else(|| {
            vec![Rejection {
                kind: RejectionKind::PatchApply,
                document: Document::State,
                pointer: String::new(),
                message: format!(
                    "{} cannot be expressed as a patch of {}",
                    terms.migrated, terms.patched
                ),
            }]
        })?;
    Ok(Migrated {
        state_hash: state_hash(&new_state),
        new_state,
        patch,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::skill::SkillDefinition;

    fn version(text: &str) -> SkillVersion {
        SkillVersion::parse(text).unwrap()
    }

    /// Version 2.0.0 of a skill whose 1.0.0 kept `count` and 1.5.0 renamed it to `total`:
    /// 2.0.0 calls it `done` and adds a read-only `owner`.
    fn target(schema: Value, migrations: &[(&str, Value)]) -> Skill {
        let mut settings = crate::skill::SkillSettings {
            version: Some(version("2.0.0")),
            ..Default::default()
        };
        settings.budgets.state_tokens = 200;
        Skill::from_definition(SkillDefinition {
            name: "counter".into(),
            description: "counts".into(),
            metadata: None,
            procedure: "Count.".into(),
            schema,
            initial_state: json!({}),
            settings,
            migrations: migrations
                .iter()
                .map(|(from, patch)| Migration {
                    from: version(from),
                    patch: patch.clone(),
                })
                .collect(),
        })
        .unwrap()
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "done": {"type": "integer"},
                "owner": {"type": "string", "readOnly": true},
                "note": {"type": "string"}
            },
            "additionalProperties": false
        })
    }

    fn chain() -> Skill {
        target(
            schema(),
            &[
                (
                    "1.0.0",
                    json!([{"op": "move", "from": "/count", "path": "/total"}]),
                ),
                ("1.5.0", json!({"total": null, "done": 0, "owner": "ops"})),
            ],
        )
    }

    #[test]
    fn a_chain_of_migrations_composes_from_the_tasks_version_on() {
        let skill = chain();
        let plan = plan_upgrade(Some(&version("1.0.0")), &json!({"count": 3}), &skill).unwrap();
        assert_eq!(plan.migrations, [version("1.0.0"), version("1.5.0")]);
        assert_eq!(plan.new_state, json!({"done": 0, "owner": "ops"}));
        // The journaled patch takes the old state to the new one.
        let replayed = StatePatch::from_value(&plan.patch)
            .unwrap()
            .apply(&json!({"count": 3}))
            .unwrap();
        assert_eq!(replayed, plan.new_state);
        assert_eq!(plan.state_hash, state_hash(&plan.new_state));

        // A task on 1.2.0 shares 1.0.0's shape and runs both; one on 1.5.0 or 1.7.0 (before
        // the next migration) the second only; one on this version or newer none.
        assert_eq!(
            plan_upgrade(Some(&version("1.2.0")), &json!({"count": 3}), &skill)
                .unwrap()
                .migrations
                .len(),
            2
        );
        assert!(
            plan_upgrade(Some(&version("2.0.0")), &json!({"done": 3}), &skill)
                .unwrap()
                .migrations
                .is_empty()
        );
        for from in ["1.5.0", "1.7.0"] {
            let plan = plan_upgrade(Some(&version(from)), &json!({"total": 3}), &skill).unwrap();
            assert_eq!(plan.migrations, [version("1.5.0")], "{from}");
        }
        // A task without a version runs them all.
        assert_eq!(
            plan_upgrade(None, &json!({"count": 1}), &skill)
                .unwrap()
                .migrations
                .len(),
            2
        );
    }

    #[test]
    fn a_state_the_new_schema_accepts_needs_nothing_else() {
        let skill = target(schema(), &[]);
        let state = json!({"done": 4, "note": "x"});
        let plan = plan_upgrade(Some(&version("1.0.0")), &state, &skill).unwrap();
        assert!(plan.keeps_state() && plan.migrations.is_empty());
        assert_eq!(plan.new_state, state);
    }

    #[test]
    fn a_state_the_new_schema_refuses_is_named_at_its_pointer() {
        let skill = target(schema(), &[]);
        let errors =
            plan_upgrade(Some(&version("1.0.0")), &json!({"done": "four"}), &skill).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].kind, RejectionKind::Schema);
        assert_eq!(errors[0].pointer, "/done");
        // A migration that does not apply names its file and the pointer.
        let broken = target(
            schema(),
            &[("1.0.0", json!([{"op": "remove", "path": "/missing"}]))],
        );
        let errors =
            plan_upgrade(Some(&version("1.0.0")), &json!({"done": 1}), &broken).unwrap_err();
        assert_eq!(errors[0].kind, RejectionKind::PatchApply);
        assert_eq!(errors[0].pointer, "/missing");
        assert!(
            errors[0].message.contains("migrations/1.0.0.json"),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn a_migration_sets_a_new_read_only_value_but_never_changes_one_the_task_holds() {
        let skill = target(schema(), &[("1.0.0", json!({"owner": "someone else"}))]);
        let errors = plan_upgrade(
            Some(&version("1.0.0")),
            &json!({"done": 1, "owner": "alice"}),
            &skill,
        )
        .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            (errors[0].kind, errors[0].pointer.as_str()),
            (RejectionKind::ReadOnly, "/owner")
        );
        let removing = target(schema(), &[("1.0.0", json!({"owner": null}))]);
        assert!(
            plan_upgrade(
                Some(&version("1.0.0")),
                &json!({"owner": "alice"}),
                &removing
            )
            .is_err()
        );
        // Absent before: the migration gives it its first value.
        let plan = plan_upgrade(Some(&version("1.0.0")), &json!({"done": 1}), &skill).unwrap();
        assert_eq!(plan.new_state["owner"], "someone else");
    }

    #[test]
    fn the_new_budget_applies() {
        let skill = target(
            json!({"type": "object"}),
            &[("1.0.0", json!({"big": "word ".repeat(400)}))],
        );
        let errors = plan_upgrade(Some(&version("1.0.0")), &json!({}), &skill).unwrap_err();
        assert_eq!(errors[0].kind, RejectionKind::StateBudget);
    }
}
