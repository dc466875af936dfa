-- +goose Up
-- Schema version 3 for TiDB: each record's own key memory. Store.Migrate
-- applies it to a table of version 2.
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
-- Online: TiDB adds a nullable column as metadata, while reads and writes
-- go on. Run again, the first statement fails on the existing column, and
-- Store.Migrate goes on to the next.
ALTER TABLE idempotency_keys ADD COLUMN forget_at DATETIME(6) NULL;
ALTER TABLE idempotency_keys COMMENT = 'idem schema 3';
