-- The step whose action result a task's environment checkpoint includes. A replayable
-- environment (a simulation) is checkpointed every few steps, not at every one: the runtime
-- restores the checkpoint and replays the journal's actions of the steps after it. NULL (rows
-- written before this column) means the checkpoint is as new as the task's last result.
ALTER TABLE tasks ADD COLUMN env_checkpoint_step INTEGER;

-- A task's first recall entry, found at once: a word search reads the full-text index only
-- from there on (src/sqlite/recall.rs).
CREATE INDEX recall_entries_by_id ON recall_entries(task_id, id);
