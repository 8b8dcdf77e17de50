//! Time travel: rebuilding the state after any step from the nearest snapshot plus patches,
//! checking every recorded state hash on the way.

use serde_json::Value;
use skillstate_core::StatePatch;
use skillstate_core::json::state_hash;

use crate::{Result, Store, StoreError};

/// The state after `step` (0 = the initial state) of `task`, rebuilt from the journal.
pub async fn state_at(store: &dyn Store, task: &str, step: u64, version: u64) -> Result<Value> {
    if step > version {
        return Err(StoreError::NoSuchStep {
            task: task.to_owned(),
            step,
            version,
        });
    }
    let (base, mut state) =
        store
            .snapshot_before(task, step)
            .await?
            .ok_or_else(|| StoreError::Compacted {
                task: task.to_owned(),
                step,
            })?;

    let patches = store.accepted_patches(task, base + 1, step).await?;
    let mut expected_step = base + 1;
    for (at, patch, recorded_hash) in patches {
        if at != expected_step {
            return Err(StoreError::Corrupt {
                task: task.to_owned(),
                step: expected_step,
                message: "no accepted journal entry for this step".into(),
            });
        }
        state = apply(task, at, &state, &patch)?;
        let actual = state_hash(&state);
        if actual != recorded_hash {
            return Err(StoreError::Corrupt {
                task: task.to_owned(),
                step: at,
                message: format!(
                    "rebuilt state hash {actual} differs from the recorded {recorded_hash}"
                ),
            });
        }
        expected_step += 1;
    }
    if expected_step != step + 1 {
        return Err(StoreError::Corrupt {
            task: task.to_owned(),
            step: expected_step,
            message: "no accepted journal entry for this step".into(),
        });
    }
    Ok(state)
}

fn apply(task: &str, step: u64, state: &Value, patch: &Value) -> Result<Value> {
    let corrupt = |message: String| StoreError::Corrupt {
        task: task.to_owned(),
        step,
        message,
    };
    let patch = StatePatch::from_value(patch)
        .map_err(|p| corrupt(format!("stored patch is malformed: {}", p.message)))?;
    patch.apply(state).map_err(|p| {
        corrupt(format!(
            "stored patch no longer applies at {}: {}",
            p.pointer, p.message
        ))
    })
}
