-- +goose Up
-- idem's table for TiDB (schema version 1, the only one so far).
-- Store.Migrate applies this file with the Store's table name in place of
-- idempotency_keys. The columns are MySQL's: VARBINARY makes scope and key
-- compare byte for byte (no case folding, no pad-space); times are UTC.
--
-- The primary key is CLUSTERED: the row is stored under (scope, idem_key)
-- itself, so a claim writes two keys (the row and its created_at entry)
-- instead of three (a hidden row id, the unique index and created_at), and
-- the pessimistic lock, the read and every fenced update are one point get
-- on that key. Keys that clients draw at random (UUIDs) spread over the
-- cluster's regions; created_at grows with time, so its index takes its
-- inserts in one region at a time.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            VARBINARY(255) NOT NULL,
    idem_key         VARBINARY(255) NOT NULL,
    operation        VARBINARY(255) NOT NULL,
    fingerprint      VARBINARY(128) NOT NULL,
    status           VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token            BIGINT NOT NULL,
    lease_until      DATETIME(6) NOT NULL,
    created_at       DATETIME(6) NOT NULL,
    completed_at     DATETIME(6) NULL,
    response_status  INT NULL,
    response_headers LONGBLOB NULL,
    response_body    LONGBLOB NULL,
    PRIMARY KEY (scope, idem_key) CLUSTERED,
    KEY idempotency_keys_created_at_idx (created_at)
);
