-- Skill versions, each stored once (README, "Skill versions and upgrades"). Until now every
-- task kept its own copy of its skill and tools (`task_specs`, about 4 KB), so a batch of
-- 10,000 tasks of one skill stored 10,000 equal copies. A version is now a row of its own,
-- addressed by the hash that already checked a task's copy (SHA-256 of the skill and tools
-- texts, src/rows.rs `spec_hash`): equal content, one row. A task names the version it runs
-- (`tasks.spec_hash`) and every version it ran (`task_versions`, from the step each began
-- at), so a prompt of any past step rebuilds with the procedure it was rendered from.
CREATE TABLE skill_versions (
    hash       TEXT PRIMARY KEY,               -- SHA-256 of skill and tools as stored
    name       TEXT NOT NULL,                  -- the skill's name
    version    TEXT,                           -- skill.toml's `version`, when it has one
    skill      TEXT NOT NULL,                  -- SkillDefinition JSON
    tools      TEXT NOT NULL,                  -- ToolSpec JSON array, as presented to the model
    created_at INTEGER NOT NULL
);

-- The versions a task ran: the one it was created with (from step 0, a fork's from its
-- parent's), then one row per upgrade, from the upgrade's own step.
CREATE TABLE task_versions (
    task_id   TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    from_step INTEGER NOT NULL,
    spec_hash TEXT NOT NULL REFERENCES skill_versions(hash),
    PRIMARY KEY (task_id, from_step)
) WITHOUT ROWID;
CREATE INDEX task_versions_by_hash ON task_versions(spec_hash);

INSERT OR IGNORE INTO skill_versions (hash, name, version, skill, tools, created_at)
SELECT s.spec_hash, t.skill_name, json_extract(s.skill, '$.settings.version'), s.skill, s.tools, t.created_at
FROM task_specs s JOIN tasks t ON t.id = s.task_id
ORDER BY t.created_at;
INSERT INTO task_versions (task_id, from_step, spec_hash)
SELECT task_id, 0, spec_hash FROM task_specs;

-- The version the task runs now (its latest row in task_versions).
ALTER TABLE tasks ADD COLUMN spec_hash TEXT;
-- An upgrade asked for while the task waits on an action (approval, a reply): the version it
-- moves to, and who asked, applied by the runner right after the action is settled.
ALTER TABLE tasks ADD COLUMN upgrade_to TEXT;
ALTER TABLE tasks ADD COLUMN upgrade_author TEXT;
UPDATE tasks SET spec_hash = (SELECT spec_hash FROM task_specs WHERE task_id = tasks.id);

DROP TRIGGER IF EXISTS task_specs_frozen;
DROP TABLE task_specs;

-- A version never changes: its hash is its content. (The point reads keep a decoded version
-- for as long as a task names it.)
CREATE TRIGGER skill_versions_frozen BEFORE UPDATE ON skill_versions
BEGIN
    SELECT RAISE(ABORT, 'a skill version never changes: store the new content as a version of its own');
END;

-- Garbage collection: a version goes with the last task that ran it or waits to move to it.
CREATE TRIGGER skill_versions_collected AFTER DELETE ON task_versions
WHEN NOT EXISTS (SELECT 1 FROM task_versions WHERE spec_hash = old.spec_hash)
 AND NOT EXISTS (SELECT 1 FROM tasks WHERE upgrade_to = old.spec_hash)
BEGIN
    DELETE FROM skill_versions WHERE hash = old.spec_hash;
END;
CREATE TRIGGER skill_versions_unscheduled AFTER UPDATE OF upgrade_to ON tasks
WHEN old.upgrade_to IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM task_versions WHERE spec_hash = old.upgrade_to)
 AND NOT EXISTS (SELECT 1 FROM tasks WHERE upgrade_to = old.upgrade_to)
BEGIN
    DELETE FROM skill_versions WHERE hash = old.upgrade_to;
END;
CREATE TRIGGER skill_versions_unscheduled_with_task AFTER DELETE ON tasks
WHEN old.upgrade_to IS NOT NULL
 AND NOT EXISTS (SELECT 1 FROM task_versions WHERE spec_hash = old.upgrade_to)
 AND NOT EXISTS (SELECT 1 FROM tasks WHERE upgrade_to = old.upgrade_to)
BEGIN
    DELETE FROM skill_versions WHERE hash = old.upgrade_to;
END;
