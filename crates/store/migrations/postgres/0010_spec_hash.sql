-- The hash a task's skill and tools were recorded with when it was created: SHA-256 of the two
-- texts as stored, joined by a newline (src/rows.rs `spec_hash` computes the same). Every read
-- that decodes them checks it first, so a copy changed outside skillstate stops its task with a
-- clear error instead of being obeyed.
ALTER TABLE tasks ADD COLUMN spec_hash TEXT;

UPDATE tasks SET spec_hash = encode(sha256(convert_to(skill || E'\n' || tools, 'UTF8')), 'hex');

-- Recorded at every insert, whichever statement inserts (create, batch, fork).
CREATE FUNCTION skillstate_record_spec_hash() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.spec_hash := encode(sha256(convert_to(NEW.skill || E'\n' || NEW.tools, 'UTF8')), 'hex');
    RETURN NEW;
END
$$;

CREATE TRIGGER tasks_spec_hash BEFORE INSERT ON tasks
    FOR EACH ROW EXECUTE FUNCTION skillstate_record_spec_hash();

-- Frozen after creation, as in SQLite.
CREATE FUNCTION skillstate_refuse_spec_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a task''s skill and tools are frozen at its creation';
END
$$;

CREATE TRIGGER tasks_spec_frozen BEFORE UPDATE OF skill, tools, spec_hash ON tasks
    FOR EACH ROW EXECUTE FUNCTION skillstate_refuse_spec_change();
