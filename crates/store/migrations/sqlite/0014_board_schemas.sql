-- Board schemas through time (src/boards.rs, README "Boards": `board upgrade`). A board's
-- schema may change; the change is a write of its own in the board's journal, and from that
-- version on the new schema applies. `boards.schema` stays the schema in effect now; this table
-- keeps every schema with the version it applies from, so a past version is read (shown,
-- redacted, checked) with the schema in effect at it. Every board has a row for version 0.
CREATE TABLE board_schemas (
    board_id     TEXT NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    from_version INTEGER NOT NULL,               -- the write that set it (0: the board's creation)
    schema       TEXT NOT NULL,                  -- JSON Schema 2020-12
    PRIMARY KEY (board_id, from_version)
) WITHOUT ROWID;

-- Existing boards never changed schema: their schema applies from version 0.
INSERT INTO board_schemas (board_id, from_version, schema) SELECT id, 0, schema FROM boards;

-- A schema of the history never changes (a new one is a row of its own).
CREATE TRIGGER board_schemas_frozen BEFORE UPDATE ON board_schemas
BEGIN
    SELECT RAISE(ABORT, 'a board schema of the history never changes: upgrade the board to store a new one');
END;
