//! The step loop (DESIGN.md §3): observation → prompt → model → validate → commit → tool →
//! next observation, until `finish`, the step limit, the end of the environment's episode, or
//! a failure.

mod lineage;
mod select;
mod step_loop;

pub use lineage::{JournalCheck, fork_task, verify_journal};
pub use select::{SelectError, select_tools};
pub use step_loop::{
    NoProgress, RunObserver, RunOutcome, Runner, RuntimeError, TaskOptions, rebuild_prompt,
    start_task,
};
