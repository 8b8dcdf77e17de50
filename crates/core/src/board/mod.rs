//! Boards: one shared state that several tasks read and write, each through the scope its
//! skill declares in skill.toml (`[board] reads = [...]`, `writes = [...]`). This module is the
//! pure core of it — scopes, projection, the write check, touched locations and rebase; the
//! store and the runtime build on it.
//!
//! # Concurrent writes: the rule
//!
//! A writer's patch P was computed on board version `base`; others committed since, giving
//! `newest`. P *touches* these locations ([`touches`]):
//! - it **writes** the location of each merge-patch member whose value is `null` (delete) or
//!   not an object (replace), and each JSON Patch `add`, `remove`, `replace`, `copy` target and
//!   both ends of a `move`;
//! - it **merges into** the location of each merge-patch member whose value is an object (only
//!   that object's own members are written);
//! - it **reads** a `copy`'s `from` and a `test`'s `path`.
//!
//! A location *changed* when its value in `newest` differs from its value in `base` — absent ↔
//! present counts, and so does any difference anywhere below it. P **conflicts** at:
//! 1. every location it writes or reads that changed;
//! 2. every location it merges into, and every proper ancestor of a location it touches, that
//!    changed and is not an object in `newest` that was an object (or absent) in `base` — that
//!    is, an ancestor deleted, replaced by a non-object, or an array. So an array is one
//!    location: any change anywhere in it conflicts with a write anywhere in it, while two
//!    writers of different members of one object never conflict.
//!
//! Without a conflict, P applies to `newest` unchanged ([`Rebased`]): every location it writes
//! gets the value it would have got on `base`, and everything else is as the others left it —
//! no lost update, no silent overwrite. With one, the answer is refused with a [`Conflict`]: the
//! conflicting locations (outermost only) and their fresh values in `newest`, for the writer to
//! recompute from.
//!
//! A writer may only touch its scope ([`check_writes`]): writes within `writes`, copies and
//! tests from within `reads`; every write pointer lies within a read pointer ([`BoardScope`]),
//! and the prompt shows exactly the reads ([`project`]).

mod pointer;
mod project;
mod rebase;
mod schema_scope;
mod scope;
mod step;
mod touch;
mod upgrade;
mod write_check;

pub use pointer::Pointer;
pub use project::{project, project_pointers};
pub use rebase::{Conflict, Rebased, rebase};
pub use schema_scope::{project_schema, undeclared};
pub use scope::{BoardScope, BoardTable, ScopeList, ScopeProblem};
pub use step::{
    BoardChange, BoardRules, MOUNT, apply_board, board_part, conflict_rejections, join_problem,
    mount_is_free, mounted, mounted_view, validate_board_step,
};
pub use touch::{Touch, TouchKind, touched, touches};
pub use upgrade::{
    BOARD_STATE_TOKENS, BoardMember, BoardUpgradePlan, BoardUpgradeRefusal, MemberScope,
    ScopeRefusal, plan_board_upgrade, scope_refusals,
};
pub use write_check::check_writes;
