-- Idle workers wake on events instead of a poll (docs/storage.md, "Workers that wake on
-- events"). A notification on `skillstate_work:<schema>` says only "look again": work may have
-- become claimable. It carries nothing a waiter must trust (the payload is empty; a waiter
-- claims, which reads the rows). PostgreSQL sends it when the writing transaction commits,
-- once per transaction however many rows fired it, so queueing 10,000 tasks sends one.
CREATE FUNCTION skillstate_work_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('skillstate_work:' || current_schema(), '');
    RETURN NULL;
END
$$;

-- A task becomes claimable when it is queued (created queued, or queued again by a message, an
-- approval, a retry or a reopened batch), when its backoff is cleared, or when a lease on a
-- queued task is given back. A step's commit changes none of these, so it sends nothing.
CREATE TRIGGER tasks_work_queued AFTER INSERT ON tasks
    FOR EACH ROW WHEN (NEW.queue = 'queued')
    EXECUTE FUNCTION skillstate_work_notify();
CREATE TRIGGER tasks_work_requeued AFTER UPDATE OF queue, not_before, lease_token ON tasks
    FOR EACH ROW WHEN (NEW.queue = 'queued' AND (
        OLD.queue IS DISTINCT FROM NEW.queue
        OR (NEW.not_before IS NULL AND OLD.not_before IS NOT NULL)
        OR (NEW.lease_token IS NULL AND OLD.lease_token IS NOT NULL)))
    EXECUTE FUNCTION skillstate_work_notify();
-- A batch that opens again (reopened, or resumed) lets its queued tasks be claimed.
CREATE TRIGGER batches_work_reopened AFTER UPDATE OF state ON batches
    FOR EACH ROW WHEN (NEW.state = 'open' AND OLD.state IS DISTINCT FROM 'open')
    EXECUTE FUNCTION skillstate_work_notify();
