-- +goose Up
-- Schema version 2 for MySQL and MariaDB: the table clustered in insertion
-- order. Store.Migrate applies it to a table of version 1 (0001, every
-- release of idem before version 2 was introduced); the comment records
-- the version, and Store.Migrate reads it there.
--
-- InnoDB stores the rows in primary-key order. Version 1 clustered them on
-- (scope, idem_key): keys that clients draw at random (UUIDs) put every
-- fresh claim on a random leaf of the whole table, and the purge, which
-- finds the oldest rows through the created_at index, looked each one up
-- at random. Once the table outgrows the buffer pool, each claim and each
-- deleted row costs a page read and a page write.
--
-- Version 2 clusters on (created_at, scope, idem_key): a claim appends to
-- the rightmost leaves, which stay in the buffer pool, and the purge
-- (DELETE ... WHERE created_at <= ... ORDER BY created_at LIMIT n, the
-- same statement as before) walks the table from its first page in order.
-- (scope, idem_key) stays unique, enforced by its own unique index, which
-- every claim, read and fenced update finds the row through; its entries
-- are the key and created_at, 8 bytes more than the key itself. The
-- created_at index goes: the primary key leads with created_at. No
-- statement of idem changes, so a release that knows only version 1 runs
-- correctly on a table of version 2, and the reverse. A takeover, which
-- sets created_at to the claim's start, moves the row to the end, where a
-- fresh claim would be.
--
-- Online: InnoDB rebuilds the table in place (ALGORITHM=INPLACE) while
-- reads and writes go on (LOCK=NONE); if the server cannot, the statement
-- fails instead of locking the table. It needs an exclusive metadata lock
-- for a moment at its start and at its end, which waits for transactions
-- open on the table, and holds up new ones while it waits. It is one
-- statement: run twice, the second fails on the missing created_at index
-- and changes nothing. docs/operations.md has its timings.
ALTER TABLE idempotency_keys
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (created_at, scope, idem_key),
    ADD UNIQUE KEY idempotency_keys_scope_key (scope, idem_key),
    DROP INDEX idempotency_keys_created_at_idx,
    COMMENT = 'idem schema 2',
    ALGORITHM = INPLACE, LOCK = NONE;
