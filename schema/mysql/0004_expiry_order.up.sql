-- +goose Up
-- Schema version 4 for MySQL and MariaDB: the table clustered in the order
-- its records expire. Store.Migrate applies it to a table of version 3.
--
-- Version 3 kept version 2's clustering on (created_at, scope, idem_key)
-- and found the records due through an index of its own on expires_at,
-- whose entries carry that primary key: the purge reached each row
-- through it, and each deletion changed three trees. Beside 16 workers at
-- 5 M records in a 1 GB buffer pool it deleted about 5,000 rows a second,
-- where version 2's purge of the primary key's range deleted 19,000.
-- Version 4 clusters on (expires_at, scope, idem_key): the purge deletes
-- a range of the table from its first page in order, as version 2's did,
-- and the expires_at index goes (docs/operations.md has the figures). Do's
-- claim appends to the rightmost leaves of its retention's records, and
-- its completion leaves expires_at as it is. An update that moves a
-- record's expiry moves its row in the table: a takeover (which moved it
-- under versions 2 and 3 as well, by created_at), Begin's completion and
-- Extend, and the key memory's stripping of a response.
--
-- Every record must have an expiry to be in the primary key. The rows
-- written before version 3 have none (expires_at NULL) and expire by the
-- Store's retention. First the column gets a default, so that a release
-- before version 3 that still runs beside (a rolling deploy), which
-- writes its rows without expires_at, gives them an expiry from now on:
-- the one they have by the default retention, 24 hours (86400000000 µs).
-- Then the UPDATE gives the rows written before that theirs, by the
-- same default: Store.Migrate runs it with the Store's retention in its
-- place; with goose or golang-migrate, put your Store's retention there
-- if it is not the default. Column defaults that are expressions need
-- MySQL 8.0.13 or later (MariaDB: 10.2.1).
--
-- Online: the default is a change of the table's definition alone, with
-- an exclusive metadata lock for a moment. The UPDATE locks the rows it
-- changes, none of which a release of version 3 or later writes. InnoDB
-- then rebuilds the table in place (ALGORITHM=INPLACE) while reads and
-- writes go on (LOCK=NONE), with an exclusive metadata lock for a moment
-- at its start and at its end. Run again, the first two change nothing,
-- and the ALTER fails on the missing expires_at index and changes nothing.
ALTER TABLE idempotency_keys
    ALTER COLUMN expires_at SET DEFAULT ((CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL 86400000000 MICROSECOND);
UPDATE idempotency_keys
SET expires_at = (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL 86400000000 MICROSECOND
WHERE expires_at IS NULL;
ALTER TABLE idempotency_keys
    MODIFY expires_at DATETIME(6) NOT NULL
        DEFAULT ((CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL 86400000000 MICROSECOND),
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (expires_at, scope, idem_key),
    DROP INDEX idempotency_keys_expires_at_idx,
    COMMENT = 'idem schema 4',
    ALGORITHM = INPLACE, LOCK = NONE;
