-- Board schemas through time (the twin of migrations/sqlite/0014_board_schemas.sql, which says
-- why): every schema a board had, with the version it applies from; `boards.schema` stays the
-- schema in effect now. Every board has a row for version 0.
CREATE TABLE board_schemas (
    board_id     TEXT COLLATE "C" NOT NULL REFERENCES boards(id) ON DELETE CASCADE,
    from_version BIGINT NOT NULL,                 -- the write that set it (0: the board's creation)
    schema       TEXT NOT NULL,                   -- JSON Schema 2020-12
    PRIMARY KEY (board_id, from_version)
);

-- Existing boards never changed schema: their schema applies from version 0.
INSERT INTO board_schemas (board_id, from_version, schema) SELECT id, 0, schema FROM boards;

-- A schema of the history never changes (a new one is a row of its own).
CREATE FUNCTION skillstate_board_schema_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a board schema of the history never changes: upgrade the board to store a new one';
END;
$$;
CREATE TRIGGER board_schemas_frozen BEFORE UPDATE ON board_schemas
    FOR EACH ROW EXECUTE FUNCTION skillstate_board_schema_frozen();
