-- The PostgreSQL twin of migrations/sqlite/0005_service.sql: API keys per tenant, tasks owned
-- by tenants, who wrote a journal row, and durable events.

CREATE TABLE api_keys (
    id          TEXT COLLATE "C" PRIMARY KEY,     -- uuid v7
    tenant      TEXT NOT NULL,
    label       TEXT NOT NULL,
    secret_hash TEXT NOT NULL UNIQUE,             -- lower-case hex SHA-256 of the secret
    scopes      TEXT,                             -- JSON, NULL = the tenant's full access
    created_at  BIGINT NOT NULL,                  -- unix milliseconds
    revoked_at  BIGINT                            -- unix milliseconds, NULL while valid
);
CREATE INDEX api_keys_by_tenant ON api_keys(tenant, created_at, id);

-- Neither column changes after the task is created, so steps stay HOT updates.
ALTER TABLE tasks ADD COLUMN tenant          TEXT;
ALTER TABLE tasks ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks(tenant, idempotency_key)
    WHERE tenant IS NOT NULL AND idempotency_key IS NOT NULL;
CREATE INDEX tasks_by_tenant ON tasks(tenant, id) WHERE tenant IS NOT NULL;

ALTER TABLE journal ADD COLUMN author TEXT;

-- Events. Sequence numbers are handed out when a row is inserted, not when its transaction
-- commits: a transaction that took id 7 may commit after one that took id 8. So every row also
-- records the id of the transaction that wrote it (`tx`), and readers return only rows whose
-- transaction is older than the oldest one still running (see postgres/events.rs): those rows
-- are final, and no row ordered before them by (tx, id) can still appear.
CREATE TABLE events (
    id         BIGSERIAL PRIMARY KEY,
    tx         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    tenant     TEXT,
    kind       TEXT NOT NULL,
    step       BIGINT NOT NULL,
    data       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX events_in_order ON events(tx, id);
CREATE INDEX events_by_task ON events(task_id, tx, id);
CREATE INDEX events_by_tenant ON events(tenant, tx, id) WHERE tenant IS NOT NULL;
