//! What the CLI shows of a task: never the values its state schema marks `"writeOnly": true`
//! (docs/skills.md, "Secrets in state"). States and patches show them as `[redacted]`; free text (a
//! prompt, an observation, a tool's result, an outcome, a rejection) loses every write-only
//! value the task's kept history holds; hashes of a content that held one are withheld.

use std::borrow::Cow;

use serde_json::Value;
use skillstate_core::{SecretValues, WriteOnly};
use skillstate_store::{JournalEntry, Store, TaskRecord, member_board_secrets, state_at};

pub struct Hidden {
    write_only: WriteOnly,
    secrets: SecretValues,
}

impl Hidden {
    /// The task's write-only locations and the write-only values of its current state.
    pub fn of_task(task: &TaskRecord) -> Self {
        let write_only = WriteOnly::of_schema(&task.skill.schema);
        let secrets = write_only.secrets_of(&task.state);
        Self {
            write_only,
            secrets,
        }
    }

    /// `of_task`, plus the write-only values of the initial state (while kept) and of every
    /// answer's patch, accepted or rejected, and for a board member its board's
    /// (`member_board_secrets`). `journal` when the caller has read it already.
    pub async fn of_history(
        store: &dyn Store,
        task: &TaskRecord,
        journal: Option<&[JournalEntry]>,
    ) -> anyhow::Result<Self> {
        let mut hidden = Self::of_task(task);
        let member = store.task_board(&task.id).await?.is_some();
        if !member && hidden.write_only.is_empty() {
            return Ok(hidden);
        }
        let read;
        let journal = match journal {
            Some(journal) => journal,
            None => {
                read = store.journal(&task.id).await?;
                &read
            }
        };
        // A board member's prompts show its board, write-only values included.
        if member && let Some(board) = member_board_secrets(store, &task.id, journal).await? {
            hidden.secrets.extend(&board);
        }
        if hidden.write_only.is_empty() {
            return Ok(hidden);
        }
        if let Ok(initial) = state_at(store, &task.id, 0, task.version).await {
            hidden.write_only.collect(&initial, &mut hidden.secrets);
        }
        for entry in journal {
            hidden.write_only.collect_answer(
                entry.patch.as_ref(),
                &entry.output,
                &mut hidden.secrets,
            );
        }
        Ok(hidden)
    }

    /// Whether the task holds write-only values: then hashes of its states and prompts are
    /// not printed (a short secret could be found by hashing guesses).
    pub fn hides_values(&self) -> bool {
        !self.secrets.is_empty()
    }

    pub fn state(&self, mut state: Value) -> Value {
        self.write_only.redact(&mut state);
        state
    }

    pub fn patch(&self, mut patch: Value) -> Value {
        self.write_only.redact_patch(&mut patch);
        patch
    }

    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        self.secrets.scrub(text)
    }

    /// A value that is not state (arguments, an outcome): every string cleaned, a number that
    /// is a secret replaced.
    pub fn json(&self, mut value: Value) -> Value {
        self.secrets.scrub_json(&mut value);
        value
    }
}

/// A task's outcome as printed: cleaned of the write-only values of the task's current state
/// (a `finish` result or an approval's arguments may quote one). Unchanged when the task
/// cannot be read.
pub async fn shown_outcome(
    store: &dyn Store,
    task_id: &str,
    outcome: Option<&Value>,
) -> Option<Value> {
    let outcome = outcome?.clone();
    match store.task(task_id).await {
        Ok(task) => Some(Hidden::of_task(&task).json(outcome)),
        Err(_) => Some(outcome),
    }
}
