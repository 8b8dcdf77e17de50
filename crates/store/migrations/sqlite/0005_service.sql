-- What the HTTP service needs (src/service.rs): API keys per tenant, tasks owned by tenants,
-- who wrote a journal row, and durable events.

-- API keys: only a SHA-256 of each secret is stored.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,                 -- uuid v7
    tenant      TEXT NOT NULL,
    label       TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,             -- lower-case hex SHA-256 of the secret
    scopes      TEXT,                             -- JSON, NULL = the tenant's full access
    created_at  INTEGER NOT NULL,                 -- unix milliseconds
    revoked_at  INTEGER                           -- unix milliseconds, NULL while valid
);
CREATE INDEX api_keys_by_tenant ON api_keys(tenant, created_at, id);

-- The tenant that owns a task (NULL: created outside the service) and the idempotency key its
-- create was sent with; a retried create with the same key finds the first task.
ALTER TABLE tasks ADD COLUMN tenant          TEXT;
ALTER TABLE tasks ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks(tenant, idempotency_key)
    WHERE tenant IS NOT NULL AND idempotency_key IS NOT NULL;
-- A tenant's tasks, newest first (ids are uuid v7, ordered by time).
CREATE INDEX tasks_by_tenant ON tasks(tenant, id) WHERE tenant IS NOT NULL;

-- Who wrote a journal row: NULL = the model; an API key id for state written through the
-- service.
ALTER TABLE journal ADD COLUMN author TEXT;

-- Events, appended in the same transaction as the write they describe. AUTOINCREMENT: an id is
-- never reused, even after the newest events were deleted with their task, so a reader's
-- position never points before events it has not seen. SQLite has one writer at a time (the
-- write lock is held from a transaction's first write to its commit), so ids are in commit
-- order and a reader that sees event n has seen every event before it.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    tenant     TEXT,                              -- the task's, copied when written
    kind       TEXT NOT NULL,                     -- created, step, rejected, action, status, message
    step       INTEGER NOT NULL,                  -- the task's version when written
    data       TEXT NOT NULL,                     -- JSON, by kind (EventKind)
    created_at INTEGER NOT NULL                   -- unix milliseconds
);
CREATE INDEX events_by_task ON events(task_id, id);
CREATE INDEX events_by_tenant ON events(tenant, id) WHERE tenant IS NOT NULL;
