//! Provenance (docs/recall.md, "Recall and provenance"): why a task's state holds a value — the steps
//! that wrote it, each with its patch, the observation the model was answering and who wrote it
//! (the model, or the API key of a write through the service).
//!
//! Read from the journal itself (not the recall index): the state is replayed from the oldest
//! kept snapshot with every accepted patch, each checked against its recorded hash, so the
//! answer is as exact as time travel. Everything returned is redacted for the task's own
//! reader: write-only values never appear, in values, patches or observations.

use serde::Serialize;
use serde_json::Value;
use skillstate_core::board::{Pointer, touched};
use skillstate_core::json::state_hash;
use skillstate_core::{SecretValues, StatePatch, WriteOnly};
use skillstate_store::{Store, StoreError, TaskRecord, Verdict, member_board_secrets};

use crate::RuntimeError;

/// The most writes one answer lists (newest first); older ones are counted, not listed.
pub const MAX_WRITES: usize = 1000;

/// Why a location of a task's state holds what it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provenance {
    pub pointer: String,
    /// The value at `pointer` now (`None`: nothing is there).
    pub current: Option<Value>,
    /// The steps that wrote at, above or below `pointer`, newest first: without `all`, those
    /// since the value last changed (the write that set it, and any that wrote it again);
    /// with `all`, every one the journal keeps, up to [`MAX_WRITES`].
    pub writes: Vec<ProvenanceWrite>,
    /// Writes left out by [`MAX_WRITES`].
    pub older_writes: u64,
    /// The first step the journal still holds (older steps were compacted away).
    pub kept_from: u64,
}

/// One step that wrote a location.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProvenanceWrite {
    pub step: u64,
    /// The value at the pointer right after this step (`None`: nothing was there).
    pub value: Option<Value>,
    /// The step's whole patch.
    pub patch: Value,
    /// The observation the step answered.
    pub observation: Option<String>,
    pub author: Author,
    /// When the step was written (unix milliseconds).
    pub created_at: i64,
}

/// Who wrote a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Author {
    /// The model answering the task's prompt.
    Model { model: String },
    /// State written through the service with this API key (its id).
    ApiKey { key: String },
}

/// The provenance of `pointer` in `task`'s state.
pub async fn provenance(
    store: &dyn Store,
    task: &TaskRecord,
    pointer: &str,
    all: bool,
) -> Result<Provenance, RuntimeError> {
    let target = Pointer::parse(pointer).map_err(|message| RuntimeError::BadPointer {
        pointer: pointer.to_owned(),
        message,
    })?;
    let extent = store.journal_extent(&task.id).await?;
    let base = extent.base.unwrap_or(0);
    let (base, mut state) = store
        .snapshot_before(&task.id, base)
        .await?
        .ok_or_else(|| StoreError::Compacted {
            task: task.id.clone(),
            step: base,
        })?;
    let journal = store.journal(&task.id).await?;
    let reader = Reader::of(store, task, &journal).await?;

    let mut writes = Vec::new();
    let mut expected = base + 1;
    let mut last_hash = None;
    for entry in journal.iter().filter(|e| e.verdict == Verdict::Accepted) {
        if entry.step <= base {
            continue;
        }
        let corrupt = |message: String| StoreError::Corrupt {
            task: task.id.clone(),
            step: entry.step,
            message,
        };
        if entry.step != expected {
            return Err(corrupt("no accepted journal entry for this step".into()).into());
        }
        expected += 1;
        let raw = entry
            .patch
            .clone()
            .unwrap_or(Value::Object(Default::default()));
        let patch = StatePatch::from_value(&raw)
            .map_err(|p| corrupt(format!("stored patch is malformed: {}", p.message)))?;
        patch.apply_in_place(&mut state).map_err(|p| {
            corrupt(format!(
                "stored patch no longer applies at {}: {}",
                p.pointer, p.message
            ))
        })?;
        if touched(&patch).iter().any(|t| t.overlaps(&target)) {
            writes.push((entry, reader.value_in(&target, &state), raw));
        }
        last_hash = entry.state_hash.as_deref();
    }
    // The replay ends where the journal says it does (one hash for the whole chain: hashing
    // every step's state would make a long replay quadratic).
    if let Some(recorded) = last_hash
        && recorded != state_hash(&state)
    {
        return Err(StoreError::Corrupt {
            task: task.id.clone(),
            step: expected.saturating_sub(1),
            message: "the replayed state differs from the hash its step recorded".into(),
        }
        .into());
    }
    let current = reader.value_in(&target, &task.state);
    // Newest first; without `all`, from the newest back to the write that set today's value.
    writes.reverse();
    if !all
        && let Some(set) = writes
            .iter()
            .position(|(_, value, _)| *value != current)
            .map(|changed| changed.max(1))
    {
        writes.truncate(set);
    }
    let older_writes = writes.len().saturating_sub(MAX_WRITES) as u64;
    writes.truncate(MAX_WRITES);
    let mut shown = Vec::with_capacity(writes.len());
    for (entry, value, patch) in writes {
        let observation = store.observation(&task.id, entry.step).await?;
        shown.push(ProvenanceWrite {
            step: entry.step,
            value,
            patch: reader.patch(patch),
            observation: observation.map(|o| reader.text(&o)),
            author: match &entry.author {
                Some(key) => Author::ApiKey { key: key.clone() },
                None => Author::Model {
                    model: task.model.clone(),
                },
            },
            created_at: entry.created_at,
        });
    }
    Ok(Provenance {
        pointer: pointer.to_owned(),
        current,
        writes: shown,
        older_writes,
        kept_from: base + 1,
    })
}

/// What the task's own reader may see (the CLI's and the service's view of a task).
struct Reader {
    write_only: WriteOnly,
    secrets: SecretValues,
}

impl Reader {
    async fn of(
        store: &dyn Store,
        task: &TaskRecord,
        journal: &[skillstate_store::JournalEntry],
    ) -> Result<Self, RuntimeError> {
        let write_only = WriteOnly::of_schema(&task.skill.schema);
        let mut secrets = write_only.secrets_of(&task.state);
        write_only.collect(&task.skill.initial_state, &mut secrets);
        for entry in journal {
            write_only.collect_answer(entry.patch.as_ref(), &entry.output, &mut secrets);
        }
        if store.task_board(&task.id).await?.is_some()
            && let Some(board) = member_board_secrets(store, &task.id, journal).await?
        {
            secrets.extend(&board);
        }
        Ok(Self {
            write_only,
            secrets,
        })
    }

    /// The value at `target` in `state`, with what is write-only in it redacted.
    fn value_in(&self, target: &Pointer, state: &Value) -> Option<Value> {
        if self.write_only.is_empty() {
            return target.get(state).cloned();
        }
        let mut redacted = state.clone();
        self.write_only.redact(&mut redacted);
        target.get(&redacted).cloned()
    }

    fn patch(&self, mut patch: Value) -> Value {
        self.write_only.redact_patch(&mut patch);
        self.secrets.scrub_json(&mut patch);
        patch
    }

    fn text(&self, text: &str) -> String {
        self.secrets.scrub(text).into_owned()
    }
}
