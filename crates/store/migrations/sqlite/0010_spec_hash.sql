-- The hash a task's skill and tools were recorded with when it was created: SHA-256 of the two
-- texts as stored, joined by a newline (src/rows.rs `spec_hash`). Every read that decodes them
-- checks it first, so a copy changed outside skillstate (the frozen trigger dropped, a value
-- rewritten) stops its task with a clear error instead of being obeyed.
ALTER TABLE task_specs ADD COLUMN spec_hash TEXT;

-- SQLite has no SHA-256 of its own: the rows of earlier tasks get theirs from the migration's
-- Rust step (src/migrate.rs), which then creates this trigger again.
DROP TRIGGER task_specs_frozen;
