-- The PostgreSQL twin of migrations/sqlite/0002_leases.sql. Lease times come from the
-- database server's clock, so runners on machines with skewed clocks agree on expiry.
ALTER TABLE tasks ADD COLUMN lease_token       TEXT;
ALTER TABLE tasks ADD COLUMN lease_holder      TEXT;
ALTER TABLE tasks ADD COLUMN lease_process     TEXT;
ALTER TABLE tasks ADD COLUMN lease_acquired_at BIGINT;
ALTER TABLE tasks ADD COLUMN lease_expires_at  BIGINT;
