-- Boards (src/boards.rs): shared states that several tasks and API clients read and write, each
-- with its own schema, version and append-only journal of writes.
CREATE TABLE boards (
    id            TEXT PRIMARY KEY,               -- uuid v7
    name          TEXT NOT NULL,
    tenant        TEXT,                           -- NULL: created outside the service
    schema        TEXT NOT NULL,                  -- JSON Schema 2020-12
    initial_state TEXT NOT NULL,                  -- version 0, kept for time travel
    state         TEXT NOT NULL,                  -- the newest version's state JSON
    version       INTEGER NOT NULL,               -- writes so far
    state_hash    TEXT NOT NULL,                  -- hash of `state`
    created_at    INTEGER NOT NULL,               -- unix milliseconds
    updated_at    INTEGER NOT NULL
);
-- One name per tenant; untenanted boards share one namespace ('' never names a tenant).
CREATE UNIQUE INDEX boards_by_name ON boards(COALESCE(tenant, ''), name);

-- The append-only journal of writes: version n is the n-th write, with the patch as applied,
-- the hash of the state after it and who wrote it.
CREATE TABLE board_writes (
    board_id     TEXT NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    version      INTEGER NOT NULL,
    patch        TEXT NOT NULL,                   -- merge patch object or JSON Patch array
    state_hash   TEXT NOT NULL,
    author       TEXT NOT NULL,                   -- JSON: {"kind": "task"|"key"|"cli", ...}
    rebased_from INTEGER,                         -- the version the patch was computed on, when older
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (board_id, version)
) WITHOUT ROWID;

-- Which task is attached to which board: a task belongs to at most one.
CREATE TABLE board_members (
    task_id     TEXT PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
    board_id    TEXT NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    attached_at INTEGER NOT NULL
);
CREATE INDEX board_members_by_board ON board_members(board_id, attached_at);

-- For a task attached to a board: the board version its prompt showed.
ALTER TABLE journal ADD COLUMN board_version INTEGER;
