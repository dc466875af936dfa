package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idemkit/idem/schema"
)

// Postgres is the dialect for PostgreSQL 12 and later, through lib/pq or
// pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib).
//
// A duplicate waits in INSERT ... ON CONFLICT DO NOTHING for the
// transaction that holds the key. Under REPEATABLE READ and SERIALIZABLE,
// a duplicate whose winner committed after the snapshot was taken fails with
// a serialization failure (SQLSTATE 40001), which [IsRetryable] reports.
//
// Times come from statement_timestamp(): the database clock when the
// statement arrived, the same for every use within one statement. A token
// is that clock in microseconds since the Unix epoch, or one more than the
// token before it, but for a new claim of Do's, whose token Do chose
// (InsertOwn).
var Postgres Dialect = mustDialect(DialectSpec{
	Name:          "postgres",
	statements:    postgresDialect{}.statements,
	Inserted:      postgresDialect{}.inserted,
	Retryable:     postgresDialect{}.retryable,
	Applied:       postgresDialect{}.applied,
	Fix:           postgresDialect{}.fix,
	SchemaFault:   postgresDialect{}.schemaFault,
	literals:      postgresDialect{}.literals,
	boundLockWait: postgresDialect{}.boundLockWait,
	claimGone:     postgresDialect{}.claimGone,
	// No CheckSession: every PostgreSQL transaction makes a duplicate
	// wait for the claim. No CausalReads: every read sees what the
	// database acknowledged.
})

type postgresDialect struct{}

func (postgresDialect) statements(parts []string) *statements {
	quoted := `"` + strings.Join(parts, `"."`) + `"`
	st := (&statements{
		Statements: Statements{
			Version:         Statement{pgVersion, args(ArgQuoted)},
			Insert:          Statement{pgInsert, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgLease, ArgExpiry)},
			InsertOwn:       Statement{pgInsertOwn, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry)},
			InsertDone:      Statement{pgInsertDone, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry, ArgMemory, ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgRef)},
			Takeover:        Statement{pgTakeover, args(ArgOperation, ArgFingerprint, ArgLease, ArgExpiry, ArgScope, ArgKey, ArgToken, ArgRetention, ArgKeyMemory)},
			InsertReturns:   Returning{Token: true, Lag: true},
			TakeoverReturns: Returning{Token: true, Lag: true},
			Read:            Statement{pgRead, args(ArgRetention, ArgKeyMemory, ArgScope, ArgKey)},
			ReadCompleted:   Statement{pgReadCompleted, args(ArgScope, ArgKey, ArgRetention)},
			State:           Statement{pgState, args(ArgScope, ArgKey)},
			Complete:        Statement{pgComplete, args(ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgKeep, ArgMemory, ArgScope, ArgKey, ArgToken, ArgRef)},
			Extend:          Statement{pgExtend, args(ArgLease, ArgScope, ArgKey, ArgToken)},
			Release:         Statement{pgRelease, args(ArgScope, ArgKey, ArgToken)},
			Remove:          Statement{pgRemove, args(ArgScope, ArgKey, ArgToken)},
			PurgeWindow:     Statement{pgPurgeWindow, args(ArgFrom, ArgLimit, ArgKeyMemory)},
			Purge:           Statement{pgPurge, args(ArgFrom, ArgLimit, ArgKeyMemory)},
			Strip:           Statement{pgStrip, args(ArgFrom, ArgLimit, ArgKeyMemory, ArgTo)},
			LegacyWindow:    Statement{pgLegacyWindow, args(ArgFrom, ArgRetention, ArgLimit, ArgKeyMemory)},
			LegacyPurge:     Statement{pgLegacyPurge, args(ArgFrom, ArgRetention, ArgLimit, ArgKeyMemory)},
			// READ COMMITTED whatever the server's default: no serialization
			// failures against live traffic.
			PurgeIsolation: sql.LevelReadCommitted,
			ResealRead:     Statement{pgResealRead, args(ArgFrom, ArgSealedKey, ArgLimit)},
			ResealWrite:    Statement{pgResealWrite, args(ArgBody, ArgSealedKey, ArgScope, ArgKey, ArgToken)},
			ResealLeft:     Statement{pgResealLeft, args(ArgSealedKey)},
			Inspect:        Statement{pgInspect, args(ArgRetention, ArgKeyMemory, ArgScope, ArgKey)},
			InspectKey:     Statement{pgInspectKey, args(ArgRetention, ArgKeyMemory, ArgKey, ArgLimit)},
			Stats:          Statement{pgStats, args(ArgRetention)},
			Size:           Statement{pgSize, args(ArgQuoted)},
		},
		built:          Statement{pgBuilt, args(ArgQuoted, ArgIndexName)},
		builds:         pgBuilds,
		dropUnbuilt:    "DROP INDEX CONCURRENTLY IF EXISTS ",
		fresh:          pgFresh,
		readAfterClaim: Statement{pgReadAfterClaim, args(ArgRetention, ArgKeyMemory, ArgScope, ArgKey)},
		// A plain read, which locks nothing.
		readFirstWhenReplaying: true,
		completeLast:           Statement{pgCompleteLast, args(ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgKeep, ArgMemory, ArgScope, ArgKey, ArgToken, ArgRef)},
		columns:                columnsProbe,
		replicated:             Statement{SQL: pgReplicated},
		flushed:                Statement{SQL: pgFlushed},
	}).rendered(parts, quoted, nil, schema.Postgres)
	if len(parts) == 2 {
		// An index is dropped by its name in its table's schema, which is
		// not on the search_path.
		for _, ddl := range st.Migrations {
			for i, s := range ddl {
				ddl[i] = strings.Replace(s, "DROP INDEX CONCURRENTLY IF EXISTS ", `DROP INDEX CONCURRENTLY IF EXISTS "`+parts[0]+`".`, 1)
			}
		}
	}
	return st
}

// pgVersion finds the table as a quoted, possibly qualified name would, on
// the search_path.
const pgVersion = `SELECT to_regclass($1) IS NOT NULL, COALESCE(obj_description(to_regclass($1), 'pg_class'), '')`

// pgReplicated is the statements' replicated, in bytes of WAL (an LSN
// minus '0/0') so that it runs on PostgreSQL 12 and 13, which cannot
// subtract a number from a pg_lsn; it returns the position, the same as
// a pg_lsn for messages, the count and the privilege. pgFlushed is
// flushed.
//
// The position is the primary's flush position (pg_current_wal_flush_lsn)
// when the session's synchronous_commit is not off: a COMMIT under it
// returns once its record is flushed, and a transaction becomes visible
// (to a replay's read) only after that, so the flush position is at or
// past every commit answered or read; and a standby can reach it at once,
// since a walsender sends flushed WAL only. The insert position
// (pg_current_wal_insert_lsn) would also hold the WAL of transactions
// still open, which no one flushes until something commits or a page
// fills: an idle primary would hold a wait for ever. Under
// synchronous_commit off a COMMIT returns before its flush, so the
// position is the end of what was inserted: the insert position, less
// the header of the page it stands at the start of (24 bytes, 40 at a
// segment's start), where nothing was written yet. A transaction that
// sets synchronous_commit off for itself alone (SET LOCAL) is not
// durable on the primary either, and is not covered.
//
// The standbys are the walsenders of physical replication: a logical
// one (a decoding client's, a subscription's) has a database, and is no
// standby that a failover could promote. flush_lsn is NULL, and the
// count 0, for a role that may not read it: pg_has_role says so.
const pgReplicated = `SELECT p.pos::text, p.lsn::text,
  (SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
    WHERE a.datid IS NULL AND r.flush_lsn - '0/0' >= p.pos),
  pg_has_role('pg_read_all_stats', 'USAGE')
FROM (SELECT w.pos, (to_hex(floor(w.pos / 4294967296)::bigint) || '/' || to_hex((w.pos % 4294967296)::bigint))::pg_lsn AS lsn
  FROM (SELECT CASE WHEN current_setting('synchronous_commit') <> 'off' THEN pg_current_wal_flush_lsn() - '0/0'
    ELSE (SELECT i.b - CASE WHEN i.b % pg_size_bytes(current_setting('wal_segment_size')) = 40 THEN 40
                            WHEN i.b % current_setting('wal_block_size')::numeric = 24 THEN 24 ELSE 0 END
          FROM (SELECT pg_current_wal_insert_lsn() - '0/0' AS b) i) END AS pos) w) p`

const pgFlushed = `SELECT (r.flush_lsn - '0/0')::text FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
WHERE a.datid IS NULL AND r.flush_lsn IS NOT NULL`

// pgBuilt reads an index of the table by its name in the table's
// schema; pg_stat_progress_create_index has a row for each build running,
// which names its index from the build's start when it is concurrent.
const pgBuilt = `SELECT i.indisvalid,
  EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid),
  i.indexrelid::regclass::text
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1) AND c.relname = $2`

// pgBuildsConcurrently matches the migrations' statements that build an
// index beside the traffic, and names it.
var pgBuildsConcurrently = regexp.MustCompile(`^CREATE INDEX CONCURRENTLY IF NOT EXISTS "?([^\s"]+)"? ON `)

// pgFresh is stmt without CONCURRENTLY, for a table Migrate has just
// created: a concurrent build or drop waits for every transaction open in
// the database before it, whatever table it touches; on an empty table
// no traffic uses yet, a plain one takes a moment.
func pgFresh(stmt string) string {
	for _, op := range []string{"CREATE INDEX", "DROP INDEX"} {
		if strings.HasPrefix(stmt, op+" CONCURRENTLY ") {
			return op + strings.TrimPrefix(stmt, op+" CONCURRENTLY")
		}
	}
	return stmt
}

// pgBuilds is the name of the index stmt builds concurrently, or "".
func pgBuilds(stmt string) string {
	if m := pgBuildsConcurrently.FindStringSubmatch(stmt); m != nil {
		return m[1]
	}
	return ""
}

// RETURNING runs once the row is written, after any wait for another
// transaction that held the key; created_at is the statement's start.
// forget_at, NULL until the completion, is named so that on a table of a
// schema version before it the claim fails before fn runs, with the
// advice to migrate, rather than the completion after it.
const pgInsert = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES ($1, $2, $3, $4, 'processing', (extract(epoch FROM statement_timestamp()) * 1000000)::bigint,
  statement_timestamp() + $5::bigint * interval '1 microsecond', statement_timestamp(),
  statement_timestamp() + $6::bigint * interval '1 microsecond', NULL)
ON CONFLICT (scope, idem_key) DO NOTHING
RETURNING token, ((extract(epoch FROM clock_timestamp()) - extract(epoch FROM created_at)) * 1000000)::bigint`

const pgInsertOwn = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES ($1, $2, $3, $4, 'processing', $5, statement_timestamp() + $6::bigint * interval '1 microsecond', statement_timestamp(),
  statement_timestamp() + $7::bigint * interval '1 microsecond', NULL)
ON CONFLICT (scope, idem_key) DO NOTHING`

const pgInsertDone = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at,
  forget_at, completed_at, response_status, response_headers, response_body, sealed_key, result_ref)
VALUES ($1, $2, $3, $4, 'completed', $5, statement_timestamp() + $6::bigint * interval '1 microsecond', statement_timestamp(),
  statement_timestamp() + $7::bigint * interval '1 microsecond', statement_timestamp() + ($7::bigint + $8::bigint) * interval '1 microsecond',
  statement_timestamp(), $9, $10, $11, $12, $13)
ON CONFLICT (scope, idem_key) DO NOTHING`

// Under READ COMMITTED, an update that waited for another transaction
// evaluates its WHERE again on the row that one committed. A record
// without an expiry (written before schema version 3) expires by the
// Store's retention ($8); a completed one is kept to its forget time, or
// for the Store's key memory ($9) past its expiry where it has none.
const pgTakeover = `UPDATE idempotency_keys SET operation = $1, fingerprint = $2, status = 'processing',
  token = GREATEST(token + 1, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint),
  lease_until = statement_timestamp() + $3::bigint * interval '1 microsecond', created_at = statement_timestamp(),
  expires_at = statement_timestamp() + $4::bigint * interval '1 microsecond',
  forget_at = NULL, completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL, sealed_key = NULL, result_ref = NULL
WHERE scope = $5 AND idem_key = $6 AND token = $7
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= statement_timestamp()
    OR status = 'completed' AND (CASE WHEN forget_at >= expires_at THEN forget_at
      ELSE COALESCE(expires_at, completed_at + $8::bigint * interval '1 microsecond') + $9::bigint * interval '1 microsecond' END) <= statement_timestamp()
    OR status = 'expired' AND expires_at <= statement_timestamp())
RETURNING token, ((extract(epoch FROM clock_timestamp()) - extract(epoch FROM created_at)) * 1000000)::bigint`

// pgLive is whether a record is a claim with a live lease, which no
// expiry makes absent: a retention shorter than the lease.
const pgLive = `(status = 'processing' AND lease_until > statement_timestamp())`

// pgExpiry is a record's expiry, by the Store's retention ($1) where it
// has none of its own.
const pgExpiry = `COALESCE(expires_at, (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + $1::bigint * interval '1 microsecond')`

// pgForget is a completed record's forget time: its own, or where it has
// none (a row of a release before schema version 4) its expiry plus the
// Store's key memory ($2). A forget time earlier than the expiry is not
// the record's: a release before version 4 took the record over (which
// leaves forget_at as it was, long past) and completed it again.
const pgForget = `(CASE WHEN forget_at >= expires_at THEN forget_at ELSE ` + pgExpiry + ` + $2::bigint * interval '1 microsecond' END)`

// pgForgotten and pgExpired are whether a record counts as absent (past
// its expiry; a completed one also past its forget time; a tombstone,
// whose expires_at is its forget time, past that; never a live claim),
// and whether its response is gone (past its expiry, or a tombstone).
const (
	pgForgotten = `((CASE WHEN status = 'completed' THEN ` + pgForget + `
    WHEN status = 'expired' THEN expires_at ELSE ` + pgExpiry + ` END) <= statement_timestamp() AND NOT ` + pgLive + `)`
	pgExpired = `(status = 'expired' OR status = 'completed' AND ` + pgExpiry + ` <= statement_timestamp())`
)

const pgRead = `SELECT operation, fingerprint, status, token, ` + pgForgotten + `, ` + pgExpired + `,
  (extract(epoch FROM lease_until - statement_timestamp()) * 1000000)::bigint,
  response_status, response_headers, response_body, sealed_key, result_ref
FROM idempotency_keys WHERE scope = $3 AND idem_key = $4`

// pgReadAfterClaim is pgRead under READ COMMITTED (and READ UNCOMMITTED,
// which PostgreSQL runs as READ COMMITTED), and no row otherwise: a
// condition on no column is checked once, before the scan (a One-Time
// Filter), so that under SERIALIZABLE the read takes no predicate lock
// either, and a fresh claim no more than without it.
const pgReadAfterClaim = pgRead + `
  AND current_setting('transaction_isolation') IN ('read committed', 'read uncommitted')`

const pgReadCompleted = `SELECT operation, fingerprint, response_status, response_headers, response_body, sealed_key,
  (extract(epoch FROM COALESCE(expires_at, completed_at + $3::bigint * interval '1 microsecond') - statement_timestamp()) * 1000000)::bigint, result_ref
FROM idempotency_keys WHERE scope = $1 AND idem_key = $2
  AND status = 'completed' AND COALESCE(expires_at, completed_at + $3::bigint * interval '1 microsecond') > statement_timestamp()`

const pgState = `SELECT status, token FROM idempotency_keys WHERE scope = $1 AND idem_key = $2`

// forget_at is the expiry so set plus the key memory ($6: the request's,
// else the Store's; 0 forgets the key at its expiry), an unindexed column.
// Do's completion ($5 NULL) sets expires_at to the value it has, so that
// its update changes no indexed column and stays HOT; so does a Claim's
// within its lease, whose Begin's expiry (the lease's end plus the
// retention) is later than the retention from now (myComplete says why).
// PostgreSQL's GREATEST passes over NULLs: a NULL $5 leaves the expiry, a
// NULL expiry (a row of a release before it) takes the retention from now.
const pgComplete = `UPDATE idempotency_keys SET status = 'completed', completed_at = statement_timestamp(),
  response_status = $1, response_headers = $2, response_body = $3, sealed_key = $4, result_ref = $10,
  expires_at = GREATEST(expires_at, statement_timestamp() + $5::bigint * interval '1 microsecond'),
  forget_at = GREATEST(expires_at, statement_timestamp() + $5::bigint * interval '1 microsecond') + $6::bigint * interval '1 microsecond'
WHERE scope = $7 AND idem_key = $8 AND token = $9 AND status = 'processing'`

// pgCompleteLast is pgComplete that fails with a division by zero
// (SQLSTATE 22012, which claimGone reads) when it changes no record: the
// COMMIT pipelined after it then does not run.
const pgCompleteLast = `WITH completed AS (` + pgComplete + `
RETURNING 1)
SELECT 1 / count(*) FROM completed`

const pgExtend = `UPDATE idempotency_keys
SET lease_until = GREATEST(statement_timestamp() + $1::bigint * interval '1 microsecond', lease_until + interval '1 microsecond')
WHERE scope = $2 AND idem_key = $3 AND token = $4 AND status = 'processing'`

const pgRelease = `UPDATE idempotency_keys SET status = 'released', lease_until = statement_timestamp()
WHERE scope = $1 AND idem_key = $2 AND token = $3 AND status = 'processing'`

const pgRemove = `DELETE FROM idempotency_keys WHERE scope = $1 AND idem_key = $2 AND token = $3`

// pgDue picks the records whose expiry has come, from the purge's cursor
// ($1, µs since the Unix epoch) on, through the expires_at index.
const pgDue = `expires_at >= 'epoch'::timestamptz + $1::bigint * interval '1 microsecond' AND expires_at <= statement_timestamp()`

const pgPurgeWindow = `SELECT count(*), COALESCE(max((extract(epoch FROM expires_at) * 1000000)::bigint), 0), count(*) FILTER (WHERE kept) FROM (
  SELECT expires_at, ` + pgKept + ` AS kept FROM idempotency_keys WHERE ` + pgDue + `
  ORDER BY expires_at LIMIT $2) w`

// pgForgetDue is a due record's forget time where it is completed: its
// own, or its expiry plus the Store's key memory ($3) where it has none,
// or one earlier than its expiry (see pgForget).
const pgForgetDue = `(CASE WHEN forget_at >= expires_at THEN forget_at ELSE expires_at + $3::bigint * interval '1 microsecond' END)`

// pgKept is whether a due record keeps its key past its expiry: it is
// completed and its forget time is ahead.
const pgKept = `(status = 'completed' AND ` + pgForgetDue + ` > statement_timestamp())`

// SKIP LOCKED passes over rows a live transaction holds instead of waiting
// for them. A record first met after its forget time is deleted whole.
const pgPurge = `DELETE FROM idempotency_keys WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + pgDue + ` AND NOT ` + pgKept + ` AND NOT ` + pgLive + `
  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

// pgStrip makes tombstones of the kept records of the window, up to its
// last expiry ($4): the scan stops there even where none is kept. A
// tombstone's expires_at is its forget time.
const pgStrip = `UPDATE idempotency_keys SET status = 'expired', response_headers = NULL, response_body = NULL, sealed_key = NULL,
  expires_at = ` + pgForgetDue + `
WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + pgDue + `
    AND expires_at <= 'epoch'::timestamptz + $4::bigint * interval '1 microsecond' AND ` + pgKept + `
  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

// pgLegacyWhere picks the records without an expiry that are past the
// Store's retention ($2; a completed one also past the key memory, $4),
// created at the legacy cursor ($1) or later. created_at is never later
// than completed_at or lease_until, so the partial index on created_at
// bounds the scan at both ends.
const pgLegacyWhere = `expires_at IS NULL
    AND created_at >= 'epoch'::timestamptz + $1::bigint * interval '1 microsecond'
    AND created_at <= statement_timestamp() - $2::bigint * interval '1 microsecond'
    AND (CASE WHEN status = 'completed' THEN completed_at + $4::bigint * interval '1 microsecond' ELSE lease_until END) <= statement_timestamp() - $2::bigint * interval '1 microsecond'`

const pgLegacyWindow = `SELECT count(*), COALESCE(max((extract(epoch FROM created_at) * 1000000)::bigint), 0) FROM (
  SELECT created_at FROM idempotency_keys WHERE ` + pgLegacyWhere + `
  ORDER BY created_at LIMIT $3) w`

const pgLegacyPurge = `DELETE FROM idempotency_keys WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + pgLegacyWhere + `
  ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)`

const pgResealRead = `SELECT scope, idem_key, operation, token, (extract(epoch FROM expires_at) * 1000000)::bigint,
  COALESCE(sealed_key, ''), response_headers, response_body
FROM idempotency_keys
WHERE expires_at >= 'epoch'::timestamptz + $1::bigint * interval '1 microsecond' AND expires_at > statement_timestamp()
  AND status = 'completed' AND sealed_key IS DISTINCT FROM $2
ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED`

const pgResealLeft = `SELECT COUNT(*) FROM idempotency_keys
WHERE expires_at > statement_timestamp() AND status = 'completed' AND sealed_key IS DISTINCT FROM $1`

const pgResealWrite = `UPDATE idempotency_keys SET response_headers = NULL, response_body = $1, sealed_key = $2
WHERE scope = $3 AND idem_key = $4 AND token = $5 AND status = 'completed'`

// pgInspectRecord is what inspect and inspectKey read of a record, with
// the retention as $1 and the key memory as $2.
const pgInspectRecord = `operation, fingerprint, status, token,
  (extract(epoch FROM lease_until) * 1000000)::bigint, (extract(epoch FROM created_at) * 1000000)::bigint,
  (extract(epoch FROM completed_at) * 1000000)::bigint, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint,
  ` + pgForgotten + `, ` + pgExpired + `, (extract(epoch FROM ` + pgExpiry + `) * 1000000)::bigint,
  response_status, response_headers, response_body, COALESCE(sealed_key, ''), result_ref
FROM idempotency_keys`

const pgInspect = `SELECT ` + pgInspectRecord + ` WHERE scope = $3 AND idem_key = $4`

// scope is COLLATE "C": the order is the bytes'.
const pgInspectKey = `SELECT scope, ` + pgInspectRecord + ` WHERE idem_key = $3 ORDER BY scope LIMIT $4`

const pgStats = `SELECT status, COUNT(*), MIN((extract(epoch FROM created_at) * 1000000)::bigint),
  COUNT(CASE WHEN ` + pgExpiry + ` <= statement_timestamp() AND NOT ` + pgLive + ` THEN 1 END),
  (extract(epoch FROM statement_timestamp()) * 1000000)::bigint
FROM idempotency_keys GROUP BY status ORDER BY status`

// pgSize asks for the table's size (with its TOAST data) and that of its
// indexes.
const pgSize = `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`

func (postgresDialect) inserted(n int64, err error) (bool, error) { return n == 1, err }

// sqlState is implemented by the errors of lib/pq (*pq.Error) and pgx
// (*pgconn.PgError).
type sqlState interface{ SQLState() string }

// errorFields is implemented by the errors of bun's pgdriver
// (pgdriver.Error) and go-pg: the fields of PostgreSQL's ErrorResponse,
// by their protocol codes ('C' is the SQLSTATE).
type errorFields interface{ Field(code byte) string }

// sqlStateOf is the SQLSTATE of the first error in err's tree that carries
// one, by either interface, without importing a driver.
func sqlStateOf(err error) string {
	var e sqlState
	if errors.As(err, &e) {
		return e.SQLState()
	}
	var f errorFields
	if errors.As(err, &f) {
		return f.Field('C')
	}
	return ""
}

// pgPoolerFix is what to change when the driver's prepared statements are
// not on the server session a statement ran on: SQLSTATE 42P05
// (duplicate_prepared_statement) when another client connection prepared
// the same name there, 26000 (invalid_sql_statement_name) when the
// session lacks the statement the driver prepared elsewhere, or lib/pq's
// unnamed statement, parsed in one round trip and bound in the next. idem
// names no prepared statement of its own: a pooler in transaction mode
// (PgBouncer) hands each transaction, and each statement outside one,
// whichever server connection is free. No retry helps.
const pgPoolerFix = "the driver's prepared statement is not on the server session this statement ran on, " +
	"as behind a pooler in transaction mode (PgBouncer) that tracks no prepared statements: " +
	"with pgx set default_query_exec_mode=exec in the DSN (pgx.QueryExecModeExec), with lib/pq binary_parameters=yes, " +
	"or run PgBouncer 1.21 or later with max_prepared_statements above 0 (docs/operations.md, PgBouncer)"

// fix names the fix for the errors of a pooler that loses the driver's
// prepared statements, which the generic advice of idem's messages (a
// missing permission, a retry) gets wrong.
func (postgresDialect) fix(err error) string {
	switch sqlStateOf(err) {
	case "42P05", // duplicate_prepared_statement
		"26000": // invalid_sql_statement_name
		return pgPoolerFix
	}
	return ""
}

// claimGone reads the failure of completeLast when it changed no record:
// its division by zero, which no other statement of idem's can fail
// with.
func (postgresDialect) claimGone(err error) bool { return sqlStateOf(err) == "22012" }

func (postgresDialect) retryable(err error) bool {
	switch sqlStateOf(err) {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03": // lock_not_available (lock_timeout)
		return true
	}
	return false
}

func (postgresDialect) applied(err error) bool {
	switch sqlStateOf(err) {
	case "42701", // duplicate_column
		"42P07", // duplicate_table: an index of that name
		"42710": // duplicate_object
		return true
	case "23505": // unique_violation: of the catalog's, by a table or index another Migrate created at once (IF NOT EXISTS found none)
		return strings.Contains(err.Error(), "pg_class_relname_nsp_index") || strings.Contains(err.Error(), "pg_type_typname_nsp_index")
	}
	return false
}

func (postgresDialect) schemaFault(err error) SchemaFault {
	switch sqlStateOf(err) {
	case "42P01": // undefined_table
		return NoTable
	case "42703": // undefined_column
		return missingFault(err.Error())
	case "42883", // undefined_function: a column of idem's name and another type (created_at text >= timestamptz)
		"42804": // datatype_mismatch
		return NotIdemTable
	case "3F000": // invalid_schema_name
		return NoSchema
	}
	return NoSchemaFault
}

// boundLockWait runs fn inside a savepoint with lock_timeout set to d for
// the transaction. On success lock_timeout is set back and the savepoint
// released. On any error, rolling back to the savepoint undoes fn and the
// setting, and leaves the transaction usable (Postgres aborts a transaction
// at its first error, so this is the only way back). set_config(..., true)
// is SET LOCAL: it lasts to the end of the transaction, or until the
// savepoint is rolled back to; its SELECT evaluates the columns left to
// right, so it returns the bound in force before it.
func (postgresDialect) boundLockWait(ctx context.Context, c Conn, d time.Duration, fn func() error) (bool, error) {
	if _, err := c.Exec(ctx, Query{SQL: `SAVEPOINT idem_lock_wait`}); err != nil {
		return false, err
	}
	var old, set string
	bound := fmt.Sprintf("%dms", (d+time.Millisecond-1)/time.Millisecond)
	if err := c.QueryRow(ctx, Query{SQL: `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`, Args: []any{bound}}, &old, &set); err != nil {
		return false, err
	}
	if err := fn(); err != nil {
		timedOut := sqlStateOf(err) == "55P03"
		for _, stmt := range []string{`ROLLBACK TO SAVEPOINT idem_lock_wait`, `RELEASE SAVEPOINT idem_lock_wait`} {
			if _, uerr := c.Exec(ctx, Query{SQL: stmt}); uerr != nil {
				return false, errors.Join(err, uerr)
			}
		}
		return timedOut, err
	}
	if err := c.QueryRow(ctx, Query{SQL: `SELECT set_config('lock_timeout', $1, true)`, Args: []any{old}}, &set); err != nil {
		return false, err
	}
	_, err := c.Exec(ctx, Query{SQL: `RELEASE SAVEPOINT idem_lock_wait`})
	return false, err
}
