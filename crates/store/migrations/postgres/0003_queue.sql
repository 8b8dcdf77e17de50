-- The PostgreSQL twin of migrations/sqlite/0003_queue.sql. Claims, backoffs and rate windows
-- are timed by the database server's clock, like leases.
CREATE TABLE batches (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    name                TEXT NOT NULL,
    spec                TEXT NOT NULL,
    on_error            TEXT NOT NULL CHECK (on_error IN ('skip_and_log', 'stop')),
    max_retry           BIGINT NOT NULL,
    requests_per_minute BIGINT,
    tokens_per_minute   BIGINT,
    state               TEXT NOT NULL CHECK (state IN ('open', 'stopped')),
    stop_reason         TEXT,
    created_at          BIGINT NOT NULL
);

ALTER TABLE tasks ADD COLUMN batch_id   TEXT COLLATE "C" REFERENCES batches(id);
ALTER TABLE tasks ADD COLUMN queue      TEXT CHECK (queue IN ('queued', 'done'));
ALTER TABLE tasks ADD COLUMN tries      BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN not_before BIGINT;
ALTER TABLE tasks ADD COLUMN labels     TEXT;
ALTER TABLE tasks ADD COLUMN failure    TEXT;

CREATE INDEX tasks_claimable ON tasks(created_at, id) WHERE queue = 'queued';
CREATE INDEX tasks_by_batch ON tasks(batch_id, created_at, id) WHERE batch_id IS NOT NULL;

-- One row per scope, locked (SELECT ... FOR UPDATE) by every caller of the scope in turn.
CREATE TABLE rate_scopes (
    scope TEXT COLLATE "C" PRIMARY KEY
);
CREATE TABLE rate_events (
    scope    TEXT COLLATE "C" NOT NULL,
    at       BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    tokens   BIGINT NOT NULL
);
CREATE INDEX rate_events_by_scope ON rate_events(scope, at);

-- JSON text as jsonb, or NULL when it is not JSON, so that one hand-edited journal row does not
-- break a batch report (SQLite's json_valid plays this part there).
CREATE FUNCTION skillstate_jsonb(t TEXT) RETURNS JSONB LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
