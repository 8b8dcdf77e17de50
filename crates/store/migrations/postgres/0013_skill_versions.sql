-- Skill versions, each stored once (the twin of migrations/sqlite/0013_skill_versions.sql,
-- which says why). `tasks.spec_hash` already was each task's content hash; it now names the
-- version the task runs, and `task_versions` every version it ran, from the step each began at.
CREATE TABLE skill_versions (
    hash       TEXT COLLATE "C" PRIMARY KEY,  -- SHA-256 of skill and tools as stored
    name       TEXT NOT NULL,
    version    TEXT,                          -- skill.toml's `version`, when it has one
    skill      TEXT NOT NULL,                 -- SkillDefinition JSON
    tools      TEXT NOT NULL,                 -- ToolSpec JSON array, as presented to the model
    created_at BIGINT NOT NULL
);

CREATE TABLE task_versions (
    task_id   TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    from_step BIGINT NOT NULL,
    spec_hash TEXT COLLATE "C" NOT NULL REFERENCES skill_versions(hash),
    PRIMARY KEY (task_id, from_step)
);
CREATE INDEX task_versions_by_hash ON task_versions(spec_hash);

INSERT INTO skill_versions (hash, name, version, skill, tools, created_at)
SELECT DISTINCT ON (spec_hash) spec_hash, skill_name, skill::jsonb #>> '{settings,version}', skill, tools, created_at
FROM tasks ORDER BY spec_hash, created_at;
INSERT INTO task_versions (task_id, from_step, spec_hash) SELECT id, 0, spec_hash FROM tasks;

DROP TRIGGER IF EXISTS tasks_spec_frozen ON tasks;
DROP TRIGGER IF EXISTS tasks_spec_hash ON tasks;
DROP FUNCTION IF EXISTS skillstate_record_spec_hash();
ALTER TABLE tasks DROP COLUMN skill, DROP COLUMN tools;
-- An upgrade asked for while the task waits on an action (approval, a reply): the version it
-- moves to, and who asked, applied by the runner right after the action is settled.
ALTER TABLE tasks ADD COLUMN upgrade_to TEXT COLLATE "C", ADD COLUMN upgrade_author TEXT;

-- A version never changes: its hash is its content.
CREATE FUNCTION skillstate_refuse_version_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a skill version never changes: store the new content as a version of its own';
END
$$;
CREATE TRIGGER skill_versions_frozen BEFORE UPDATE OF hash, name, version, skill, tools ON skill_versions
    FOR EACH ROW EXECUTE FUNCTION skillstate_refuse_version_change();
DROP FUNCTION IF EXISTS skillstate_refuse_spec_change();
