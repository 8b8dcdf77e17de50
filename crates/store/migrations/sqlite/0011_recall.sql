-- Recall over a task's journal (README, "Recall and provenance"). One row per indexed entry:
-- the observation a step started from (written here, by trigger, whenever an observation row is
-- written, changed or deleted, so every path that writes one indexes it in its own
-- transaction), and an accepted step's reasoning, action and state writes (written by the store
-- with the journal row, from core's `recall::step_entries`; deleted with it by trigger). An
-- observation that is a recall result repeats the journal and is not indexed again.
CREATE TABLE recall_entries (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    INTEGER NOT NULL,
    kind    TEXT NOT NULL CHECK (kind IN ('observation', 'reasoning', 'action', 'state')),
    pointer TEXT,                              -- state: the location written
    text    TEXT NOT NULL
);
CREATE INDEX recall_entries_by_step ON recall_entries(task_id, step);
CREATE INDEX recall_entries_by_pointer ON recall_entries(task_id, pointer) WHERE pointer IS NOT NULL;

-- The full-text index (FTS5, contentless: the text lives in recall_entries). `task_key` is the
-- task id as one token, so a query intersects with its own task's entries only.
CREATE VIRTUAL TABLE recall_fts USING fts5(
    task_key, text, content = '', contentless_delete = 1,
    tokenize = 'unicode61 remove_diacritics 0'
);

CREATE TRIGGER recall_entries_indexed AFTER INSERT ON recall_entries BEGIN
    INSERT INTO recall_fts (rowid, task_key, text)
    VALUES (new.id, 't' || replace(new.task_id, '-', ''), new.text);
END;
CREATE TRIGGER recall_entries_unindexed AFTER DELETE ON recall_entries BEGIN
    DELETE FROM recall_fts WHERE rowid = old.id;
END;

-- The observations already stored (before this migration no task could call recall).
INSERT INTO recall_entries (task_id, step, kind, text)
SELECT task_id, step, 'observation', substr(text, 1, 16384) FROM observations WHERE text <> ''
ORDER BY task_id, step;

CREATE TRIGGER observations_recalled AFTER INSERT ON observations
WHEN new.text <> '' AND NOT EXISTS (
    SELECT 1 FROM intents WHERE task_id = new.task_id AND step = new.step - 1 AND tool = 'recall'
) BEGIN
    INSERT INTO recall_entries (task_id, step, kind, text)
    VALUES (new.task_id, new.step, 'observation', substr(new.text, 1, 16384));
END;
CREATE TRIGGER observations_rerecalled AFTER UPDATE OF text ON observations
WHEN new.text <> '' AND NOT EXISTS (
    SELECT 1 FROM intents WHERE task_id = new.task_id AND step = new.step - 1 AND tool = 'recall'
) BEGIN
    DELETE FROM recall_entries WHERE task_id = old.task_id AND step = old.step AND kind = 'observation';
    INSERT INTO recall_entries (task_id, step, kind, text)
    VALUES (new.task_id, new.step, 'observation', substr(new.text, 1, 16384));
END;
CREATE TRIGGER observations_forgotten AFTER DELETE ON observations BEGIN
    DELETE FROM recall_entries WHERE task_id = old.task_id AND step = old.step AND kind = 'observation';
END;
CREATE TRIGGER journal_forgotten AFTER DELETE ON journal WHEN old.verdict = 'accepted' BEGIN
    DELETE FROM recall_entries WHERE task_id = old.task_id AND step = old.step AND kind <> 'observation';
END;

-- The journal's accepted steps already stored are indexed by the migration's Rust step
-- (store/src/migrate.rs).
