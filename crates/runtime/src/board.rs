//! A task attached to a board (docs/boards.md, "Several agents, one state"): each attempt's prompt
//! shows the newest board through the skill's reads, mounted at `/board` of the shown state;
//! the answer's board part commits in one transaction with the step, on top of the version the
//! prompt showed — or, when others wrote since, rebased onto the newest version if the
//! locations it touches did not change (core's `board::rebase`), and otherwise refused with a
//! conflict the model sees at its next attempt, with the fresh values. Each attempt reads the
//! board's schema with its state: a board's schema may change while a member runs (`board
//! upgrade`, a write of its own), and an answer is checked against the schema in effect at the
//! version it is committed on.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use skillstate_core::StateSchema;
use skillstate_core::board::{
    BoardChange, BoardScope, Conflict, apply_board, conflict_rejections, mount_is_free, mounted,
    rebase,
};
use skillstate_core::secrets::Redactor;
use skillstate_core::validate::Rejection;
use skillstate_store::{
    BoardAuthor, BoardRecord, BoardWrite, LeasedWrite, StepCommit, Store, StoreError, TaskRecord,
};

use crate::RuntimeError;
use crate::lease::TaskWriter;

/// How often a commit whose board moved on is rebased and tried again before the answer is
/// refused as a conflict. Each try rebases onto a newer version, and every failed try means
/// another writer's commit landed, so the board as a whole always progresses; but one writer
/// among N may lose several rounds in a row (with SQLite's group commit, one board write per
/// group wins and the others see `BoardMoved`): at 8 writers, 16 tries lost about one write in
/// nine to exhaustion in the board benchmark. At 256 the chance is below 1e-14 per write.
const COMMIT_TRIES: usize = 256;

/// The board a task is attached to, as its runner needs it.
pub(crate) struct BoardFrame {
    pub(crate) id: String,
    /// The member task, for messages.
    task: String,
    /// The board's schema as last read, compiled; a board's schema may change (`board
    /// upgrade`) while a member runs, so every read compares it with the stored one.
    schema: Mutex<Arc<StateSchema>>,
    pub(crate) scope: BoardScope,
}

/// The board one attempt's prompt showed.
pub(crate) struct BoardSeen {
    pub(crate) version: u64,
    pub(crate) state: Value,
    /// The board's schema at that version: what an answer computed on it is checked against.
    pub(crate) schema: Arc<StateSchema>,
}

/// How a step with a board part ended at the store.
pub(crate) enum BoardCommitted {
    /// Committed (on top of the version shown, or rebased onto a newer one).
    Done,
    /// Refused: the answer met others' writes, or no longer passes the board's schema on the
    /// newest version. The rejections, pointed into the shown state, go to the next attempt.
    Refused(Vec<Rejection>),
}

/// A board's stored schema, compiled; a schema that no longer compiles is the stored task's
/// problem (its runner cannot check its answers).
fn compile_stored(board: &BoardRecord, task: &str) -> Result<StateSchema, RuntimeError> {
    StateSchema::compile(board.schema.clone()).map_err(|defect| RuntimeError::StoredTask {
        task: task.to_owned(),
        message: format!(
            "board {}: its stored schema at {}: {}",
            board.name,
            skillstate_core::json::pointer_for_humans(&defect.pointer, "schema"),
            defect.message
        ),
    })
}

impl BoardFrame {
    /// The board `task` is attached to, if any, with its compiled schema and the skill's scope.
    pub(crate) async fn of(
        store: &dyn Store,
        task: &TaskRecord,
        scope: Option<&BoardScope>,
    ) -> Result<Option<Self>, RuntimeError> {
        let Some(board_id) = store.task_board(&task.id).await? else {
            return Ok(None);
        };
        let stored = |message: String| RuntimeError::StoredTask {
            task: task.id.clone(),
            message,
        };
        let scope = scope.cloned().ok_or_else(|| {
            stored(format!(
                "the task is attached to board {board_id}, but its skill `{}` has no [board] table in skill.toml; declare what it reads and writes (reads = [\"/part\"], writes = [\"/part/mine\"])",
                task.skill.name
            ))
        })?;
        if !mount_is_free(&task.state) {
            return Err(stored(
                "the task's own state has a top-level `board` member, where the board is shown; rename it in the skill's state schema".into(),
            ));
        }
        let board = store.board(&board_id, None).await?;
        let schema = compile_stored(&board, &task.id)?;
        Ok(Some(Self {
            id: board.id,
            task: task.id.clone(),
            schema: Mutex::new(Arc::new(schema)),
            scope,
        }))
    }

    /// The board as it stands now, with the schema in effect (compiled again only when it
    /// changed since the last read).
    pub(crate) async fn read(&self, store: &dyn Store) -> Result<BoardSeen, RuntimeError> {
        let board = store.board(&self.id, None).await?;
        let known = self.current_schema();
        let schema = if known.document() == &board.schema {
            known
        } else {
            let fresh = Arc::new(compile_stored(&board, &self.task)?);
            *self.schema.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
            fresh
        };
        Ok(BoardSeen {
            version: board.version,
            state: board.state,
            schema,
        })
    }

    fn current_schema(&self) -> Arc<StateSchema> {
        self.schema
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Commits `commit` (the task's step, at `task_version`) with `change`, computed on
    /// `seen`, in one transaction; rebases onto newer versions as the rule allows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn commit(
        &self,
        writer: &TaskWriter<'_>,
        task: &str,
        task_version: u64,
        commit: &StepCommit,
        seen: &BoardSeen,
        change: &BoardChange,
        secrets: &Redactor,
    ) -> Result<BoardCommitted, RuntimeError> {
        let step = commit.entry.step;
        let mut target_version = seen.version;
        let mut write = BoardWrite {
            patch: change.patch.to_value(),
            new_state: change.new_state.clone(),
            state_hash: change.state_hash.clone(),
            author: BoardAuthor::Task {
                task: task.to_owned(),
                step,
            },
            rebased_from: None,
        };
        for _ in 0..COMMIT_TRIES {
            let written = writer
                .write(
                    task,
                    LeasedWrite::StepWithBoard {
                        expected_task_version: task_version,
                        commit,
                        board: &self.id,
                        expected_board_version: target_version,
                        write: &write,
                    },
                )
                .await;
            match written {
                Ok(_) => {
                    if write.rebased_from.is_some() {
                        crate::metrics::board_rebased();
                    }
                    crate::metrics::board_written();
                    return Ok(BoardCommitted::Done);
                }
                Err(RuntimeError::Store(StoreError::BoardMoved { .. })) => {}
                Err(other) => return Err(other),
            }
            let newest = self.read(writer.store).await?;
            match rebase(&change.patch, &seen.state, &newest.state) {
                // Checked against the schema in effect at the newest version (a schema change
                // is a write of its own, so a board whose schema changed moved on too).
                Ok(rebased) => match apply_board(
                    &newest.schema,
                    &rebased.patch,
                    &newest.state,
                    &newest.schema.view_of(&self.scope.reads),
                ) {
                    Ok(applied) => {
                        write.patch = applied.patch.to_value();
                        write.new_state = applied.new_state;
                        write.state_hash = applied.state_hash;
                        write.rebased_from = Some(seen.version);
                        target_version = newest.version;
                    }
                    Err(problems) => {
                        crate::metrics::board_conflicted();
                        return Ok(BoardCommitted::Refused(
                            problems.into_iter().map(mounted).collect(),
                        ));
                    }
                },
                Err(conflict) => {
                    crate::metrics::board_conflicted();
                    return Ok(BoardCommitted::Refused(
                        self.conflict(&conflict, &newest, secrets),
                    ));
                }
            }
        }
        crate::metrics::board_conflicted();
        let newest = self.read(writer.store).await?;
        let everything = Conflict {
            pointers: skillstate_core::board::touched(&change.patch),
            fresh: Value::Null,
        };
        Ok(BoardCommitted::Refused(self.conflict(
            &everything,
            &newest,
            secrets,
        )))
    }

    fn conflict(
        &self,
        conflict: &Conflict,
        newest: &BoardSeen,
        secrets: &Redactor,
    ) -> Vec<Rejection> {
        conflict_rejections(
            conflict,
            &newest.state,
            &self.scope,
            &newest.schema,
            secrets,
        )
    }
}
