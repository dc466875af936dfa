-- +goose Up
-- +goose NO TRANSACTION
-- Schema version 3 for PostgreSQL: each record's own expiry, and the name
-- of the key its response is sealed with. Store.Migrate applies it to a
-- table of version 2.
--
-- expires_at is when the record's response stops replaying, or a claim
-- may be forgotten: set when the key is claimed (lease and retention from
-- then on, the request's retention or the Store's), moved later only when
-- the claim's lease is extended or it is completed past its lease, so a
-- completion in transaction mode leaves every indexed column as it was
-- and its update stays HOT. The purge walks its index, oldest first, and
-- deletes each record once, whatever the retention of its neighbours.
-- Rows written before (and by a release before this one) have no expiry:
-- they expire as before, by the Store's retention, and the purge finds
-- them through the partial index on created_at, which new rows never
-- enter. The created_at index goes: nothing else reads it.
--
-- sealed_key is NULL for a response stored in the clear, else the name
-- of the key that sealed it (WithSealer); the sealed value is in
-- response_body, and response_headers is NULL.
--
-- Online: ADD COLUMN of a nullable column without a default changes the
-- catalog only (a moment's ACCESS EXCLUSIVE lock, which waits for the
-- transactions open on the table). The indexes are built CONCURRENTLY:
-- reads and writes go on, and the build waits for transactions older than
-- it. So this file runs outside a transaction (goose: NO TRANSACTION;
-- Store.Migrate: on a pool, never inside a transaction of yours).
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS expires_at timestamptz, ADD COLUMN IF NOT EXISTS sealed_key text;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_legacy_idx ON idempotency_keys (created_at) WHERE expires_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_created_at_idx;
COMMENT ON TABLE idempotency_keys IS 'idem schema 3';
