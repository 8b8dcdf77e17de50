//! What the API hides of a task: the values its state schema marks `"writeOnly": true`
//! (docs/skills.md, "Secrets in state"). Every response, event and problem that carries a state, a
//! patch or text derived from them goes through a [`Redaction`] of its task.
//!
//! States and patches are structured data: their write-only values read `[redacted]`, and
//! nothing else of them changes (a value the schema does not mark is not a secret). Free text
//! and values that are not state — a prompt, an observation, a model's raw answer, an action's
//! arguments, a tool's result, an outcome, an error message — lose every occurrence of every
//! write-only value the task's history holds ([`SecretValues`]). Hashes of a content with a
//! write-only value in it are withheld: a short secret could be found by hashing guesses.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;
use skillstate_core::json::canonical;
use skillstate_core::secrets::REDACTED;
use skillstate_core::write_only::mentions_write_only;
use skillstate_core::{SecretValues, WriteOnly};
use skillstate_store::{JournalEntry, Store, TaskRecord, member_board_secrets, state_at};

use crate::problem::ApiError;

/// Compiled write-only locations by schema (tasks of one skill share it), so a read does not
/// rebuild them. Bounded: emptied when full.
static COMPILED: LazyLock<Mutex<HashMap<String, Arc<WriteOnly>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
const MAX_COMPILED: usize = 256;

static NONE: LazyLock<Arc<WriteOnly>> = LazyLock::new(|| Arc::new(WriteOnly::none()));

/// The write-only locations of `schema`; a schema without `"writeOnly": true` costs one walk
/// of its document.
fn write_only_of(schema: &Value) -> Arc<WriteOnly> {
    if !mentions_write_only(schema) {
        return NONE.clone();
    }
    let key = canonical(schema);
    if let Ok(compiled) = COMPILED.lock()
        && let Some(found) = compiled.get(&key)
    {
        return found.clone();
    }
    let built = Arc::new(WriteOnly::of_schema(schema));
    if let Ok(mut compiled) = COMPILED.lock() {
        if compiled.len() >= MAX_COMPILED {
            compiled.clear();
        }
        compiled.insert(key, built.clone());
    }
    built
}

/// `state` (of a task whose state schema is `schema`) with its write-only values replaced:
/// what every response that is a state shows.
pub(crate) fn shown_state(schema: &Value, mut state: Value) -> Value {
    write_only_of(schema).redact(&mut state);
    state
}

/// What is shown of a board's history (earlier versions' states, its journal's patches, its
/// event stream): the write-only locations of every schema the board ever had, so a value a
/// schema hid stays hidden in the history whatever later schemas say. Its current state is
/// shown with its current schema.
#[derive(Clone)]
pub(crate) struct BoardHistory {
    schemas: Vec<Arc<WriteOnly>>,
}

impl BoardHistory {
    /// For `board` (its id), read from the store.
    pub(crate) async fn of(
        store: &dyn Store,
        board: &str,
    ) -> Result<Self, skillstate_store::StoreError> {
        let schemas = store
            .board_schemas(board)
            .await?
            .iter()
            .map(|record| write_only_of(&record.schema))
            .collect();
        Ok(Self { schemas })
    }

    /// Whether any schema of the history marks anything write-only: then hashes of its states
    /// are withheld.
    pub(crate) fn hides_values(&self) -> bool {
        self.schemas.iter().any(|w| !w.is_empty())
    }

    pub(crate) fn state(&self, mut state: Value) -> Value {
        for write_only in &self.schemas {
            write_only.redact(&mut state);
        }
        state
    }

    pub(crate) fn patch(&self, mut patch: Value) -> Value {
        for write_only in &self.schemas {
            write_only.redact_patch(&mut patch);
        }
        patch
    }
}

/// One task's write-only locations and the write-only values seen in its history.
#[derive(Clone)]
pub(crate) struct Redaction {
    write_only: Arc<WriteOnly>,
    secrets: SecretValues,
    /// Nothing is known of the task: every value and text is hidden.
    opaque: bool,
}

impl Redaction {
    /// A task whose schema cannot be read (it was deleted meanwhile, the store failed): every
    /// value of a state or patch, every text and every other value is hidden.
    pub(crate) fn unknown() -> Self {
        Self {
            write_only: Arc::new(WriteOnly::everything()),
            secrets: SecretValues::default(),
            opaque: true,
        }
    }

    /// The task's locations and the write-only values of its current state.
    pub(crate) fn of_task(task: &TaskRecord) -> Self {
        let write_only = write_only_of(&task.skill.schema);
        let secrets = write_only.secrets_of(&task.state);
        Self {
            write_only,
            secrets,
            opaque: false,
        }
    }

    /// The task's locations and the write-only values of its whole kept history: the current
    /// state, the initial state (while kept), and whatever every answer's patch wrote, accepted
    /// or not; for a board member, also its board's write-only values
    /// (`member_board_secrets`). `journal` when the caller has read it already.
    pub(crate) async fn of_history(
        store: &dyn Store,
        task: &TaskRecord,
        journal: Option<&[JournalEntry]>,
    ) -> Result<Self, ApiError> {
        let mut redaction = Self::of_task(task);
        let member = store.task_board(&task.id).await?.is_some();
        if !member && redaction.write_only.is_empty() {
            return Ok(redaction);
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
            redaction.secrets.extend(&board);
        }
        if redaction.write_only.is_empty() {
            return Ok(redaction);
        }
        // A compacted journal no longer has the initial state; its patches still count.
        if let Ok(initial) = state_at(store, &task.id, 0, task.version).await {
            redaction.add_state(&initial);
        }
        for entry in journal {
            redaction.write_only.collect_answer(
                entry.patch.as_ref(),
                &entry.output,
                &mut redaction.secrets,
            );
        }
        Ok(redaction)
    }

    /// `of_task` plus the write-only values `patch` writes (a write being checked).
    pub(crate) fn of_write(task: &TaskRecord, patch: &Value) -> Self {
        let mut redaction = Self::of_task(task);
        redaction.add_patch(patch);
        redaction
    }

    pub(crate) fn add_state(&mut self, state: &Value) {
        self.write_only.collect(state, &mut self.secrets);
    }

    pub(crate) fn add_patch(&mut self, patch: &Value) {
        self.write_only.collect_patch(patch, &mut self.secrets);
    }

    /// Whether anything of this task is hidden now: then hashes of its states and prompts are
    /// withheld too.
    pub(crate) fn hides_values(&self) -> bool {
        self.opaque || !self.secrets.is_empty()
    }

    pub(crate) fn state(&self, mut state: Value) -> Value {
        self.write_only.redact(&mut state);
        state
    }

    pub(crate) fn patch(&self, mut patch: Value) -> Value {
        self.write_only.redact_patch(&mut patch);
        patch
    }

    pub(crate) fn text(&self, text: String) -> String {
        if self.opaque {
            return REDACTED.to_owned();
        }
        match self.secrets.scrub(&text) {
            std::borrow::Cow::Owned(clean) => clean,
            std::borrow::Cow::Borrowed(_) => text,
        }
    }

    /// A JSON value that is not state (arguments, an outcome, errors): every string cleaned,
    /// a number that is a secret replaced.
    pub(crate) fn json(&self, mut value: Value) -> Value {
        if self.opaque && !value.is_null() {
            return Value::String(REDACTED.to_owned());
        }
        self.secrets.scrub_json(&mut value);
        value
    }

    /// `error` with its texts cleaned: a validation message may quote the value it refuses.
    pub(crate) fn error(&self, error: ApiError) -> ApiError {
        if !self.hides_values() {
            return error;
        }
        match error {
            ApiError::Invalid { detail, errors } => ApiError::Invalid {
                detail: self.text(detail),
                errors: errors.into_iter().map(|e| self.field(e)).collect(),
            },
            ApiError::BadRequest { detail, errors } => ApiError::BadRequest {
                detail: self.text(detail),
                errors: errors.into_iter().map(|e| self.field(e)).collect(),
            },
            ApiError::Conflict {
                detail,
                retry_after,
            } => ApiError::Conflict {
                detail: self.text(detail),
                retry_after,
            },
            ApiError::NotFound { detail } => ApiError::NotFound {
                detail: self.text(detail),
            },
            ApiError::Internal(message) => ApiError::Internal(self.text(message)),
            other => other,
        }
    }

    fn field(&self, mut error: crate::problem::FieldError) -> crate::problem::FieldError {
        error.message = self.text(error.message);
        error
    }
}
