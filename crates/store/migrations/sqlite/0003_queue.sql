-- The work queue: batches of tasks claimed by workers under execution leases, whole-task
-- retries with backoff, and rate windows shared by every worker of the database.
CREATE TABLE batches (
    id                  TEXT PRIMARY KEY,
    name                TEXT NOT NULL,
    spec                TEXT NOT NULL,        -- the batch settings as submitted, JSON
    on_error            TEXT NOT NULL CHECK (on_error IN ('skip_and_log', 'stop')),
    max_retry           INTEGER NOT NULL,     -- whole-task retries after a failure
    requests_per_minute INTEGER,              -- shared rate limit, NULL = none
    tokens_per_minute   INTEGER,
    state               TEXT NOT NULL CHECK (state IN ('open', 'stopped')),
    stop_reason         TEXT,
    created_at          INTEGER NOT NULL      -- unix milliseconds
);

ALTER TABLE tasks ADD COLUMN batch_id   TEXT REFERENCES batches(id);
-- 'queued': claimable (when not_before has passed and nobody holds the lease) or running under
-- a claim; 'done': the queue is finished with it; NULL: not a queued task (`skillstate run`).
ALTER TABLE tasks ADD COLUMN queue      TEXT CHECK (queue IN ('queued', 'done'));
ALTER TABLE tasks ADD COLUMN tries      INTEGER NOT NULL DEFAULT 0;  -- retries spent
ALTER TABLE tasks ADD COLUMN not_before INTEGER;                     -- unix ms; backoff
ALTER TABLE tasks ADD COLUMN labels     TEXT;                        -- JSON object, for reports
ALTER TABLE tasks ADD COLUMN failure    TEXT;                        -- the last failure's reason

-- The claim scans queued tasks oldest first; finished ones drop out of the index.
CREATE INDEX tasks_claimable ON tasks(created_at, id) WHERE queue = 'queued';
CREATE INDEX tasks_by_batch ON tasks(batch_id, created_at, id) WHERE batch_id IS NOT NULL;

-- Rolling 60-second rate windows: one row per granted request (requests = 1) or per tokens
-- learnt afterwards (requests = 0). Rows older than the window are deleted as callers go.
CREATE TABLE rate_events (
    scope    TEXT NOT NULL,
    at       INTEGER NOT NULL,                -- unix milliseconds
    requests INTEGER NOT NULL,
    tokens   INTEGER NOT NULL
);
CREATE INDEX rate_events_by_scope ON rate_events(scope, at);
