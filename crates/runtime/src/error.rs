//! What can stop the runtime (as opposed to a task failing, which is an outcome).

use skillstate_core::tool::CatalogError;
use skillstate_store::StoreError;
use skillstate_tools::EnvironmentError;

use crate::select::SelectError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Environment(#[from] EnvironmentError),
    #[error(transparent)]
    Tools(#[from] SelectError),
    #[error("the skill's tools cannot be offered: {0}")]
    Catalog(#[from] CatalogError),
    #[error("task {task}: {message}")]
    StoredTask { task: String, message: String },
    #[error(
        "{pointer:?} is not a JSON pointer into the state ({message}); write one such as /inventory/shelf_122, or \"\" for the whole state"
    )]
    BadPointer { pointer: String, message: String },
    #[error("task {task} needs tool `{tool}`, which this environment does not provide")]
    MissingTool { task: String, tool: String },
    /// The task cannot be continued as asked (finished, paused for a human, failed for a
    /// reason a retry cannot fix); the message says what to do instead.
    #[error("task {task}: {message}")]
    NotResumable { task: String, message: String },
    /// A task of this skill cannot join the board; nothing was stored.
    #[error("cannot join board `{board}`: {message}")]
    CannotJoin { board: String, message: String },
}
