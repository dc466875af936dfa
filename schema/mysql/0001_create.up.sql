-- +goose Up
-- idem's table for MySQL 8.0+ and MariaDB 10.6+, as idem's first release
-- made it (schema version 1); 0002 gives it the layout of version 2.
-- Store.Migrate applies these files in order, with the Store's table name
-- in place of idempotency_keys. VARBINARY makes scope and key compare
-- byte for byte: no case folding and no pad-space. Times are UTC.
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
    PRIMARY KEY (scope, idem_key),
    KEY idempotency_keys_created_at_idx (created_at)
) ENGINE=InnoDB;
