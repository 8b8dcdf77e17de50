-- The PostgreSQL twin of migrations/sqlite/0008_boards.sql: boards (src/boards.rs), shared
-- states that several tasks and API clients read and write, each with its own schema, version
-- and append-only journal of writes.
CREATE TABLE boards (
    id            TEXT COLLATE "C" PRIMARY KEY,   -- uuid v7
    name          TEXT NOT NULL,
    tenant        TEXT,                           -- NULL: created outside the service
    schema        TEXT NOT NULL,                  -- JSON Schema 2020-12
    initial_state TEXT NOT NULL,                  -- version 0, kept for time travel
    state         TEXT NOT NULL,                  -- the newest version's state JSON
    version       BIGINT NOT NULL,                -- writes so far
    state_hash    TEXT NOT NULL,                  -- hash of `state`
    created_at    BIGINT NOT NULL,                -- unix milliseconds
    updated_at    BIGINT NOT NULL
);
-- One name per tenant; untenanted boards share one namespace ('' never names a tenant).
CREATE UNIQUE INDEX boards_by_name ON boards(COALESCE(tenant, ''), name);

-- The append-only journal of writes: version n is the n-th write, with the patch as applied,
-- the hash of the state after it and who wrote it.
CREATE TABLE board_writes (
    board_id     TEXT COLLATE "C" NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    version      BIGINT NOT NULL,
    patch        TEXT NOT NULL,                   -- merge patch object or JSON Patch array
    state_hash   TEXT NOT NULL,
    author       TEXT NOT NULL,                   -- JSON: {"kind": "task"|"key"|"cli", ...}
    rebased_from BIGINT,                          -- the version the patch was computed on, when older
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (board_id, version)
);

-- Which task is attached to which board: a task belongs to at most one.
CREATE TABLE board_members (
    task_id     TEXT COLLATE "C" PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
    board_id    TEXT COLLATE "C" NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    attached_at BIGINT NOT NULL,
    seq         BIGSERIAL                         -- attachment order (SQLite: the rowid)
);
CREATE INDEX board_members_by_board ON board_members(board_id, seq);

-- For a task attached to a board: the board version its prompt showed.
ALTER TABLE journal ADD COLUMN board_version BIGINT;
