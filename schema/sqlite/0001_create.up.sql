-- +goose Up
-- idem's table for SQLite 3.42+ (schema version 1, the only one so far).
-- Store.Migrate applies this file with the Store's table name in place of
-- idempotency_keys. TEXT columns use the BINARY collation (SQLite's
-- default), so scope and key compare byte for byte: no case folding and
-- no pad-space. STRICT makes SQLite refuse a value of the wrong type
-- instead of coercing it. WITHOUT ROWID keeps idem's inserts out of the
-- caller's last_insert_rowid(). Times are INTEGER microseconds since the
-- Unix epoch, UTC, from the database clock (millisecond resolution); read
-- one with datetime(lease_until / 1e6, 'unixepoch', 'subsec').
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            TEXT NOT NULL,
    idem_key         TEXT NOT NULL,
    operation        TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    status           TEXT NOT NULL,
    token            INTEGER NOT NULL,
    lease_until      INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    response_status  INTEGER,
    response_headers BLOB,
    response_body    BLOB,
    PRIMARY KEY (scope, idem_key)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);
