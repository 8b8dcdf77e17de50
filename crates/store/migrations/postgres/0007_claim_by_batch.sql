-- A worker of a batch claims the oldest claimable task of that batch. With only
-- `tasks_claimable` (all queued tasks) and `tasks_by_batch` (all tasks of a batch), PostgreSQL
-- answered that claim by a bitmap scan over the batch's tasks, finished ones included, and an
-- UPDATE leaves index entries to dead row versions until VACUUM: each claim visited every task
-- the batch had run so far (40,000 index entries per claim at the end of a 10,000-task run,
-- README "Performance"). This index holds the queued tasks of each batch in claim order, so the
-- claim is an ordered index scan that stops at the first claimable task, and an index scan (a
-- bitmap scan does not) marks the entries of dead row versions it passes so later scans skip
-- them.
CREATE INDEX tasks_claimable_by_batch ON tasks (batch_id, created_at, id) WHERE queue = 'queued';
