-- A step's commit in one statement (docs/storage.md, "PostgreSQL: one round trip per step").
-- Everything the store used to send as a transaction of 7 to 12 statements — the lease check,
-- the previous action's result, the task's row with its version check, the journal row, its
-- recall entries, the new intent, a snapshot, the next observation and the events — runs here,
-- on the server, in the statement's own transaction: one exchange with the client instead of
-- one per statement. The order of the writes and their locks is the one the multi-statement
-- path kept (the task's row first), so exactly-once and the event order are unchanged.
--
-- Refusals that leave nothing written come back as a row (`outcome`): 'not_found', 'leased'
-- (a live lease on an unleased write, with the lease), 'lease_lost' (the token does not hold the
-- lease), 'conflict' (with the task's version). Failures found after a write raise, so the whole
-- statement rolls back: SQLSTATE 'SKI01' (an action result with no pending intent) and 'SKI02'
-- (a delivered message that is no longer waiting). 'ok' also says whether messages wait in the
-- task's inbox once the step is in (`messages_waiting`), so a runner need not ask before its
-- next step.
CREATE FUNCTION skillstate_commit_step(
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
) LANGUAGE plpgsql AS $$
-- The OUT parameters share names with the tasks table's columns: in a statement, a name is
-- the column (results are set by assignment only).
#variable_conflict use_column
DECLARE
    t record;
    v_next bigint := p_expected + 1;
    v_marked bigint;
    v_kept text;
    v_status_event text;
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
        UPDATE intents SET status = 'done', ok = p_prev_ok, result = p_prev_result,
               finished_at = p_now
         WHERE task_id = p_task AND step = p_prev_step AND status = 'pending';
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no pending action intent to complete' USING ERRCODE = 'SKI01';
        END IF;
        INSERT INTO observations (task_id, step, text)
        VALUES (p_task, p_prev_step + 1, p_prev_observation);
        IF p_prev_checkpoint IS NOT NULL THEN
            UPDATE tasks SET env_checkpoint = p_prev_checkpoint,
                   env_checkpoint_step = p_prev_step
             WHERE id = p_task;
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

    UPDATE tasks SET state = p_state, version = v_next, updated_at = p_now,
           status = COALESCE(p_status, status), outcome = COALESCE(p_outcome, outcome),
           env_checkpoint = COALESCE(p_world, env_checkpoint),
           env_checkpoint_step = CASE WHEN p_world IS NULL THEN env_checkpoint_step ELSE p_expected END
     WHERE id = p_task;

    INSERT INTO journal (task_id, step, attempt, verdict, output, patch, action, errors,
                         state_hash, prompt_tokens, output_tokens, prompt_hash, usage,
                         latency_ms, created_at, author, board_version)
    VALUES (p_task, p_step, p_attempt, p_verdict, p_output, p_patch, p_action, p_errors,
            p_state_hash, p_prompt_tokens, p_output_tokens, p_prompt_hash, p_usage,
            p_latency_ms, p_created_at, p_author, p_board_version);
    IF cardinality(p_recall_kinds) > 0 THEN
        INSERT INTO recall_entries (task_id, step, kind, pointer, text)
        SELECT p_task, p_step, e.kind, e.pointer, e.text
          FROM unnest(p_recall_kinds, p_recall_pointers, p_recall_texts) AS e(kind, pointer, text);
    END IF;
    IF p_intent_tool IS NOT NULL THEN
        INSERT INTO intents (task_id, step, tool, args, idempotency_key, side_effect, status, created_at)
        VALUES (p_task, v_next, p_intent_tool, p_intent_args, p_intent_key, p_intent_side_effect,
                'pending', p_now);
    END IF;
    IF p_snapshot_hash IS NOT NULL THEN
        INSERT INTO snapshots (task_id, step, state, state_hash)
        VALUES (p_task, v_next, p_state, p_snapshot_hash);
    END IF;
    IF p_next_observation IS NOT NULL THEN
        INSERT INTO observations (task_id, step, text) VALUES (p_task, v_next + 1, p_next_observation);
    END IF;

    -- The events, in order: the held-back result's, the step's, the status change's (only when
    -- the status or the outcome changes; it carries the outcome the task has afterwards, and a
    -- stored outcome that is not JSON is not repeated).
    IF p_prev_step IS NOT NULL THEN
        INSERT INTO events (task_id, tenant, kind, step, data, created_at)
        VALUES (p_task, t.tenant, 'action', p_expected, p_prev_event, p_now);
    END IF;
    INSERT INTO events (task_id, tenant, kind, step, data, created_at)
    VALUES (p_task, t.tenant, 'step', v_next, p_step_event, p_now);
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
        INSERT INTO events (task_id, tenant, kind, step, data, created_at)
        VALUES (p_task, t.tenant, 'status', v_next, v_status_event, p_now);
    END IF;

    version := v_next;
    messages_waiting := EXISTS (SELECT 1 FROM inbox WHERE task_id = p_task AND delivered_step IS NULL);
    outcome := 'ok';
END
$$;

-- A claim's settling in one statement: the task leaves the queue (`p_queue` 'done') or waits
-- for a retry ('queued' from `p_not_before`), unless messages wait in its inbox, which keep it
-- queued now; the lease is given up. The task's row is locked first, so a post in progress (it
-- updates the row before it commits) is waited for, and the inbox read after it (a statement
-- of its own, with a snapshot of its own) sees the post's message. Answers 'ok', 'not_found',
-- or 'lease_lost' (the token no longer holds the lease; nothing is written).
CREATE FUNCTION skillstate_settle_claim(
    p_task text, p_token text, p_queue text, p_tries bigint, p_not_before bigint,
    p_failure text, p_now bigint
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_waiting boolean;
BEGIN
    PERFORM 1 FROM tasks WHERE id = p_task FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    v_waiting := EXISTS (SELECT 1 FROM inbox WHERE task_id = p_task AND delivered_step IS NULL);
    UPDATE tasks SET queue = CASE WHEN v_waiting THEN 'queued' ELSE p_queue END,
           tries = tries + p_tries,
           not_before = CASE WHEN v_waiting THEN NULL ELSE p_not_before END,
           failure = COALESCE(p_failure, failure), updated_at = p_now,
           lease_token = NULL, lease_holder = NULL, lease_process = NULL,
           lease_acquired_at = NULL, lease_expires_at = NULL
     WHERE id = p_task AND lease_token = p_token;
    IF NOT FOUND THEN
        RETURN 'lease_lost';
    END IF;
    RETURN 'ok';
END
$$;
