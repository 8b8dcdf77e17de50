//! Recall over a task's journal (docs/recall.md, "Recall and provenance"): the built-in `recall` tool a
//! skill enables with `[tools] allow = ["recall"]`, and the one reader every search goes
//! through — the tool, `skillstate search` and the service's `GET /v1/tasks/{id}/journal?q=`.
//!
//! The store finds entries (`Journal::search_journal`); what of them is shown is decided only
//! here, by core's `RawHit::reveal` with the task's write-only locations and every write-only
//! value its history holds (the initial and current state, each write at a write-only location
//! the index holds, a board member's board values): no write-only value is ever shown, and a
//! hit that matched only through one is dropped.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use skillstate_core::recall::{
    HitCursor, HitReader, RECALL_TOOL, RecallHit, RecallQuery, recall_spec, render_hits,
};
use skillstate_core::{SecretValues, ToolSpec, WriteOnly};
use skillstate_store::{Store, StoreError, TaskRecord, member_board_secrets};
use skillstate_tools::{CallContext, Tool, ToolError, ToolOutput};
use tokio::sync::Mutex;

/// Raw entries read per round trip while looking for hits a reader may see.
const PAGE: usize = 64;
/// Round trips one search makes at most; a search that found fewer hits than asked by then
/// says more may exist (its cursor continues).
const MAX_PAGES: usize = 16;

/// One page of a search, as one reader may see it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecallPage {
    pub hits: Vec<RecallHit>,
    /// Where the next page starts, when there may be more.
    pub next: Option<HitCursor>,
}

/// What one reader may see of one task's recalled entries.
pub struct RecallReader {
    write_only: WriteOnly,
    secrets: SecretValues,
    /// Steps whose write-only state writes are known (`secrets` holds their values).
    known_to: u64,
}

impl RecallReader {
    /// The reader of `task`'s own history, knowing every write-only value it holds up to its
    /// current version.
    pub async fn of_task(store: &dyn Store, task: &TaskRecord) -> Result<Self, StoreError> {
        let write_only = WriteOnly::of_schema(&task.skill.schema);
        let mut secrets = write_only.secrets_of(&task.state);
        write_only.collect(&task.skill.initial_state, &mut secrets);
        if store.task_board(&task.id).await?.is_some() {
            let journal = store.journal(&task.id).await?;
            if let Some(board) = member_board_secrets(store, &task.id, &journal).await? {
                secrets.extend(&board);
            }
        }
        let mut reader = Self {
            write_only,
            secrets,
            known_to: 0,
        };
        reader.learn(store, &task.id, task.version).await?;
        Ok(reader)
    }

    /// Adds the write-only values that steps after the last known one, up to `step`, wrote.
    async fn learn(&mut self, store: &dyn Store, task: &str, step: u64) -> Result<(), StoreError> {
        if self.write_only.is_empty() || step <= self.known_to {
            self.known_to = self.known_to.max(step);
            return Ok(());
        }
        let query = RecallQuery {
            pointer: Some(String::new()),
            kinds: vec![skillstate_core::recall::RecallKind::State],
            from_step: Some(self.known_to + 1),
            to_step: Some(step),
            oldest_first: true,
            limit: 500,
            ..RecallQuery::default()
        };
        let mut after = None;
        loop {
            let page = store.search_journal(task, &query, after, 500).await?;
            for hit in &page {
                hit.collect_write_only(&self.write_only, &mut self.secrets);
            }
            match page.last() {
                Some(last) if page.len() == 500 => {
                    after = Some(HitCursor {
                        step: last.step,
                        id: last.id,
                    })
                }
                _ => break,
            }
        }
        self.known_to = step;
        Ok(())
    }

    /// Up to `limit` hits of `query` this reader may see, after `after`.
    pub async fn search(
        &self,
        store: &dyn Store,
        task: &str,
        query: &RecallQuery,
        after: Option<HitCursor>,
        limit: usize,
    ) -> Result<RecallPage, StoreError> {
        let reader = HitReader {
            write_only: &self.write_only,
            secrets: &self.secrets,
            words: &query.word_tokens,
        };
        let mut hits = Vec::new();
        let mut cursor = after;
        for _ in 0..MAX_PAGES {
            let raw = store.search_journal(task, query, cursor, PAGE).await?;
            let exhausted = raw.len() < PAGE;
            for hit in raw {
                cursor = Some(HitCursor {
                    step: hit.step,
                    id: hit.id,
                });
                if let Some(shown) = hit.reveal(&reader) {
                    hits.push(shown);
                    if hits.len() > limit {
                        hits.truncate(limit);
                        let last = &hits[limit - 1];
                        return Ok(RecallPage {
                            next: Some(HitCursor {
                                step: last.step,
                                id: last.id,
                            }),
                            hits,
                        });
                    }
                }
            }
            if exhausted {
                return Ok(RecallPage { hits, next: None });
            }
        }
        Ok(RecallPage { hits, next: cursor })
    }
}

/// The tools a skill may choose from in `env`'s world: the environment's own and `recall`
/// (unbound: a task's runner binds it to the task's journal, [`with_recall`]).
pub fn available_tools(env_tools: Vec<Arc<dyn Tool>>) -> Vec<Arc<dyn Tool>> {
    let mut tools = env_tools;
    tools.push(Arc::new(RecallTool::unbound()));
    tools
}

/// `env_tools`, plus the `recall` tool bound to `task`'s journal when the task was created
/// with it.
pub fn with_recall(
    env_tools: Vec<Arc<dyn Tool>>,
    store: &Arc<dyn Store>,
    task: &TaskRecord,
) -> Vec<Arc<dyn Tool>> {
    let mut tools = env_tools;
    if task
        .tools
        .iter()
        .any(|t| t.name == RECALL_TOOL && t.source == RECALL_TOOL)
    {
        tools.push(Arc::new(RecallTool {
            spec: recall_spec(),
            bound: Some(Bound {
                store: store.clone(),
                task: task.clone(),
                budget: task.skill.settings.budgets.recall_tokens,
                reader: Mutex::new(None),
            }),
        }));
    }
    tools
}

/// The built-in `recall` tool.
pub struct RecallTool {
    spec: ToolSpec,
    bound: Option<Bound>,
}

struct Bound {
    store: Arc<dyn Store>,
    task: TaskRecord,
    budget: usize,
    /// Built on the first call, then kept up to date step by step.
    reader: Mutex<Option<RecallReader>>,
}

impl RecallTool {
    fn unbound() -> Self {
        Self {
            spec: recall_spec(),
            bound: None,
        }
    }
}

#[async_trait]
impl Tool for RecallTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let Some(bound) = &self.bound else {
            return Ok(ToolOutput::failure(
                "Error: recall is not bound to a task here; it runs only inside a task's run.",
            ));
        };
        let query = match RecallQuery::from_args(args) {
            Ok(query) => query,
            Err(problem) => {
                return Ok(ToolOutput::failure(format!(
                    "Error: recall's argument {}: {}",
                    problem.field, problem.message
                )));
            }
        };
        // The steps before the one asking: its own reasoning and writes would only echo the
        // question.
        let before = ctx.step.saturating_sub(1);
        let query = query.up_to(before);
        let limit = query.limit;
        let failed = |error: StoreError| ToolError::Failed {
            tool: RECALL_TOOL.into(),
            message: format!("cannot read the journal: {error}"),
        };
        let mut reader = bound.reader.lock().await;
        let reader = match reader.as_mut() {
            Some(reader) => reader,
            None => reader.insert(
                RecallReader::of_task(bound.store.as_ref(), &bound.task)
                    .await
                    .map_err(failed)?,
            ),
        };
        reader
            .learn(bound.store.as_ref(), &ctx.task_id, before)
            .await
            .map_err(failed)?;
        if before == 0 {
            return Ok(ToolOutput::success(render_hits(
                &query,
                &[],
                false,
                bound.budget,
            )));
        }
        let page = reader
            .search(bound.store.as_ref(), &ctx.task_id, &query, None, limit)
            .await
            .map_err(failed)?;
        // The query is echoed in the first line: it too never shows a write-only value.
        let text = render_hits(&query, &page.hits, page.next.is_some(), bound.budget);
        Ok(ToolOutput::success(
            reader.secrets.scrub(&text).into_owned(),
        ))
    }
}
