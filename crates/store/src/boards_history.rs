//! Time travel on a board: the state at any version rebuilt from the newest snapshot at or
//! before it (or the initial state) plus the journal's patches after it, the snapshot's hash
//! and every replayed write's recorded state hash checked on the way. Snapshots are written
//! every `snapshot_every` versions (`Boards::commit_board_write`), so a rebuild replays at most
//! that many writes whatever the board's age.

use serde_json::Value;
use skillstate_core::board::board_part;
use skillstate_core::json::state_hash;
use skillstate_core::{SecretValues, StatePatch, WriteOnly};

use crate::{Result, Store, StoreError};

/// The state of `board` (full id) at `version` (0 = the initial state), rebuilt from its
/// newest snapshot at or before `version` and the journal after it. `NoSuchBoardVersion`
/// beyond the newest version; `BoardCorrupt`, naming the version, when a write is missing, its
/// patch no longer applies, the state it gives hashes otherwise than recorded, or the snapshot
/// does not hash to the state hash its version's journal row records.
pub async fn board_state_at(store: &dyn Store, board: &str, version: u64) -> Result<Value> {
    rebuild(store, board, version, true).await
}

/// The state of `board` at `version` replayed from the initial state through every write of
/// its journal, snapshots ignored: a check of the whole journal (every recorded hash), for
/// benchmarks and audits. Errors as [`board_state_at`]'s.
pub async fn board_state_replayed(store: &dyn Store, board: &str, version: u64) -> Result<Value> {
    rebuild(store, board, version, false).await
}

async fn rebuild(
    store: &dyn Store,
    board: &str,
    version: u64,
    from_snapshot: bool,
) -> Result<Value> {
    let current = store.board(board, None).await?;
    if version > current.version {
        return Err(StoreError::NoSuchBoardVersion {
            board: current.id,
            version,
            current: current.version,
        });
    }
    if version == 0 {
        return store.board_initial_state(&current.id).await;
    }
    let corrupt = |at: u64, message: String| StoreError::BoardCorrupt {
        board: current.id.clone(),
        version: at,
        message,
    };
    let snapshot = match from_snapshot {
        true => store
            .board_snapshot_at_or_before(&current.id, version)
            .await?
            .filter(|(at, _)| *at > 0),
        false => None,
    };
    let (base, mut state) = match snapshot {
        Some(snapshot) => snapshot,
        // No snapshot yet (or a board written before snapshots existed): from the start.
        None => (0, store.board_initial_state(&current.id).await?),
    };
    // From the snapshot's own row (its recorded hash), or from write 1.
    let mut writes = store
        .board_writes(&current.id, base.max(1), version)
        .await?
        .into_iter()
        .peekable();
    if base > 0 {
        let Some(row) = writes.next_if(|write| write.version == base) else {
            return Err(corrupt(
                base,
                "a snapshot is stored for this version but no journal row".into(),
            ));
        };
        let actual = state_hash(&state);
        if actual != row.state_hash {
            return Err(corrupt(
                base,
                format!(
                    "the stored snapshot hashes to {actual}, not to the recorded {}; the snapshot \
                     was changed outside skillstate (deleting its board_snapshots row makes this \
                     version rebuild from the journal)",
                    row.state_hash
                ),
            ));
        }
    }
    let mut expected = base + 1;
    for write in writes {
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

/// The schema of `board` (full id) in effect at `version` (0 = as created): the newest of its
/// history (`Boards::board_schemas`) from `version` or before. `NoSuchBoardVersion` beyond the
/// newest version; `BoardCorrupt` when the history holds no schema from version 0.
pub async fn board_schema_at(store: &dyn Store, board: &str, version: u64) -> Result<Value> {
    let current = store.board(board, None).await?;
    if version > current.version {
        return Err(StoreError::NoSuchBoardVersion {
            board: current.id,
            version,
            current: current.version,
        });
    }
    store
        .board_schemas(&current.id)
        .await?
        .into_iter()
        .rev()
        .find(|schema| schema.from_version <= version)
        .map(|schema| schema.schema)
        .ok_or_else(|| StoreError::BoardCorrupt {
            board: current.id.clone(),
            version,
            message: "no schema is recorded for this version (board_schemas lacks its row for \
                      version 0)"
                .into(),
        })
}

/// The write-only values (of its board's schema) that a board member's history may show: its
/// prompts mount the board, write-only values included, and its answers may write some. Those
/// of the board's initial state and of every write to it (by whichever writer), and those the
/// member's answers in `journal` wrote on the board, accepted or not. `None` for a task that is
/// not a member, or whose board's schema marks nothing write-only. Readers of a task's history
/// (the service, `skillstate show`) clean its texts of these as of the task's own.
pub async fn member_board_secrets(
    store: &dyn Store,
    task: &str,
    journal: &[crate::JournalEntry],
) -> Result<Option<SecretValues>> {
    let Some(board) = store.task_board(task).await? else {
        return Ok(None);
    };
    let record = match store.board(&board, None).await {
        Ok(record) => record,
        Err(StoreError::NoSuchBoard(_)) => return Ok(None),
        Err(other) => return Err(other),
    };
    // Whatever any schema of the board's history marked write-only stays hidden: a value a
    // member's prompt once showed under an older schema may be in its history.
    let schemas: Vec<WriteOnly> = store
        .board_schemas(&record.id)
        .await?
        .iter()
        .map(|schema| WriteOnly::of_schema(&schema.schema))
        .filter(|write_only| !write_only.is_empty())
        .collect();
    if schemas.is_empty() {
        return Ok(None);
    }
    let initial = store.board_initial_state(&record.id).await?;
    let writes = store.board_writes(&record.id, 1, record.version).await?;
    let answers: Vec<Value> = journal
        .iter()
        .filter_map(|entry| match skillstate_core::parse_output(&entry.output) {
            Ok(parsed) => board_part(&parsed.state_patch),
            Err(_) => serde_json::from_str::<Value>(entry.output.trim())
                .ok()
                .and_then(|answer| answer.get("state_patch").and_then(board_part)),
        })
        .collect();
    let mut secrets = SecretValues::default();
    for write_only in &schemas {
        write_only.collect(&record.state, &mut secrets);
        write_only.collect(&initial, &mut secrets);
        for write in &writes {
            write_only.collect_patch(&write.patch, &mut secrets);
        }
        for patch in &answers {
            write_only.collect_patch(patch, &mut secrets);
        }
    }
    Ok(Some(secrets))
}
