-- +goose Up
-- Schema version 2 for TiDB: each record's own expiry, and the name of the
-- key its response is sealed with. Store.Migrate applies it to a table of
-- version 1.
--
-- expires_at is when the record's response stops replaying, or a claim
-- may be forgotten: set when the key is claimed, moved later only when the
-- claim's lease is extended or it is completed past its lease. The purge
-- walks its index, oldest first. Rows written before (and by a release
-- before this one) have no expiry: they expire as before, by the Store's
-- retention, and the purge finds them through the created_at index.
--
-- sealed_key is NULL for a response stored in the clear, else the name of
-- the key that sealed it (WithSealer).
--
-- Online: TiDB's DDL adds the columns as metadata and backfills the index
-- while reads and writes go on. Run again, the first two statements fail
-- on the existing column and index, and Store.Migrate goes on to the next.
ALTER TABLE idempotency_keys
    ADD COLUMN expires_at DATETIME(6) NULL,
    ADD COLUMN sealed_key VARBINARY(64) NULL;
ALTER TABLE idempotency_keys ADD INDEX idempotency_keys_expires_at_idx (expires_at);
ALTER TABLE idempotency_keys COMMENT = 'idem schema 2';
