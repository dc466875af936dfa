-- +goose Up
-- Schema version 2 for SQLite: each record's own expiry, and the name of
-- the key its response is sealed with. Store.Migrate applies it to a table
-- of version 1. SQLite's tables have no comment: the version is 2 when
-- the expires_at index is there, and this file makes it last.
--
-- expires_at is when the record's response stops replaying, or a claim
-- may be forgotten (µs since the Unix epoch, as every time here). The
-- purge walks its index. Rows written before have no expiry: they expire
-- by the Store's retention, and the purge finds them through the partial
-- index on created_at, which new rows never enter; the created_at index
-- goes. sealed_key is NULL for a response stored in the clear, else the
-- name of the key that sealed it (WithSealer).
--
-- Run again, an ADD COLUMN fails on the existing column and Store.Migrate
-- goes on to the next statement.
ALTER TABLE idempotency_keys ADD COLUMN expires_at INTEGER;
ALTER TABLE idempotency_keys ADD COLUMN sealed_key TEXT;
CREATE INDEX IF NOT EXISTS idempotency_keys_legacy_idx ON idempotency_keys (created_at) WHERE expires_at IS NULL;
DROP INDEX IF EXISTS idempotency_keys_created_at_idx;
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
