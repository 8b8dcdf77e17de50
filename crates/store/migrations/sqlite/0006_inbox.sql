-- A task's inbox (src/inbox.rs): user messages and human decisions posted from outside the
-- runner, waiting until a runner delivers them at a step boundary.
CREATE TABLE inbox (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id        TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL,                 -- message, approve, reject, reply
    text           TEXT NOT NULL,
    author         TEXT NOT NULL,                 -- an API key id, or `cli`
    created_at     INTEGER NOT NULL,              -- unix milliseconds
    delivered_step INTEGER                        -- NULL while it waits
);
CREATE INDEX inbox_waiting ON inbox(task_id, id) WHERE delivered_step IS NULL;
