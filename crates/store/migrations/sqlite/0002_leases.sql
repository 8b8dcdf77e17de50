-- Execution leases: only one process drives a task at a time. The holder renews the lease
-- (heartbeat) while it runs; another process may take the task over once the lease expired,
-- or at once when the holder is a process of the same machine that no longer exists.
ALTER TABLE tasks ADD COLUMN lease_token       TEXT;     -- opaque id of the holding runner
ALTER TABLE tasks ADD COLUMN lease_holder      TEXT;     -- who holds it, for people: command, pid, host
ALTER TABLE tasks ADD COLUMN lease_process     TEXT;     -- machine-checkable identity of the holding process
ALTER TABLE tasks ADD COLUMN lease_acquired_at INTEGER;  -- unix milliseconds
ALTER TABLE tasks ADD COLUMN lease_expires_at  INTEGER;  -- unix milliseconds
