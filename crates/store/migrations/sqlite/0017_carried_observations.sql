-- An observation carried over a step someone other than the model wrote is not indexed again.
--
-- A state write or an upgrade (a journal row with an `author`) is a step of its own, and the
-- observation the task's next model step would have read moves to the step after it, with a
-- note added (runtime/src/state_write.rs, `authored_step`). The text is the one already indexed
-- at the step where it was observed, so indexing the copy again added one recall entry (and
-- its full-text terms) per state write — with a client writing state often, the same
-- observation thousands of times, every copy a hit for its words, and about a third of a state
-- PATCH's writes. The index keeps the observation at the step it was observed; a copy whose
-- text is later changed (a message delivered into it) is indexed then, as any changed text.
DROP TRIGGER IF EXISTS observations_recalled;
CREATE TRIGGER observations_recalled AFTER INSERT ON observations
WHEN new.text <> '' AND NOT EXISTS (
    SELECT 1 FROM intents WHERE task_id = new.task_id AND step = new.step - 1 AND tool = 'recall'
) AND NOT EXISTS (
    SELECT 1 FROM journal
     WHERE task_id = new.task_id AND step = new.step - 1 AND author IS NOT NULL
) BEGIN
    INSERT INTO recall_entries (task_id, step, kind, text)
    VALUES (new.task_id, new.step, 'observation', substr(new.text, 1, 16384));
END;
