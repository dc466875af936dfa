package idem

import (
	"database/sql"
	"errors"
	"reflect"
	"strings"

	"github.com/idemkit/idem/schema"
)

// SQLite is the dialect for SQLite 3.42 and later through modernc.org/sqlite
// (pure Go, driver name "sqlite"), for demos, tests and single-node
// applications. Import the driver yourself: package idem does not.
//
// SQLite has one writer at a time, and idem leaves the caller's connection
// as it found it, so it sets no pragma itself: the caller configures the
// connections in the DSN. Use a database file (":memory:" gives every pooled
// connection a database of its own) and these parameters:
//
//	file:/path/to/app.db?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)
//
// What each does:
//
//   - _txlock=immediate makes every read-write transaction take the write
//     lock at BEGIN, so concurrent requests for one key queue there, and
//     each sees what the one before it committed. Without it, a transaction
//     that read before Do fails with SQLITE_BUSY when it tries to write after
//     another one committed; IsRetryable reports that, so RunTx still gets
//     it right, at the cost of retries.
//   - busy_timeout is how long (in milliseconds) a transaction waits for the
//     write lock before failing with SQLITE_BUSY (retryable). Without it,
//     concurrent writers fail at once.
//   - journal_mode(WAL) lets readers run beside the writer.
//
// Every SQLite transaction is SERIALIZABLE: the driver accepts any
// sql.IsolationLevel and ignores it. [WithLockTimeout] is refused: a duplicate
// waits at BEGIN IMMEDIATE, before idem runs, and busy_timeout bounds that
// wait. Times are INTEGER microseconds since the Unix epoch from the
// database clock, which has millisecond resolution. See docs/dialects.md.
var SQLite Dialect = mustDialect(DialectSpec{
	Name:        "sqlite",
	statements:  sqliteDialect{}.statements,
	Inserted:    sqliteDialect{}.inserted,
	Retryable:   sqliteDialect{}.retryable,
	Applied:     sqliteDialect{}.applied,
	SchemaFault: sqliteDialect{}.schemaFault,
	// No Fix: it knows nothing better than the messages' own advice. No
	// CheckSession: SQLite has one writer at a time. No CausalReads:
	// every read sees what the database acknowledged. No literals: the
	// statements go with parameters.
})

type sqliteDialect struct{}

func (sqliteDialect) statements(parts []string) *statements {
	quoted := `"` + strings.Join(parts, `"."`) + `"`
	expiry := args(ArgRetention, ArgKeyMemory, ArgRetention, ArgRetention) // sqForgotten, sqExpired
	st := (&statements{
		Statements: Statements{
			Version:         Statement{sqVersion, args(ArgBase, ArgSchema, ArgBase, ArgSchema, ArgIndex, ArgSchema, ArgBase)},
			Insert:          Statement{sqInsert, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgLease, ArgExpiry)},
			InsertOwn:       Statement{sqInsertOwn, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry)},
			InsertDone:      Statement{sqInsertDone, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry, ArgExpiry, ArgMemory, ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgRef)},
			Takeover:        Statement{sqTakeover, args(ArgOperation, ArgFingerprint, ArgLease, ArgExpiry, ArgScope, ArgKey, ArgToken, ArgRetention, ArgKeyMemory)},
			InsertReturns:   Returning{Token: true, Lag: true},
			TakeoverReturns: Returning{Token: true, Lag: true},
			Read:            Statement{sqRead, append(expiry, ArgScope, ArgKey)},
			ReadCompleted:   Statement{sqReadCompleted, args(ArgRetention, ArgScope, ArgKey, ArgRetention)},
			State:           Statement{sqState, args(ArgScope, ArgKey)},
			Complete:        Statement{sqComplete, args(ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgRef, ArgKeep, ArgKeep, ArgMemory, ArgKeep, ArgKeep, ArgScope, ArgKey, ArgToken)},
			Extend:          Statement{sqExtend, args(ArgLease, ArgScope, ArgKey, ArgToken)},
			Release:         Statement{sqRelease, args(ArgScope, ArgKey, ArgToken)},
			Remove:          Statement{sqRemove, args(ArgScope, ArgKey, ArgToken)},
			PurgeWindow:     Statement{sqPurgeWindow, args(ArgKeyMemory, ArgFrom, ArgLimit)},
			Purge:           Statement{sqPurge, args(ArgFrom, ArgKeyMemory, ArgLimit)},
			Strip:           Statement{sqStrip, args(ArgKeyMemory, ArgFrom, ArgTo, ArgKeyMemory, ArgLimit)},
			LegacyWindow:    Statement{sqLegacyWindow, args(ArgFrom, ArgRetention, ArgKeyMemory, ArgRetention, ArgLimit)},
			LegacyPurge:     Statement{sqLegacyPurge, args(ArgFrom, ArgRetention, ArgKeyMemory, ArgRetention, ArgLimit)},
			// The default: every SQLite transaction is SERIALIZABLE.
			PurgeIsolation:    sql.LevelDefault,
			ResealRead:        Statement{sqResealRead, args(ArgFrom, ArgSealedKey, ArgLimit)},
			ResealWrite:       Statement{sqResealWrite, args(ArgBody, ArgSealedKey, ArgScope, ArgKey, ArgToken)},
			ResealLeft:        Statement{sqResealLeft, args(ArgSealedKey)},
			Inspect:           Statement{sqInspect, append(append(expiry, ArgRetention), ArgScope, ArgKey)},
			InspectKey:        Statement{sqInspectKey, append(append(expiry, ArgRetention), ArgKey, ArgLimit)},
			Stats:             Statement{sqStats, args(ArgRetention)},
			Size:              Statement{sqSize, args(ArgSchema, ArgBase, ArgSchema, ArgIndex)},
			NoReplicationWait: "SQLite has no standbys; a replicated SQLite (Litestream, LiteFS) is outside what idem can wait for",
		},
		columns: columnsProbe,
	}).rendered(parts, quoted, "main", schema.SQLite)
	if len(parts) == 2 {
		// SQLite qualifies an index's name with the schema (the attached
		// database) and never the table it is on.
		for _, ddl := range st.Migrations {
			for i, s := range ddl {
				for _, suffix := range []string{"_created_at_idx", "_expires_at_idx", "_legacy_idx"} {
					index := parts[1] + suffix
					s = strings.Replace(s, " "+index+" ON "+quoted+" ", ` "`+parts[0]+`"."`+index+`" ON "`+parts[1]+`" `, 1)
					s = strings.Replace(s, "DROP INDEX IF EXISTS "+index, `DROP INDEX IF EXISTS "`+parts[0]+`"."`+index+`"`, 1)
				}
				ddl[i] = s
			}
		}
	}
	return st
}

// sqVersion reads the version from the columns and indexes: SQLite's
// tables have no comment. Version 3 added forget_at, so a table that has
// it is of version 3; version 2 made the expires_at index last, so a
// table that has it and not forget_at is of version 2.
const sqVersion = `SELECT COUNT(*) > 0, CASE
    WHEN EXISTS (SELECT 1 FROM pragma_table_info(?, ?) WHERE name = 'forget_at') THEN 'idem schema 3'
    WHEN EXISTS (SELECT 1 FROM pragma_index_list(?, ?) WHERE name = ?) THEN 'idem schema 2' ELSE '' END
FROM pragma_table_list WHERE schema = ? AND name = ? COLLATE NOCASE`

// sqNow is the database clock in microseconds since the Unix epoch. SQLite's
// 'now' has millisecond resolution and is the same for every use within one
// statement. A token is that clock, or one more than the token before it,
// but for a new claim of Do's, whose token Do chose (InsertOwn).
const sqNow = "(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)"

// A claim statement never waits for another transaction that holds the
// key: the write lock is taken at BEGIN IMMEDIATE, or when the statement
// starts, before it reads the clock. So it is granted at its start, and
// returns 0 for how long it waited. forget_at, NULL until the
// completion, is named so that on a table of a schema version before it
// the claim fails before fn runs, with the advice to migrate.
const sqInsert = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES (?, ?, ?, ?, 'processing', ` + sqNow + `, ` + sqNow + ` + ?, ` + sqNow + `, ` + sqNow + ` + ?, NULL)
ON CONFLICT (scope, idem_key) DO NOTHING
RETURNING token, 0`

const sqInsertOwn = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES (?, ?, ?, ?, 'processing', ?, ` + sqNow + ` + ?, ` + sqNow + `, ` + sqNow + ` + ?, NULL)
ON CONFLICT (scope, idem_key) DO NOTHING`

const sqInsertDone = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at,
  forget_at, completed_at, response_status, response_headers, response_body, sealed_key, result_ref)
VALUES (?, ?, ?, ?, 'completed', ?, ` + sqNow + ` + ?, ` + sqNow + `, ` + sqNow + ` + ?, ` + sqNow + ` + ? + ?, ` + sqNow + `, ?, ?, ?, ?, ?)
ON CONFLICT (scope, idem_key) DO NOTHING`

// A writer holds the database's only write lock, so the WHERE reads the
// row as last committed. A record without an expiry (written before
// schema version 2) expires by the Store's retention; a completed one is
// kept to its forget time, or where it has none for the Store's key
// memory past its expiry.
const sqTakeover = `UPDATE idempotency_keys SET operation = ?, fingerprint = ?, status = 'processing',
  token = max(token + 1, ` + sqNow + `), lease_until = ` + sqNow + ` + ?, created_at = ` + sqNow + `, expires_at = ` + sqNow + ` + ?,
  forget_at = NULL, completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL, sealed_key = NULL, result_ref = NULL
WHERE scope = ? AND idem_key = ? AND token = ?
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= ` + sqNow + `
    OR status = 'completed' AND (CASE WHEN forget_at >= expires_at THEN forget_at ELSE COALESCE(expires_at, completed_at + ?) + ? END) <= ` + sqNow + `
    OR status = 'expired' AND expires_at <= ` + sqNow + `)
RETURNING token, 0`

// sqLive is whether a record is a claim with a live lease, which no
// expiry makes absent: a retention shorter than the lease.
const sqLive = `(status = 'processing' AND lease_until > ` + sqNow + `)`

// sqExpiry is a record's expiry, by the Store's retention where it has
// none of its own.
const sqExpiry = `COALESCE(expires_at, (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ?)`

// sqForgotten and sqExpired are whether a record counts as absent (past
// its expiry; a completed one also past its forget time, forget_at, or
// where it has none (or one earlier than its expiry: see pgForget) past
// the Store's key memory after its expiry; a tombstone, whose expires_at
// is its forget time, past that; never a live
// claim), and whether its response is gone: with the retention, the key
// memory, the retention and the retention.
const (
	sqForgotten = `((CASE WHEN status = 'completed' THEN (CASE WHEN forget_at >= expires_at THEN forget_at ELSE ` + sqExpiry + ` + ? END)
    WHEN status = 'expired' THEN expires_at ELSE ` + sqExpiry + ` END) <= ` + sqNow + ` AND NOT ` + sqLive + `)`
	sqExpired = `(status = 'expired' OR status = 'completed' AND ` + sqExpiry + ` <= ` + sqNow + `)`
)

const sqRead = `SELECT operation, fingerprint, status, token, ` + sqForgotten + `, ` + sqExpired + `,
  lease_until - ` + sqNow + `,
  response_status, response_headers, response_body, sealed_key, result_ref
FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

const sqReadCompleted = `SELECT operation, fingerprint, response_status, response_headers, response_body, sealed_key,
  COALESCE(expires_at, completed_at + ?) - ` + sqNow + `, result_ref
FROM idempotency_keys WHERE scope = ? AND idem_key = ?
  AND status = 'completed' AND COALESCE(expires_at, completed_at + ?) > ` + sqNow

const sqState = `SELECT status, token FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

// forget_at is the expiry so set plus the request's key memory; SET reads
// the row as it was.
const sqComplete = `UPDATE idempotency_keys SET status = 'completed', completed_at = ` + sqNow + `,
  response_status = ?, response_headers = ?, response_body = ?, sealed_key = ?, result_ref = ?,
  forget_at = (CASE WHEN expires_at >= ` + sqNow + ` + ? THEN expires_at ELSE COALESCE(` + sqNow + ` + ?, expires_at) END) + ?,
  expires_at = CASE WHEN expires_at >= ` + sqNow + ` + ? THEN expires_at ELSE COALESCE(` + sqNow + ` + ?, expires_at) END
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const sqExtend = `UPDATE idempotency_keys SET lease_until = max(` + sqNow + ` + ?, lease_until + 1)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const sqRelease = `UPDATE idempotency_keys SET status = 'released', lease_until = ` + sqNow + `
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const sqRemove = `DELETE FROM idempotency_keys WHERE scope = ? AND idem_key = ? AND token = ?`

// sqDue picks the records whose expiry has come, from the purge's cursor
// on, through the expires_at index.
const sqDue = `expires_at >= ? AND expires_at <= ` + sqNow

const sqPurgeWindow = `SELECT count(*), COALESCE(max(expires_at), 0), COALESCE(sum(kept), 0) FROM (
  SELECT expires_at, ` + sqKept + ` AS kept FROM idempotency_keys WHERE ` + sqDue + `
  ORDER BY expires_at LIMIT ?)`

// sqKept is whether a due record keeps its key past its expiry: it is
// completed and its forget time (its own, or its expiry plus the Store's
// key memory) is ahead.
const sqKept = `(status = 'completed' AND ` + sqForgetDue + ` > ` + sqNow + `)`

// sqForgetDue is a due record's forget time where it is completed: its
// own (see pgForgetDue), or its expiry plus the Store's key memory.
const sqForgetDue = `(CASE WHEN forget_at >= expires_at THEN forget_at ELSE expires_at + ? END)`

// A record first met after its forget time is deleted whole. DELETE ...
// LIMIT needs a compile-time option; a subquery does not.
const sqPurge = `DELETE FROM idempotency_keys WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + sqDue + ` AND NOT ` + sqKept + ` AND NOT ` + sqLive + `
  ORDER BY expires_at LIMIT ?)`

// sqStrip makes tombstones of the kept records of the window, up to its
// last expiry: the scan stops there even where none is kept. A
// tombstone's expires_at is its forget time.
const sqStrip = `UPDATE idempotency_keys SET status = 'expired', response_headers = NULL, response_body = NULL, sealed_key = NULL,
  expires_at = ` + sqForgetDue + `
WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + sqDue + ` AND expires_at <= ? AND ` + sqKept + `
  ORDER BY expires_at LIMIT ?)`

// sqLegacyWhere picks the records without an expiry that are past the
// Store's retention (a completed one also past the key memory), created
// at the legacy cursor or later, through the partial index on created_at.
const sqLegacyWhere = `expires_at IS NULL AND created_at >= ? AND created_at <= ` + sqNow + ` - ?
    AND (CASE WHEN status = 'completed' THEN completed_at + ? ELSE lease_until END) <= ` + sqNow + ` - ?`

const sqLegacyWindow = `SELECT count(*), COALESCE(max(created_at), 0) FROM (
  SELECT created_at FROM idempotency_keys WHERE ` + sqLegacyWhere + `
  ORDER BY created_at LIMIT ?)`

const sqLegacyPurge = `DELETE FROM idempotency_keys WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM idempotency_keys WHERE ` + sqLegacyWhere + `
  ORDER BY created_at LIMIT ?)`

const sqResealRead = `SELECT scope, idem_key, operation, token, expires_at, COALESCE(sealed_key, ''), response_headers, response_body
FROM idempotency_keys
WHERE expires_at >= ? AND expires_at > ` + sqNow + ` AND status = 'completed' AND sealed_key IS NOT ?
ORDER BY expires_at LIMIT ?`

const sqResealLeft = `SELECT COUNT(*) FROM idempotency_keys
WHERE expires_at > ` + sqNow + ` AND status = 'completed' AND sealed_key IS NOT ?`

const sqResealWrite = `UPDATE idempotency_keys SET response_headers = NULL, response_body = ?, sealed_key = ?
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'completed'`

// sqInspectRecord is what inspect and inspectKey read of a record, with
// the arguments of sqForgotten and sqExpired, then the retention.
const sqInspectRecord = `operation, fingerprint, status, token, lease_until, created_at, completed_at, ` + sqNow + `,
  ` + sqForgotten + `, ` + sqExpired + `, ` + sqExpiry + `,
  response_status, response_headers, response_body, COALESCE(sealed_key, ''), result_ref
FROM idempotency_keys`

const sqInspect = `SELECT ` + sqInspectRecord + ` WHERE scope = ? AND idem_key = ?`

// scope uses the BINARY collation: the order is the bytes'.
const sqInspectKey = `SELECT scope, ` + sqInspectRecord + ` WHERE idem_key = ? ORDER BY scope LIMIT ?`

const sqStats = `SELECT status, COUNT(*), MIN(created_at),
  COUNT(CASE WHEN ` + sqExpiry + ` <= ` + sqNow + ` AND NOT ` + sqLive + ` THEN 1 END),
  ` + sqNow + `
FROM idempotency_keys GROUP BY status ORDER BY status`

// sqSize sums the pages of the table's b-tree (which holds the primary
// key: WITHOUT ROWID) and of its index, from the dbstat virtual table.
const sqSize = `SELECT (SELECT SUM(pgsize) FROM dbstat(?) WHERE name = ?),
  (SELECT SUM(pgsize) FROM dbstat(?) WHERE name = ?)`

func (sqliteDialect) inserted(n int64, err error) (bool, error) { return n == 1, err }

// SQLite's primary result codes that mean "retry the transaction"; an
// extended code carries one of them in its low byte.
const (
	sqliteBusy   = 5 // SQLITE_BUSY: the write lock was not free within busy_timeout, or a stale snapshot
	sqliteLocked = 6 // SQLITE_LOCKED: a conflict within one connection's shared cache
)

// sqliteErrorPkg is the package of modernc.org/sqlite's *Error. idem
// recognises it by its package and its Code method instead of importing
// the driver: an import would link SQLite into every program that uses
// idem, and register the "sqlite" driver name in it, which panics beside
// another driver that registers that name (such as github.com/glebarez/sqlite).
const sqliteErrorPkg = "modernc.org/sqlite"

// sqliteError is the first modernc.org/sqlite *Error in err's tree, as
// errors.As finds it, or nil.
func sqliteError(err error) interface {
	Code() int
	error
} {
	var e interface {
		Code() int
		error
	}
	if !errors.As(err, &e) {
		return nil
	}
	t := reflect.TypeOf(e)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() != sqliteErrorPkg || t.Name() != "Error" {
		return nil
	}
	return e
}

// retryable reports SQLITE_BUSY and SQLITE_LOCKED, with any extended code,
// from modernc.org/sqlite's *Error.
func (sqliteDialect) retryable(err error) bool {
	e := sqliteError(err)
	if e == nil {
		return false
	}
	switch e.Code() & 0xff {
	case sqliteBusy, sqliteLocked:
		return true
	}
	return false
}

// sqliteErrorCode is SQLITE_ERROR, the primary code of a statement SQLite
// cannot prepare; its message says why.
const sqliteErrorCode = 1

// applied reads SQLite's message for a column that exists; its indexes
// are made and dropped IF NOT EXISTS and IF EXISTS.
func (sqliteDialect) applied(err error) bool {
	e := sqliteError(err)
	return e != nil && e.Code()&0xff == sqliteErrorCode && strings.Contains(e.Error(), "duplicate column name: ")
}

func (sqliteDialect) schemaFault(err error) SchemaFault {
	e := sqliteError(err)
	if e == nil || e.Code()&0xff != sqliteErrorCode {
		return NoSchemaFault
	}
	switch msg := e.Error(); {
	case strings.Contains(msg, "no such table: "):
		return NoTable
	case strings.Contains(msg, "no such column: "), strings.Contains(msg, " has no column named "):
		return missingFault(msg)
	case strings.Contains(msg, "unknown database "):
		return NoSchema
	}
	return NoSchemaFault
}
