-- +goose Up
-- idem's table for PostgreSQL, as idem's first release made it (schema
-- version 1); 0002 adds the storage settings of version 2. Store.Migrate
-- applies these files in order, with the Store's table name in place of
-- idempotency_keys.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            text COLLATE "C" NOT NULL,
    idem_key         text COLLATE "C" NOT NULL,
    operation        text NOT NULL,
    fingerprint      text NOT NULL,
    status           text NOT NULL,
    token            bigint NOT NULL,
    lease_until      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    response_status  integer,
    response_headers bytea,
    response_body    bytea,
    PRIMARY KEY (scope, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created_at_idx ON idempotency_keys (created_at);
