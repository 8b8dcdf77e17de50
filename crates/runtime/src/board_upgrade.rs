//! A board's schema changing (`skillstate board upgrade`): the runtime's half of core's
//! `board::plan_board_upgrade`.
//!
//! The board's members are gathered from the store: every task attached to the board (its
//! skill's `[board]` table is its scope) and, for a board of a tenant, every key of that tenant
//! limited to board pointers that is not revoked (such a key reads and writes every board of its
//! tenant through its scope). The migration runs on the board's current state, the migrated
//! state passes the new schema's checks, and every member's pointers must still name something
//! in the new schema; every problem is reported at once, and nothing is written.
//!
//! Applied, the change is a write of its own in the board's journal (its author the caller's),
//! committed together with the new schema, which applies from that version on
//! (`Boards::commit_board_schema`): `board show --version N` and every read of a past version
//! use the schema in effect at it. The upgrade names the version it was planned against; a
//! board that moved on since is refused as stale and nothing is written (plan again).
//!
//! Without `apply` nothing is written: the answer is the plan (the migrated state's diff) or
//! the refusal, exactly as applying would give it then.

use crate::upgrade::Shown;
use serde::Serialize;
use serde_json::Value;
use skillstate_core::StateSchema;
use skillstate_core::board::{
    BoardMember, BoardScope, MemberScope, ScopeRefusal, plan_board_upgrade,
};
use skillstate_core::validate::Rejection;
use skillstate_store::{BoardAuthor, BoardRecord, BoardWrite, Store, StoreError};

/// One schema change of a board.
pub struct BoardUpgrade<'a> {
    /// The board's id, or its name among the boards of `tenant`.
    pub board: &'a str,
    pub tenant: Option<&'a str>,
    /// The new schema, compiled (the caller reports a schema that does not compile, with its
    /// file).
    pub schema: &'a StateSchema,
    /// A JSON Patch (array) or JSON merge patch (object) applied to the board's current state.
    pub migration: Option<&'a Value>,
    /// Who asks, recorded as the write's author.
    pub author: BoardAuthor,
    /// The version the upgrade was planned against (a dry run's `version`); `None`: the
    /// version the board is at when it is read.
    pub planned_at: Option<u64>,
    /// Commit it; otherwise only say what it would do.
    pub apply: bool,
}

/// What an upgrade did, or would do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardUpgraded {
    pub board: String,
    pub name: String,
    /// The version it was planned against.
    pub planned_at: u64,
    /// The version that records it (`applied`), or would.
    pub version: u64,
    /// RFC 6902 operations from the state before to the state after (empty: unchanged), as a
    /// report may show them: every value either schema marks write-only, and every write-only
    /// value of the state before wherever the migration put it, reads `"[redacted]"`. The
    /// journal keeps the real patch.
    pub diff: Value,
    /// The members whose scopes were checked.
    pub members: Vec<BoardMember>,
    /// Whether it was committed.
    pub applied: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BoardUpgradeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The migrated state fails the new schema's checks, or members' pointers name nothing in
    /// it; each problem with its pointer (and member).
    #[error(
        "board {name} cannot move to the new schema: {}",
        .rejections.iter().map(ToString::to_string)
            .chain(.scopes.iter().map(ToString::to_string))
            .collect::<Vec<_>>().join("; ")
    )]
    Refused {
        name: String,
        rejections: Vec<Rejection>,
        scopes: Vec<ScopeRefusal>,
    },
    /// The board took a write since the version the upgrade was planned against.
    #[error(
        "board {name} moved on to version {actual} since the upgrade was planned against version {planned}: plan it again (a dry run shows the new diff)"
    )]
    Stale {
        name: String,
        planned: u64,
        actual: u64,
    },
    /// A member's stored scope cannot be read, so it cannot be checked.
    #[error("board {name}: {member} cannot be checked: {message}")]
    Member {
        name: String,
        member: BoardMember,
        message: String,
    },
    /// The board already has this schema and the migration changes nothing.
    #[error(
        "board {name} already has this schema and the state stays as it is: nothing to upgrade"
    )]
    Unchanged { name: String },
}

/// The members of `board` with their scopes: attached tasks (their skills' `[board]` tables),
/// then the tenant's keys limited to board pointers, not revoked.
pub async fn board_member_scopes(
    store: &dyn Store,
    board: &BoardRecord,
) -> Result<Vec<MemberScope>, BoardUpgradeError> {
    let mut members = Vec::new();
    for task in store.board_members(&board.id).await? {
        let record = store.task(&task).await?;
        let member = BoardMember::Task(task);
        let Some(scope) = record.skill.settings.board.clone() else {
            return Err(BoardUpgradeError::Member {
                name: board.name.clone(),
                member,
                message: format!(
                    "its skill `{}` has no [board] table, so it cannot run on the board; delete the task or upgrade it to a version that declares its [board] reads and writes",
                    record.skill.name
                ),
            });
        };
        members.push(MemberScope { member, scope });
    }
    if let Some(tenant) = &board.tenant {
        for key in store.list_keys(Some(tenant)).await? {
            if key.revoked_at.is_some() {
                continue;
            }
            let member = BoardMember::Key(key.id.clone());
            match BoardScope::of_key(key.scopes.as_ref()) {
                Ok(Some(scope)) => members.push(MemberScope { member, scope }),
                // A key without limits reads and writes the whole board, whatever its schema.
                Ok(None) => {}
                Err(message) => {
                    return Err(BoardUpgradeError::Member {
                        name: board.name.clone(),
                        member,
                        message: format!(
                            "{message}; such a key is refused on every request: revoke it (skillstate keys revoke {})",
                            key.id
                        ),
                    });
                }
            }
        }
    }
    Ok(members)
}

/// Plans `upgrade` and, with `apply`, commits it.
pub async fn upgrade_board(
    store: &dyn Store,
    upgrade: &BoardUpgrade<'_>,
) -> Result<BoardUpgraded, BoardUpgradeError> {
    let board = store.board(upgrade.board, upgrade.tenant).await?;
    if let Some(planned) = upgrade.planned_at
        && planned != board.version
    {
        return Err(BoardUpgradeError::Stale {
            name: board.name,
            planned,
            actual: board.version,
        });
    }
    let members = board_member_scopes(store, &board).await?;
    let shown = Shown::between(&board.schema, &board.state, upgrade.schema.document());
    let plan = plan_board_upgrade(&board.state, upgrade.migration, upgrade.schema, &members)
        .map_err(|refusal| BoardUpgradeError::Refused {
            name: board.name.clone(),
            rejections: shown.rejections(refusal.rejections),
            scopes: refusal.scopes,
        })?;
    if plan.keeps_state() && &board.schema == upgrade.schema.document() {
        return Err(BoardUpgradeError::Unchanged { name: board.name });
    }
    let mut upgraded = BoardUpgraded {
        board: board.id.clone(),
        name: board.name.clone(),
        planned_at: board.version,
        version: board.version + 1,
        diff: shown.patch(&plan.patch),
        members: members.into_iter().map(|m| m.member).collect(),
        applied: false,
    };
    if !upgrade.apply {
        return Ok(upgraded);
    }
    let write = BoardWrite {
        patch: plan.patch,
        new_state: plan.new_state,
        state_hash: plan.state_hash,
        author: upgrade.author.clone(),
        rebased_from: None,
    };
    match store
        .commit_board_schema(&board.id, board.version, &write, upgrade.schema.document())
        .await
    {
        Ok(version) => {
            upgraded.version = version;
            upgraded.applied = true;
            Ok(upgraded)
        }
        Err(StoreError::BoardMoved { actual, .. }) => Err(BoardUpgradeError::Stale {
            name: board.name,
            planned: board.version,
            actual,
        }),
        Err(other) => Err(other.into()),
    }
}
