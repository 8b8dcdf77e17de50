-- An observation carried over a step someone other than the model wrote is not indexed again
-- (the SQLite twin, migrations/sqlite/0017_carried_observations.sql, says why): the trigger
-- function of migration 18 with one more condition.
CREATE OR REPLACE FUNCTION skillstate_recall_observation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM recall_entries
         WHERE task_id = OLD.task_id COLLATE "default" AND step = OLD.step AND kind = 'observation';
    END IF;
    IF TG_OP = 'UPDATE' OR TG_OP = 'INSERT' AND NOT EXISTS (
        SELECT 1 FROM journal
         WHERE task_id = NEW.task_id AND step = NEW.step - 1 AND author IS NOT NULL
    ) THEN
        IF NEW.text <> '' AND NOT EXISTS (
            SELECT 1 FROM intents
             WHERE task_id = NEW.task_id AND step = NEW.step - 1 AND tool = 'recall'
        ) THEN
            INSERT INTO recall_entries (task_id, step, kind, text)
            VALUES (NEW.task_id, NEW.step, 'observation', left(NEW.text, 16384));
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- The observation a state write carries over (`NextObservation::Carried`, src/postgres/step_fn.rs):
-- the observation of `p_step` with `p_note` added once — unchanged when it already ends with the
-- note, the note alone when there is none. The step's statement reads it, so the caller does not.
CREATE OR REPLACE FUNCTION skillstate_carried_observation(p_task text, p_step bigint, p_note text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN o.text IS NULL OR o.text = '' THEN p_note
        WHEN p_note = '' OR right(o.text, length(p_note)) = p_note THEN o.text
        ELSE o.text || E'\n\n' || p_note
    END
    FROM (SELECT (SELECT text FROM observations
                   WHERE task_id = p_task COLLATE "C" AND step = p_step) AS text) o
$$;
