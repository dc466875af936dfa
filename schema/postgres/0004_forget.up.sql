-- +goose Up
-- Schema version 4 for PostgreSQL: each record's own key memory. Store.Migrate
-- applies it to a table of version 3.
--
-- forget_at is when a completed record's key may be forgotten: its expiry
-- plus the key memory of the request or the Store that completed it
-- (WithKeyMemory, Request.KeyMemory), the expiry itself when there was
-- none. The purge drops the response at expires_at and keeps the key (a
-- tombstone, status 'expired') until forget_at, whatever the purging
-- process was configured with; Do and Begin refuse the key until then
-- (ErrExpired). It is NULL on a claim not yet completed, and on every row
-- written before this version (or by a release before it, running
-- beside): those keep the key memory of the Store that reads or purges
-- them, as before.
--
-- result_ref is the small reference to what the request created (its
-- Location, or a field of its body: Response.Reference), as idem encodes
-- it: in the clear or sealed. The purge keeps it in the tombstone, so that
-- a late retry refused with ErrExpired learns where the object is. NULL
-- where the request recorded none.
--
-- Online: ADD COLUMN of nullable columns without a default changes the
-- catalog only and rewrites no row (a moment's ACCESS EXCLUSIVE lock,
-- which waits for the transactions open on the table). No index: the
-- purge reads forget_at only of the records it has found by expires_at.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS forget_at timestamptz;
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS result_ref bytea;
COMMENT ON TABLE idempotency_keys IS 'idem schema 4';
