-- The recall index of a group commit, written once per group (store/src/sqlite/writer.rs).
--
-- FTS5 writes its pending terms out as a new segment whenever a SAVEPOINT opens in a
-- transaction that has written to it. The group-commit writer runs each write of a group under
-- a savepoint of its own, so indexing each write's entries as they were inserted made one
-- full-text segment per write (and the merges of all of them): with 64 concurrent state PATCHes
-- that was a quarter of the server's CPU time. So the writer marks its transaction here (one
-- row, `mark` = the highest entry id when the group began), the triggers leave the entries of a
-- marked transaction to it, and it indexes every entry above the mark in one statement after
-- the group's last savepoint, before COMMIT, then removes the mark: an entry is still
-- searchable exactly when it is committed. SQLite runs one write transaction at a time, so no
-- other connection ever sees the mark; every other writer (the pool, migrations) is indexed by
-- the triggers as before.
CREATE TABLE IF NOT EXISTS recall_deferred (mark INTEGER NOT NULL);

DROP TRIGGER IF EXISTS recall_entries_indexed;
CREATE TRIGGER recall_entries_indexed AFTER INSERT ON recall_entries
WHEN NOT EXISTS (SELECT 1 FROM recall_deferred) BEGIN
    INSERT INTO recall_fts (rowid, task_key, text)
    VALUES (new.id, 't' || replace(new.task_id, '-', ''), new.text);
END;

-- An entry of a marked transaction that is deleted before its group ends was never indexed.
DROP TRIGGER IF EXISTS recall_entries_unindexed;
CREATE TRIGGER recall_entries_unindexed AFTER DELETE ON recall_entries
WHEN NOT EXISTS (SELECT 1 FROM recall_deferred WHERE old.id > mark) BEGIN
    DELETE FROM recall_fts WHERE rowid = old.id;
END;
