-- A task's skill definition and tool list (about 4 KB together) are written once, when the task
-- is created, while its `tasks` row changes with every step, state write, status and lease.
-- SQLite rewrites a whole record on UPDATE, overflow pages included, so the two columns cost
-- each of those writes 2-3 extra pages in the WAL, and every read of the row walked them. They
-- now live in a table of their own, written once and read only by a reader that does not hold
-- them yet (src/sqlite/reads.rs). PostgreSQL keeps them in `tasks`: TOAST stores large values
-- out of line and leaves them untouched by an UPDATE that does not change them.
CREATE TABLE task_specs (
    task_id TEXT PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
    skill   TEXT NOT NULL,                    -- SkillDefinition JSON, frozen at task creation
    tools   TEXT NOT NULL                     -- ToolSpec JSON array, as presented to the model
);

INSERT INTO task_specs (task_id, skill, tools) SELECT id, skill, tools FROM tasks;

-- No index, trigger or view refers to them.
ALTER TABLE tasks DROP COLUMN skill;
ALTER TABLE tasks DROP COLUMN tools;

-- Frozen: the point reads keep a task's decoded skill and tools for as long as they keep the
-- task and never read them again, so a change would go unseen there. Refused instead; a future
-- migration that must rewrite them drops this trigger first and creates it again.
CREATE TRIGGER task_specs_frozen BEFORE UPDATE ON task_specs
BEGIN
    SELECT RAISE(ABORT, 'a task''s skill and tools are frozen at its creation');
END;
