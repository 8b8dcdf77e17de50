-- Schema 19: the carried observation's text, made by the step's own statement.
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
