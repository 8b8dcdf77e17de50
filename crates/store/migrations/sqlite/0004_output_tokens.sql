-- Each answer's output tokens, counted when it was written, so listing a journal never builds
-- a tokenizer. NULL on rows written before this column existed (counted on demand).
ALTER TABLE journal ADD COLUMN output_tokens INTEGER;

-- No query reads tasks by updated_at, and every step changes it: one index less to maintain.
DROP INDEX IF EXISTS tasks_by_update;
