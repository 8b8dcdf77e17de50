-- Each answer's output tokens, counted when it was written, so listing a journal never builds
-- a tokenizer. NULL on rows written before this column existed (counted on demand).
ALTER TABLE journal ADD COLUMN output_tokens BIGINT;

-- A step rewrites its task's row. No query reads tasks by updated_at, and an index on a column
-- every step changes would make each of those updates a non-HOT one (a new entry in every
-- index, dead rows only VACUUM reclaims). Without it, and with room left on each page, a step's
-- update stays on its page and the page prunes itself.
DROP INDEX IF EXISTS tasks_by_update;
ALTER TABLE tasks SET (fillfactor = 50);
