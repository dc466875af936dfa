-- +goose Up
-- Schema version 2 for PostgreSQL: storage settings for a table that the
-- purge empties as fast as claims fill it. Store.Migrate applies it to a
-- table of version 1 (0001, every release of idem before version 2 was
-- introduced); the comment records the version, and Store.Migrate reads it
-- there. The columns and indexes do not change, nor does any statement.
--
-- At 50 million records a day the purge deletes 580 rows a second, every
-- second. With the server's defaults autovacuum waits until a fifth of
-- the table is dead (10 million rows of a day's 50) and then runs
-- throttled, so the table carries up to a day of dead tuples:
--
--   autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold =
--     10000: vacuum once 1% of the table (and at least 10,000 rows) is
--     dead, so dead space stays near 1% instead of 20%. Each vacuum reads
--     only the pages that changed since the last (the visibility map skips
--     the rest), and the purge's deletions are the oldest pages, together.
--   autovacuum_vacuum_cost_limit = 2000: ten times the default budget
--     between naps, so a vacuum after a large purge (4 million rows) ends
--     in a minute or two rather than the quarter of an hour the default
--     throttle takes on such a table; its reads and writes are sequential.
--   autovacuum_analyze_scale_factor = 0.02: the planner's row counts and
--     created_at histogram follow a table whose every row is replaced
--     within the retention, so the purge keeps its index scan.
--   fillfactor = 90: a claim inserts its row and its completion updates it
--     in the same transaction; the free tenth of each page takes the new
--     version, so the update is HOT (no new entries in either index) for
--     the last rows of a page too, not only the first.
--   toast.*: the same vacuum settings for the TOAST table, where bodies
--     over about 2 kB are stored and which the purge empties alike.
--
-- ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock (reads and
-- writes go on; another ALTER TABLE or a running VACUUM of the table
-- waits, or is waited for) and rewrites nothing: fillfactor applies to
-- pages filled from now on. COMMENT takes the same lock. Both are safe to
-- repeat.
ALTER TABLE idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_limit = 2000,
    autovacuum_analyze_scale_factor = 0.02,
    fillfactor = 90,
    toast.autovacuum_vacuum_scale_factor = 0.01,
    toast.autovacuum_vacuum_threshold = 10000,
    toast.autovacuum_vacuum_cost_limit = 2000
);
COMMENT ON TABLE idempotency_keys IS 'idem schema 2';
