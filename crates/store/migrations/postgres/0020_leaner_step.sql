-- Schema 20: a step's statement asks less of the server (docs/performance.md, "What a step
-- costs the server"). Measured with pg_stat_statements (track = all) and perf, these cost a
-- step more than the writes they guard:
--
-- * recall_entries' foreign key to tasks: a check (an SPI query locking the task's row) per
--   entry, four a step. A recall entry is only ever written in the transaction that writes the
--   journal row or the observation it indexes (this function, the store's multi-statement
--   writes, a fork's copy), whose own foreign keys check the task, and it is deleted with that
--   row by the rows' triggers (0018): with a task's journal and observations, whether one task
--   is deleted (their ON DELETE CASCADE) or a whole partition is dropped. The constraint added
--   nothing but the checks. Dropping it changes no row; it takes the tables' locks for a moment.
-- * the observations' trigger, run for the observation every step writes: two lookups and an
--   INSERT of their own. The step now writes that observation's recall entry with its other
--   entries, from what it knows already (the intent it completes names its tool; whether a
--   journal row of that step has an author is read in the same statement), and marks the row
--   `indexed`; the trigger indexes every other observation inserted (a fork's copies, a task's
--   first observation, the next observation a step carries), as before.
-- * a second UPDATE of the task's row for the held-back result's world checkpoint: now folded
--   into the step's one UPDATE;
-- * a statement per write: each costs a plan check, an executor start and end and a snapshot.
--   The writes after the checks (the task's row, the journal row, its recall entries, the
--   intent, a snapshot, the observations, the events) are now one statement;
-- * planning the completed intent's UPDATE afresh at every step (see the function's SET).
--
-- Everything else — the task's row locked first, the checks, the refusals and the errors
-- raised, what is written — is 0016's.
ALTER TABLE recall_entries DROP CONSTRAINT IF EXISTS recall_entries_task_id_fkey;

-- Whether the statement that inserted the row wrote its recall entry itself (metadata only:
-- no table rewrite). Every statement here can run again (a test takes a database back to an
-- earlier schema by hand and opens it again).
ALTER TABLE observations ADD COLUMN IF NOT EXISTS indexed boolean NOT NULL DEFAULT false;
DROP TRIGGER IF EXISTS observations_recalled ON observations;
DROP TRIGGER IF EXISTS observations_recalled_again ON observations;
CREATE TRIGGER observations_recalled AFTER INSERT ON observations
    FOR EACH ROW WHEN (NOT NEW.indexed) EXECUTE FUNCTION skillstate_recall_observation();
CREATE TRIGGER observations_recalled_again AFTER UPDATE OF text OR DELETE ON observations
    FOR EACH ROW EXECUTE FUNCTION skillstate_recall_observation();

CREATE OR REPLACE FUNCTION skillstate_commit_step(
    p_task text, p_mode text, p_token text, p_expected bigint, p_now bigint,
    -- the task's row
    p_state text, p_world text, p_status text, p_outcome text,
    -- the journal row
    p_step bigint, p_attempt bigint, p_verdict text, p_output text, p_patch text, p_action text,
    p_errors text, p_state_hash text, p_prompt_tokens bigint, p_output_tokens bigint,
    p_prompt_hash text, p_usage text, p_latency_ms bigint, p_created_at bigint, p_author text,
    p_board_version bigint,
    -- its recall entries
    p_recall_kinds text[], p_recall_pointers text[], p_recall_texts text[],
    -- the new intent (p_intent_tool NULL: none), a snapshot (p_snapshot_hash NULL: none), the
    -- next observation (NULL: none)
    p_intent_tool text, p_intent_args text, p_intent_key text, p_intent_side_effect text,
    p_snapshot_hash text, p_next_observation text,
    -- the previous step's held-back result (p_prev_step NULL: none)
    p_prev_step bigint, p_prev_ok boolean, p_prev_result text, p_prev_observation text,
    p_prev_checkpoint text, p_prev_delivered bigint[], p_prev_event text,
    -- the step's event
    p_step_event text,
    OUT outcome text, OUT version bigint, OUT lease_token text, OUT lease_holder text,
    OUT lease_process text, OUT lease_acquired_at bigint, OUT lease_expires_at bigint,
    OUT messages_waiting boolean
) LANGUAGE plpgsql
-- Generic plans always: the completed intent's UPDATE reads a partitioned table, whose generic
-- plan the plan cache judges dearer than planning the statement afresh at every step (its
-- estimate counts every partition, while only one is read); planning it was 5% of the
-- server's time per step.
SET plan_cache_mode = force_generic_plan
AS $$
-- The OUT parameters share names with the tasks table's columns: in a statement, a name is
-- the column (results are set by assignment only).
#variable_conflict use_column
DECLARE
    t record;
    v_next bigint := p_expected + 1;
    v_marked bigint;
    v_kept text;
    v_status_event text;
    v_index_prev boolean := false;
BEGIN
    -- The task's row, locked until the statement's transaction ends: nobody takes the lease
    -- over, and no other writer of the task gets between the checks and the writes.
    SELECT tk.version AS v, tk.tenant, tk.status, tk.outcome, tk.lease_token AS token,
           tk.lease_holder AS holder, tk.lease_process AS process,
           tk.lease_acquired_at AS acquired, tk.lease_expires_at AS expires
      INTO t FROM tasks tk WHERE tk.id = p_task FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    lease_token := t.token; lease_holder := t.holder; lease_process := t.process;
    lease_acquired_at := t.acquired; lease_expires_at := t.expires; version := t.v;
    IF p_mode = 'token' AND t.token IS DISTINCT FROM p_token THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    -- The server's clock decides expiry, as when leases are taken.
    IF p_mode = 'unleased' AND t.token IS NOT NULL
       AND t.expires > CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint) THEN
        outcome := 'leased';
        RETURN;
    END IF;
    IF t.v <> p_expected THEN
        outcome := 'conflict';
        RETURN;
    END IF;

    IF p_prev_step IS NOT NULL THEN
        -- What the observation trigger would look up for the result's observation: a recall
        -- result is not indexed again, nor an observation after a step someone other than
        -- the model wrote.
        UPDATE intents SET status = 'done', ok = p_prev_ok, result = p_prev_result,
               finished_at = p_now
         WHERE task_id = p_task AND step = p_prev_step AND status = 'pending'
        RETURNING p_prev_observation <> '' AND tool <> 'recall' AND NOT EXISTS (
            SELECT 1 FROM journal
             WHERE task_id = p_task AND step = p_prev_step AND author IS NOT NULL)
          INTO v_index_prev;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no pending action intent to complete' USING ERRCODE = 'SKI01';
        END IF;
        IF cardinality(p_prev_delivered) > 0 THEN
            UPDATE inbox SET delivered_step = p_prev_step + 1
             WHERE id = ANY(p_prev_delivered) AND task_id = p_task AND delivered_step IS NULL;
            GET DIAGNOSTICS v_marked = ROW_COUNT;
            IF v_marked <> cardinality(p_prev_delivered) THEN
                RAISE EXCEPTION 'a delivered message is no longer waiting' USING ERRCODE = 'SKI02';
            END IF;
        END IF;
    END IF;

    -- The status event (only when the status or the outcome changes; it carries the outcome
    -- the task has afterwards, and a stored outcome that is not JSON is not repeated).
    IF p_status IS NOT NULL AND (t.status <> p_status
        OR (p_outcome IS NOT NULL AND t.outcome IS DISTINCT FROM p_outcome)) THEN
        v_kept := t.outcome;
        IF p_outcome IS NULL AND v_kept IS NOT NULL THEN
            BEGIN
                PERFORM v_kept::json;
            EXCEPTION WHEN others THEN
                v_kept := NULL;
            END;
        END IF;
        v_status_event := '{"status":' || to_json(p_status)::text || ',"outcome":'
            || COALESCE(p_outcome, v_kept, 'null') || '}';
    END IF;

    -- Every other write in one statement: each statement of a function costs the server a plan
    -- check, an executor start and end, and a snapshot, more than most of these writes
    -- themselves. Each part writes rows of this task only, whose row is locked above, so the
    -- order in which the parts run decides nothing another transaction can see; the rows'
    -- triggers (the foreign keys' checks, the observations' recall entries) run once all of
    -- them are written, and see them all, as they saw the earlier writes before.
    WITH task AS (
        -- One write of the task's row: the held-back result's world checkpoint, overridden by
        -- the step's own world.
        UPDATE tasks SET state = p_state, version = v_next, updated_at = p_now,
               status = COALESCE(p_status, status), outcome = COALESCE(p_outcome, outcome),
               env_checkpoint = CASE
                   WHEN p_world IS NOT NULL THEN p_world
                   WHEN p_prev_step IS NOT NULL AND p_prev_checkpoint IS NOT NULL THEN p_prev_checkpoint
                   ELSE env_checkpoint END,
               env_checkpoint_step = CASE
                   WHEN p_world IS NOT NULL THEN p_expected
                   WHEN p_prev_step IS NOT NULL AND p_prev_checkpoint IS NOT NULL THEN p_prev_step
                   ELSE env_checkpoint_step END
         WHERE id = p_task
    ), journaled AS (
        INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors,
                             state_hash, prompt_tokens, output_tokens, prompt_hash, usage,
                             latency_ms, created_at, author, board_version)
        VALUES (p_task, p_step, p_attempt, p_verdict, p_output, p_patch, p_action, p_errors,
                p_state_hash, p_prompt_tokens, p_output_tokens, p_prompt_hash, p_usage,
                p_latency_ms, p_created_at, p_author, p_board_version)
    ), recalled AS (
        -- The result's observation first, then the step's entries, as when the trigger
        -- indexed the observation before the step's entries were written.
        INSERT INTO recall_entries (task_id, step, kind, pointer, text)
        SELECT p_task, r.step, r.kind, r.pointer, r.text
          FROM (SELECT 0::bigint AS n, p_prev_step + 1 AS step, 'observation' AS kind,
                       NULL::text AS pointer, left(p_prev_observation, 16384) AS text
                 WHERE v_index_prev
                UNION ALL
                SELECT e.n, p_step, e.kind, e.pointer, e.text
                  FROM unnest(p_recall_kinds, p_recall_pointers, p_recall_texts)
                       WITH ORDINALITY AS e(kind, pointer, text, n)) AS r
         ORDER BY r.n
    ), intended AS (
        INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at)
        SELECT p_task, v_next, p_intent_tool, p_intent_args, p_intent_key, p_intent_side_effect,
               'pending', p_now
         WHERE p_intent_tool IS NOT NULL
    ), snapshot AS (
        INSERT INTO snapshots (task_id, step, state, state_hash)
        SELECT p_task, v_next, p_state, p_snapshot_hash
         WHERE p_snapshot_hash IS NOT NULL
    ), observed AS (
        -- The held-back result's observation (indexed above, or not to be) and the next one
        -- (indexed by the trigger).
        INSERT INTO observations (task_id, step, text, indexed)
        SELECT p_task, o.step, o.text, o.indexed
          FROM (VALUES (1, p_prev_step + 1, CASE WHEN p_prev_step IS NOT NULL THEN p_prev_observation END, true),
                       (2, v_next + 1, p_next_observation, false)) AS o(n, step, text, indexed)
         WHERE o.text IS NOT NULL
         ORDER BY o.n
    )
    -- The events, in order: the held-back result's, the step's, the status change's. Ids are
    -- drawn as the rows are inserted, in this order.
    INSERT INTO events (task_id, tenant, kind, step, data, created_at)
    SELECT p_task, t.tenant, e.kind, e.step, e.data, p_now
      FROM (VALUES (1, 'action', p_expected, CASE WHEN p_prev_step IS NOT NULL THEN p_prev_event END),
                   (2, 'step', v_next, p_step_event),
                   (3, 'status', v_next, v_status_event)) AS e(n, kind, step, data)
     WHERE e.data IS NOT NULL
     ORDER BY e.n;

    version := v_next;
    messages_waiting := EXISTS (SELECT 1 FROM inbox WHERE task_id = p_task AND delivered_step IS NULL);
    outcome := 'ok';
END
$$;

