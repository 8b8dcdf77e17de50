-- The per-step tables partitioned by RANGE over task_id (docs/storage.md, "PostgreSQL:
-- retention by partition"). Task ids are uuid v7 text, so their order is their creation
-- time's: a partition is the tasks created in one period, and every row of a task (journal,
-- observations, intents, snapshots, recall entries, events) lies in the one partition of its
-- period. Retention drops a partition whose tasks are all finished and old instead of deleting
-- their rows (src/postgres/partitions.rs); a partition by row time would split a live task's
-- journal across partitions.
--
-- This file runs inside the migration's last transaction, after src/postgres/partitions.rs has
-- set the old tables aside: renamed to <table>_legacy (with their indexes) when they hold
-- rows, to be attached below as the partition of every id under the bound chosen then; dropped
-- when the store had no task yet. The column order is the old tables' (a plan cached by
-- another session before the swap is re-planned, and must keep its result type).
-- Period partitions (<table>_p<start>) are created ahead of time by the store; a DEFAULT
-- partition catches any id outside them (ids not made by the store, a clock far ahead).

-- recall_entries.task_id has the database's collation, the other tables' ids "C": a trigger
-- comparing the two must say which, or the comparison can use neither the index nor the
-- partition bounds (every partition was scanned for each journal row or observation deleted).
CREATE OR REPLACE FUNCTION skillstate_forget_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM recall_entries
     WHERE task_id = OLD.task_id COLLATE "default" AND step = OLD.step AND kind <> 'observation';
    RETURN NULL;
END
$$;

-- An observation carried over a step someone other than the model wrote (a journal row with an
-- author: a state write, an upgrade) is not indexed again: it was indexed at the step where it
-- was observed (the SQLite twin, migrations/sqlite/0017_carried_observations.sql, says why).
CREATE OR REPLACE FUNCTION skillstate_recall_observation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM recall_entries
         WHERE task_id = OLD.task_id COLLATE "default" AND step = OLD.step AND kind = 'observation';
    END IF;
    IF TG_OP = 'UPDATE' OR TG_OP = 'INSERT' AND NOT EXISTS (
        SELECT 1 FROM journal
         WHERE task_id = NEW.task_id AND step = NEW.step - 1 AND author IS NOT NULL
    ) THEN
        IF NEW.text <> '' AND NOT EXISTS (
            SELECT 1 FROM intents
             WHERE task_id = NEW.task_id AND step = NEW.step - 1 AND tool = 'recall'
        ) THEN
            INSERT INTO recall_entries (task_id, step, kind, text)
            VALUES (NEW.task_id, NEW.step, 'observation', left(NEW.text, 16384));
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- CHECK constraints are named as the old tables' are: an attached partition must have its
-- parent's, by name.

-- Sequences outlive the tables that used them: ids go on where they were.
CREATE SEQUENCE IF NOT EXISTS events_id_seq;
CREATE SEQUENCE IF NOT EXISTS recall_entries_id_seq;

CREATE TABLE journal (
    task_id       TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step          BIGINT NOT NULL,
    attempt       BIGINT NOT NULL,
    verdict       TEXT NOT NULL CONSTRAINT journal_verdict_check CHECK (verdict IN ('accepted', 'rejected')),
    output        TEXT NOT NULL,
    patch         TEXT,
    action        TEXT,
    errors        TEXT,
    state_hash    TEXT,
    prompt_tokens BIGINT NOT NULL,
    prompt_hash   TEXT NOT NULL,
    usage         TEXT,
    latency_ms    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    output_tokens BIGINT,
    author        TEXT,
    board_version BIGINT,
    CONSTRAINT journal_pkey PRIMARY KEY (task_id, step, attempt)
) PARTITION BY RANGE (task_id);
CREATE TRIGGER journal_forgotten AFTER DELETE ON journal
    FOR EACH ROW WHEN (OLD.verdict = 'accepted') EXECUTE FUNCTION skillstate_forget_step();
CREATE TABLE journal_default PARTITION OF journal DEFAULT;

CREATE TABLE observations (
    task_id TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    BIGINT NOT NULL,
    text    TEXT NOT NULL,
    CONSTRAINT observations_pkey PRIMARY KEY (task_id, step)
) PARTITION BY RANGE (task_id);
CREATE TRIGGER observations_recalled AFTER INSERT OR UPDATE OF text OR DELETE ON observations
    FOR EACH ROW EXECUTE FUNCTION skillstate_recall_observation();
CREATE TABLE observations_default PARTITION OF observations DEFAULT;

CREATE TABLE intents (
    task_id         TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step            BIGINT NOT NULL,
    tool            TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    side_effect     TEXT NOT NULL,
    status          TEXT NOT NULL CONSTRAINT intents_status_check CHECK (status IN ('pending', 'done')),
    ok              BOOLEAN,
    result          TEXT,
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT,
    CONSTRAINT intents_pkey PRIMARY KEY (task_id, step)
) PARTITION BY RANGE (task_id);
CREATE TABLE intents_default PARTITION OF intents DEFAULT;

CREATE TABLE snapshots (
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step       BIGINT NOT NULL,
    state      TEXT NOT NULL,
    state_hash TEXT NOT NULL,
    CONSTRAINT snapshots_pkey PRIMARY KEY (task_id, step)
) PARTITION BY RANGE (task_id);
CREATE TABLE snapshots_default PARTITION OF snapshots DEFAULT;

-- A partitioned table's unique indexes include the partition key: the id alone is unique by
-- its sequence, (id, task_id) is what the server can enforce. recall_entries.task_id keeps the
-- database's collation, as in 0011 (an attached partition's columns match its parent's), so
-- its key does too: lookups by task_id then prune to one partition. For uuid text, whose
-- hyphens stand at the same places, every collation orders ids as "C" does.
CREATE TABLE recall_entries (
    id      BIGINT NOT NULL DEFAULT nextval('recall_entries_id_seq'),
    task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    step    BIGINT NOT NULL,
    kind    TEXT NOT NULL CONSTRAINT recall_entries_kind_check
                     CHECK (kind IN ('observation', 'reasoning', 'action', 'state')),
    pointer TEXT,
    text    TEXT NOT NULL,
    words   tsvector GENERATED ALWAYS AS (
        to_tsvector('simple'::regconfig, regexp_replace(text, '[^[:alnum:]]+', ' ', 'g'))
    ) STORED,
    CONSTRAINT recall_entries_pkey PRIMARY KEY (id, task_id)
) PARTITION BY RANGE (task_id);
ALTER SEQUENCE recall_entries_id_seq OWNED BY recall_entries.id;
CREATE INDEX recall_entries_by_step ON recall_entries (task_id, step);
CREATE INDEX recall_entries_by_pointer ON recall_entries (task_id, pointer) WHERE pointer IS NOT NULL;
CREATE INDEX recall_entries_words ON recall_entries USING GIN (words) WITH (fastupdate = off);
CREATE TABLE recall_entries_default PARTITION OF recall_entries DEFAULT;

-- Events keep their reading order, (tx, id) across every partition (a merge of each
-- partition's `events_in_order`); see 0005 and src/postgres/events.rs.
CREATE TABLE events (
    id         BIGINT NOT NULL DEFAULT nextval('events_id_seq'),
    tx         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    tenant     TEXT,
    kind       TEXT NOT NULL,
    step       BIGINT NOT NULL,
    data       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (id, task_id)
) PARTITION BY RANGE (task_id);
ALTER SEQUENCE events_id_seq OWNED BY events.id;
CREATE INDEX events_in_order ON events (tx, id);
CREATE INDEX events_by_task ON events (task_id, tx, id);
CREATE INDEX events_by_tenant ON events (tenant, tx, id) WHERE tenant IS NOT NULL;
CREATE TABLE events_default PARTITION OF events DEFAULT;

-- The store's partitions, one row per period (the same bounds in every table above):
-- `suffix` names them (<table>_<suffix>), `lo`/`hi` are the uuid v7 text bounds of the unix
-- milliseconds `from_ms`/`to_ms` (lo NULL: MINVALUE, the legacy partition). `dropped`: the
-- partition is gone and its tasks are being deleted (finished by the next gc after a crash).
CREATE TABLE skillstate_partitions (
    suffix  TEXT COLLATE "C" PRIMARY KEY,
    from_ms BIGINT,
    to_ms   BIGINT NOT NULL,
    lo      TEXT COLLATE "C",
    hi      TEXT COLLATE "C" NOT NULL,
    dropped BOOLEAN NOT NULL DEFAULT false
);
