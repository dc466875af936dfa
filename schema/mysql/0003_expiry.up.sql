-- +goose Up
-- Schema version 3 for MySQL and MariaDB: each record's own expiry, and
-- the name of the key its response is sealed with. Store.Migrate applies
-- it to a table of version 2.
--
-- expires_at is when the record's response stops replaying, or a claim
-- may be forgotten: set when the key is claimed (lease and retention from
-- then on, the request's retention or the Store's), moved later only when
-- the claim's lease is extended or it is completed past its lease, so a
-- completion changes no indexed column. The purge walks its index, oldest
-- first, and deletes each record once, whatever the retention of its
-- neighbours; records expire in nearly the order they were made, so the
-- rows it finds lie together in the clustered index. Rows written before
-- (and by a release before this one) have no expiry: they expire as
-- before, by the Store's retention, and the purge finds them in the
-- clustered index, which leads with created_at.
--
-- sealed_key is NULL for a response stored in the clear, else the name of
-- the key that sealed it (WithSealer); the sealed value is in
-- response_body, and response_headers is NULL.
--
-- Online: InnoDB adds the columns and builds the index in place
-- (ALGORITHM=INPLACE) while reads and writes go on (LOCK=NONE); it needs
-- an exclusive metadata lock for a moment at its start and at its end.
-- One statement, which InnoDB applies whole or not at all (the comment
-- with the rest): run again, it fails on the existing column before
-- changing anything.
ALTER TABLE idempotency_keys
    ADD COLUMN expires_at DATETIME(6) NULL,
    ADD COLUMN sealed_key VARBINARY(64) NULL,
    ADD KEY idempotency_keys_expires_at_idx (expires_at),
    COMMENT = 'idem schema 3',
    ALGORITHM = INPLACE, LOCK = NONE;
