//! The step loop: observation → prompt → model → validate → commit → tool → next observation,
//! until `finish`, the step limit, the end of the environment's episode, or a failure (see
//! "How a step works" in docs/concepts.md).

mod act;
mod board;
pub mod board_upgrade;
mod drain;
mod error;
mod frame;
mod inbox;
pub use inbox::is_canceled;
mod lease;
mod lineage;
pub mod metrics;
mod pauses;
pub mod provenance;
mod rate;
pub mod recall;
mod recovery;
mod select;
pub mod spans;
mod state_write;
mod step;
mod step_loop;
mod task_start;
pub mod upgrade;
mod voice;
mod worker;
mod world;

pub use drain::Drain;
pub use error::RuntimeError;
pub use frame::{TaskFrame, rebuild_prompt};
pub use lease::LeasePolicy;
pub use lineage::{JournalCheck, fork_task, verify_journal};
pub use rate::SharedRateLimit;
pub use recall::{RecallPage, RecallReader, RecallTool, available_tools, with_recall};
pub use recovery::{check_continuity, is_retryable};
pub use select::{SelectError, select_tools};
pub use skillstate_providers::trace_context;
pub use state_write::{
    PatchCheck, StateWrite, StateWriteError, Written, check_patch_ahead, write_state,
    write_state_read,
};
pub use step_loop::Runner;
pub use task_start::{
    NoProgress, RunObserver, RunOutcome, TaskOptions, prepare_task, presented_tools,
    start_board_task, start_task,
};
pub use worker::{
    Backoff, HostedTask, StopLevel, TaskHost, WorkerEvent, WorkerOptions, WorkerStats,
    failure_text, run_worker,
};
