//! Time travel on a board: the state at any version rebuilt from the initial state plus the
//! journal's patches, every recorded state hash checked on the way.

use serde_json::Value;
use skillstate_core::StatePatch;
use skillstate_core::json::state_hash;

use crate::{Result, Store, StoreError};

/// The state of `board` (full id) at `version` (0 = the initial state), rebuilt from its
/// journal. `NoSuchBoardVersion` beyond the newest version; `BoardCorrupt`, naming the version,
/// when a write is missing, its patch no longer applies or the state it gives hashes otherwise
/// than recorded.
pub async fn board_state_at(store: &dyn Store, board: &str, version: u64) -> Result<Value> {
    let current = store.board(board, None).await?;
    if version > current.version {
        return Err(StoreError::NoSuchBoardVersion {
            board: current.id,
            version,
            current: current.version,
        });
    }
    let mut state = store.board_initial_state(&current.id).await?;
    if version == 0 {
        return Ok(state);
    }
    let corrupt = |at: u64, message: String| StoreError::BoardCorrupt {
        board: current.id.clone(),
        version: at,
        message,
    };
    let mut expected = 1;
    for write in store.board_writes(&current.id, 1, version).await? {
        if write.version != expected {
            return Err(corrupt(expected, "no journal row for this version".into()));
        }
        let patch = StatePatch::from_value(&write.patch).map_err(|p| {
            corrupt(
                write.version,
                format!("stored patch is malformed: {}", p.message),
            )
        })?;
        state = patch.apply(&state).map_err(|p| {
            corrupt(
                write.version,
                format!(
                    "stored patch no longer applies at {}: {}",
                    p.pointer, p.message
                ),
            )
        })?;
        let actual = state_hash(&state);
        if actual != write.state_hash {
            return Err(corrupt(
                write.version,
                format!(
                    "rebuilt state hash {actual} differs from the recorded {}",
                    write.state_hash
                ),
            ));
        }
        expected += 1;
    }
    if expected != version + 1 {
        return Err(corrupt(expected, "no journal row for this version".into()));
    }
    Ok(state)
}
