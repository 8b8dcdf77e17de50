//! A board's schema changing (`skillstate board upgrade`), the pure part. The rules are a task
//! upgrade's (`crate::upgrade`): an optional migration (a JSON Patch array or a JSON merge
//! patch object) is applied to the board's current state, and the migrated state passes the
//! checks of every migrated document (`check_migrated`: a read-only value the board holds stays
//! as it is, the new schema with every violation's pointer, the board budget). Then every
//! member's scope is checked against the new schema with the check `validate --board` runs on
//! a skill's `[board]` table ([`super::undeclared`]): an API key limited to board pointers, or
//! an attached task whose skill reads or writes a pointer that names nothing in the new schema,
//! refuses the upgrade, each refusal naming the member and the pointer. Every problem is
//! reported at once.
//!
//! The write that records the change journals `patch`, an RFC 6902 patch from the state before
//! to the state after, so replay and time travel apply it like any other write.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::schema_scope::undeclared;
use super::scope::{BoardScope, ScopeList};
use crate::StateSchema;
use crate::patch::StatePatch;
use crate::upgrade::{MigrationTerms, check_migrated};
use crate::validate::{Document, Rejection, RejectionKind};

/// The state budget of a board, in tokens: the service's board writes are checked against the
/// same budget (boards are shared documents, not one prompt; it only stops runaway growth).
pub const BOARD_STATE_TOKENS: usize = 1_000_000;

/// How a board's migration is named in messages.
const TERMS: MigrationTerms = MigrationTerms {
    document: "board",
    migrated: "the migrated board",
    schema: "the new board schema",
    read_only_origin: "is read-only in the new schema and holds a value the board's writers gave it",
    budget: "the board budget",
    budget_source: "",
    patched: "the board's state",
};

/// A member of a board, as a refusal names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum BoardMember {
    /// An API key limited to board pointers (its id).
    Key(String),
    /// A task attached to the board (its id); its skill's `[board]` table is its scope.
    Task(String),
}

impl fmt::Display for BoardMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoardMember::Key(id) => write!(f, "API key {id}"),
            BoardMember::Task(id) => write!(f, "task {id}"),
        }
    }
}

/// A member and the scope it reads and writes the board through.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberScope {
    pub member: BoardMember,
    pub scope: BoardScope,
}

/// A member's pointer that names nothing in the new schema.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeRefusal {
    pub member: BoardMember,
    /// `reads` or `writes`.
    pub list: &'static str,
    pub pointer: String,
    /// Why the new schema declares nothing there.
    pub reason: String,
}

impl fmt::Display for ScopeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.member {
            BoardMember::Key(_) => {
                "first revoke the key (skillstate keys revoke) and create one with pointers the new schema has"
            }
            BoardMember::Task(_) => {
                "first upgrade the task to a skill version whose [board] pointers the new schema has (skillstate upgrade), or delete the task"
            }
        };
        write!(
            f,
            "{}: its {} pointer \"{}\" names nothing in the new schema: {}; keep that part in the schema, or {what}",
            self.member, self.list, self.pointer, self.reason
        )
    }
}

/// Why an upgrade is refused: the migrated state's problems (pointers into the migrated board,
/// or into the migration for one that does not apply) and the members' pointers that name
/// nothing in the new schema.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BoardUpgradeRefusal {
    pub rejections: Vec<Rejection>,
    pub scopes: Vec<ScopeRefusal>,
}

/// A checked schema change, ready to commit.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardUpgradePlan {
    pub new_state: Value,
    pub state_hash: String,
    /// RFC 6902 operations from the state before to the state after (empty when unchanged).
    pub patch: Value,
}

impl BoardUpgradePlan {
    /// Whether the upgrade leaves the state as it is.
    pub fn keeps_state(&self) -> bool {
        self.patch.as_array().is_none_or(Vec::is_empty)
    }
}

/// Every pointer of `members`' scopes that names nothing in `schema`, by member, reads first.
pub fn scope_refusals(schema: &Value, members: &[MemberScope]) -> Vec<ScopeRefusal> {
    let mut refusals = Vec::new();
    for member in members {
        for (list, pointers) in [
            (ScopeList::Reads, &member.scope.reads),
            (ScopeList::Writes, &member.scope.writes),
        ] {
            for pointer in pointers {
                if let Some(reason) = undeclared(schema, pointer) {
                    refusals.push(ScopeRefusal {
                        member: member.member.clone(),
                        list: list.as_str(),
                        pointer: pointer.to_string(),
                        reason,
                    });
                }
            }
        }
    }
    refusals
}

/// Migrates `state` (the board's current state) with `migration`, when given, to `schema` and
/// checks the result and every member's scope; every problem found is reported.
pub fn plan_board_upgrade(
    state: &Value,
    migration: Option<&Value>,
    schema: &StateSchema,
    members: &[MemberScope],
) -> Result<BoardUpgradePlan, BoardUpgradeRefusal> {
    let mut refusal = BoardUpgradeRefusal {
        scopes: scope_refusals(schema.document(), members),
        ..Default::default()
    };
    let mut migrated = state.clone();
    if let Some(migration) = migration {
        let applied =
            StatePatch::from_value(migration).and_then(|patch| patch.apply_in_place(&mut migrated));
        if let Err(problem) = applied {
            refusal.rejections.push(Rejection {
                kind: RejectionKind::PatchApply,
                document: Document::State,
                message: format!(
                    "the migration does not apply to the board's state: {}",
                    problem.message
                ),
                pointer: problem.pointer,
            });
            return Err(refusal);
        }
    }
    match check_migrated(state, migrated, schema, BOARD_STATE_TOKENS, &TERMS) {
        Ok(checked) if refusal.scopes.is_empty() => Ok(BoardUpgradePlan {
            new_state: checked.new_state,
            state_hash: checked.state_hash,
            patch: checked.patch,
        }),
        Ok(_) => Err(refusal),
        Err(rejections) => {
            refusal.rejections = rejections;
            Err(refusal)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::board::BoardTable;

    fn schema(document: Value) -> StateSchema {
        StateSchema::compile(document).unwrap()
    }

    fn member(member: BoardMember, reads: &[&str], writes: &[&str]) -> MemberScope {
        MemberScope {
            member,
            scope: BoardScope::parse(&BoardTable {
                reads: reads.iter().map(|s| (*s).to_owned()).collect(),
                writes: writes.iter().map(|s| (*s).to_owned()).collect(),
            })
            .unwrap(),
        }
    }

    fn renamed() -> StateSchema {
        schema(json!({
            "type": "object",
            "properties": {
                "plan": {
                    "type": "object",
                    "properties": {"objective": {"type": "string"}},
                    "required": ["objective"],
                    "additionalProperties": false
                },
                "frontend": {"type": "object"}
            },
            "required": ["plan"],
            "additionalProperties": false
        }))
    }

    #[test]
    fn a_rename_with_its_migration_is_planned_as_one_json_patch() {
        let state = json!({"plan": {"goal": "ship"}, "frontend": {"done": false}});
        let migration = json!([{"op": "move", "from": "/plan/goal", "path": "/plan/objective"}]);
        let members = [
            member(
                BoardMember::Task("t1".into()),
                &["/plan", "/frontend"],
                &["/frontend"],
            ),
            member(BoardMember::Key("k1".into()), &["/plan/objective"], &[]),
        ];
        let plan = plan_board_upgrade(&state, Some(&migration), &renamed(), &members).unwrap();
        assert_eq!(
            plan.new_state,
            json!({"plan": {"objective": "ship"}, "frontend": {"done": false}})
        );
        let replayed = StatePatch::from_value(&plan.patch)
            .unwrap()
            .apply(&state)
            .unwrap();
        assert_eq!(replayed, plan.new_state);
        assert_eq!(plan.state_hash, crate::json::state_hash(&plan.new_state));
        // A merge patch migrates too.
        let merge = json!({"plan": {"goal": null, "objective": "ship"}});
        assert_eq!(
            plan_board_upgrade(&state, Some(&merge), &renamed(), &members)
                .unwrap()
                .new_state,
            plan.new_state
        );
    }

    #[test]
    fn a_member_whose_pointer_the_new_schema_drops_refuses_it_by_name() {
        let state = json!({"plan": {"objective": "ship"}, "frontend": {}});
        let members = [
            member(
                BoardMember::Task("t1".into()),
                &["/plan", "/backend"],
                &["/backend"],
            ),
            member(
                BoardMember::Key("k1".into()),
                &["/plan/goal", "/frontend"],
                &[],
            ),
            member(BoardMember::Key("k2".into()), &[""], &["/frontend"]),
        ];
        let refusal = plan_board_upgrade(&state, None, &renamed(), &members).unwrap_err();
        assert!(refusal.rejections.is_empty(), "{:?}", refusal.rejections);
        let named: Vec<(String, &str, &str)> = refusal
            .scopes
            .iter()
            .map(|r| (r.member.to_string(), r.list, r.pointer.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                ("task t1".to_owned(), "reads", "/backend"),
                ("task t1".to_owned(), "writes", "/backend"),
                ("API key k1".to_owned(), "reads", "/plan/goal"),
            ]
        );
        let text = refusal.scopes[2].to_string();
        assert!(
            text.contains("API key k1") && text.contains("\"/plan/goal\""),
            "{text}"
        );
    }

    #[test]
    fn a_migration_that_breaks_the_new_schema_is_refused_with_every_pointer() {
        let state = json!({"plan": {"goal": "ship"}, "frontend": {}});
        // No migration: `goal` is left where the new schema has no place for it.
        let refusal = plan_board_upgrade(&state, None, &renamed(), &[]).unwrap_err();
        assert!(!refusal.rejections.is_empty());
        assert!(
            refusal
                .rejections
                .iter()
                .all(|r| r.pointer.starts_with("/plan")),
            "{:?}",
            refusal.rejections
        );
        // One that does not apply names where.
        let bad = json!([{"op": "remove", "path": "/missing"}]);
        let refusal = plan_board_upgrade(&state, Some(&bad), &renamed(), &[]).unwrap_err();
        assert_eq!(refusal.rejections[0].kind, RejectionKind::PatchApply);
        assert!(
            refusal.rejections[0].message.contains("the migration"),
            "{}",
            refusal.rejections[0]
        );
    }

    #[test]
    fn a_read_only_value_the_board_holds_stays() {
        let read_only = schema(json!({
            "type": "object",
            "properties": {"goal": {"type": "string", "readOnly": true}}
        }));
        let state = json!({"goal": "ship"});
        let refusal = plan_board_upgrade(&state, Some(&json!({"goal": "other"})), &read_only, &[])
            .unwrap_err();
        assert_eq!(refusal.rejections[0].kind, RejectionKind::ReadOnly);
        assert_eq!(refusal.rejections[0].pointer, "/goal");
        // A read-only location the board does not hold yet may be set.
        let plan =
            plan_board_upgrade(&json!({}), Some(&json!({"goal": "set"})), &read_only, &[]).unwrap();
        assert_eq!(plan.new_state, json!({"goal": "set"}));
    }
}
