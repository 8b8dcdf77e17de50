-- The step whose action result a task's environment checkpoint includes. A replayable
-- environment (a simulation) is checkpointed every few steps, not at every one: the runtime
-- restores the checkpoint and replays the journal's actions of the steps after it. NULL (rows
-- written before this column) means the checkpoint is as new as the task's last result.
ALTER TABLE tasks ADD COLUMN env_checkpoint_step BIGINT;
