-- Recall over a task's journal (README, "Recall and provenance"); the same entries as SQLite's
-- recall_entries, searched with PostgreSQL's full-text search ('simple' configuration: words
-- are lower-cased, never stemmed, so an item number is found as written) through a GIN index.
-- Observations are indexed by trigger whenever an observation row is written, changed or
-- deleted; an accepted step's reasoning, action and state writes by the store with the journal
-- row, and deleted with it by trigger. An observation that is a recall result is not indexed.
CREATE TABLE recall_entries (
    id      BIGSERIAL PRIMARY KEY,
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    BIGINT NOT NULL,
    kind    TEXT NOT NULL CHECK (kind IN ('observation', 'reasoning', 'action', 'state')),
    pointer TEXT,
    text    TEXT NOT NULL,
    -- Every run of other characters is a space first, so words are letters and digits as in
    -- SQLite's index (PostgreSQL's parser would keep `/inventory/shelf_9` or `3.14` whole).
    words   tsvector GENERATED ALWAYS AS (
        to_tsvector('simple'::regconfig, regexp_replace(text, '[^[:alnum:]]+', ' ', 'g'))
    ) STORED
);
CREATE INDEX recall_entries_by_step ON recall_entries (task_id, step);
CREATE INDEX recall_entries_by_pointer ON recall_entries (task_id, pointer) WHERE pointer IS NOT NULL;
-- fastupdate off: every step writes a few entries and a running task searches between its
-- steps; with a pending list, each search would scan up to 4 MB of not-yet-merged entries
-- (30 ms instead of 0.2 ms on a 10,000-step journal until the next vacuum).
CREATE INDEX recall_entries_words ON recall_entries USING GIN (words) WITH (fastupdate = off);

-- The observations already stored (before this migration no task could call recall).
INSERT INTO recall_entries (task_id, step, kind, text)
SELECT task_id, step, 'observation', left(text, 16384) FROM observations WHERE text <> ''
ORDER BY task_id, step;

CREATE FUNCTION skillstate_recall_observation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM recall_entries
         WHERE task_id = OLD.task_id AND step = OLD.step AND kind = 'observation';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.text <> '' AND NOT EXISTS (
        SELECT 1 FROM intents WHERE task_id = NEW.task_id AND step = NEW.step - 1 AND tool = 'recall'
    ) THEN
        INSERT INTO recall_entries (task_id, step, kind, text)
        VALUES (NEW.task_id, NEW.step, 'observation', left(NEW.text, 16384));
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER observations_recalled AFTER INSERT OR UPDATE OF text OR DELETE ON observations
    FOR EACH ROW EXECUTE FUNCTION skillstate_recall_observation();

CREATE FUNCTION skillstate_forget_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM recall_entries
     WHERE task_id = OLD.task_id AND step = OLD.step AND kind <> 'observation';
    RETURN NULL;
END
$$;
CREATE TRIGGER journal_forgotten AFTER DELETE ON journal
    FOR EACH ROW WHEN (OLD.verdict = 'accepted') EXECUTE FUNCTION skillstate_forget_step();

-- The journal's accepted steps already stored are indexed by the migration's Rust step
-- (store/src/migrate.rs).
