-- The PostgreSQL twin of migrations/sqlite/0006_inbox.sql: a task's waiting messages and
-- decisions.
CREATE TABLE inbox (
    id             BIGSERIAL PRIMARY KEY,
    task_id        TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL,
    text           TEXT NOT NULL,
    author         TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    delivered_step BIGINT
);
CREATE INDEX inbox_waiting ON inbox(task_id, id) WHERE delivered_step IS NULL;
