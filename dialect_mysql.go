package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/idemkit/idem/schema"
)

// MySQL is the dialect for MySQL 8.0+ and MariaDB 10.6+ (InnoDB), through
// github.com/go-sql-driver/mysql.
//
// A duplicate is a plain INSERT that fails with error 1062 after waiting for
// the transaction that holds the key, followed by a shared-lock read (LOCK IN
// SHARE MODE), which sees the latest committed row even when the caller's
// REPEATABLE READ snapshot is older. No INSERT IGNORE: it would turn a
// truncation into a warning. Times are UTC_TIMESTAMP(6), so the session's
// time_zone does not matter.
var MySQL Dialect = mustDialect(mysqlSpec("mysql", mysqlDialect{}.statements))

// mysqlSpec is the DialectSpec of MySQL and MariaDB, which differ in their
// statements.
func mysqlSpec(name string, statements func([]string) *statements) DialectSpec {
	return DialectSpec{
		Name:          name,
		statements:    statements,
		Inserted:      mysqlDialect{}.inserted,
		Retryable:     mysqlDialect{}.retryable,
		Applied:       mysqlDialect{}.applied,
		Fix:           mysqlDialect{}.fix,
		CausalReads:   mysqlDialect{}.causalReads,
		SchemaFault:   mysqlDialect{}.schemaFault,
		literals:      mysqlDialect{}.literals,
		boundLockWait: mysqlDialect{}.boundLockWait,
		// No CheckSession: every InnoDB transaction makes a duplicate
		// wait for the claim.
	}
}

type mysqlDialect struct{}

func (mysqlDialect) statements(parts []string) *statements {
	return galera(myStatements(parts, schema.MySQL, myInsert, Returning{}, myShareLock), myOnMariaDB(galeraCausal))
}

// myOnMariaDB is prefix in MariaDB's executable comment: MariaDB runs
// it, MySQL reads a comment (see galera).
func myOnMariaDB(prefix string) string { return "/*M! " + prefix + "*/ " }

// The locking clauses of the reads that must see the latest committed
// row whatever the transaction's snapshot: a shared-lock read on MySQL
// and MariaDB, FOR UPDATE on TiDB (see TiDB).
const (
	myShareLock = ` LOCK IN SHARE MODE`
	myForUpdate = ` FOR UPDATE`
)

// myStatements are the MySQL family's statements for a table, with the
// migrations, the insert (and what it returns) and the locking clause of
// the reads (Read, ReadCompleted and State) of one database. No claim
// statement returns anything but MariaDB's insert (its token): MySQL has
// no RETURNING, MariaDB none on UPDATE, and LAST_INSERT_ID() must stay
// the caller's; claimed reads the rest.
func myStatements(parts []string, ddl []schema.Migration, insert string, insertReturns Returning, lock string) *statements {
	quoted := "`" + strings.Join(parts, "`.`") + "`"
	expiry := args(ArgRetention, ArgKeyMemory, ArgRetention, ArgRetention) // myForgotten, myExpired
	return (&statements{
		Statements: Statements{
			Version:       Statement{myVersion, args(ArgSchema, ArgBase)},
			Insert:        Statement{insert, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgLease, ArgExpiry)},
			InsertOwn:     Statement{myInsertOwn, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry)},
			InsertDone:    Statement{myInsertDone, args(ArgScope, ArgKey, ArgOperation, ArgFingerprint, ArgToken, ArgLease, ArgExpiry, ArgExpiry, ArgMemory, ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgRef)},
			Takeover:      Statement{myTakeover, args(ArgOperation, ArgFingerprint, ArgLease, ArgExpiry, ArgScope, ArgKey, ArgToken, ArgRetention, ArgKeyMemory)},
			InsertReturns: insertReturns,
			Claimed:       Statement{myClaimed, args(ArgScope, ArgKey)},
			Read:          Statement{myRead + lock, append(expiry, ArgScope, ArgKey)},
			ReadCompleted: Statement{myReadCompleted + lock, args(ArgRetention, ArgScope, ArgKey, ArgRetention)},
			State:         Statement{myState + lock, args(ArgScope, ArgKey)},
			Complete:      Statement{myComplete, args(ArgStatus, ArgHeader, ArgBody, ArgSealedKey, ArgRef, ArgKeep, ArgKeep, ArgMemory, ArgKeep, ArgKeep, ArgScope, ArgKey, ArgToken)},
			Extend:        Statement{myExtend, args(ArgLease, ArgScope, ArgKey, ArgToken)},
			Release:       Statement{myRelease, args(ArgScope, ArgKey, ArgToken)},
			Remove:        Statement{myRemove, args(ArgScope, ArgKey, ArgToken)},
			PurgeWindow:   Statement{myPurgeWindow, args(ArgKeyMemory, ArgFrom, ArgLimit)},
			Purge:         Statement{myPurge, args(ArgFrom, ArgKeyMemory, ArgLimit)},
			Strip:         Statement{myStrip, args(ArgKeyMemory, ArgFrom, ArgTo, ArgKeyMemory, ArgLimit)},
			LegacyWindow:  Statement{myLegacyWindow, args(ArgFrom, ArgRetention, ArgKeyMemory, ArgRetention, ArgLimit)},
			LegacyPurge:   Statement{myLegacyPurge, args(ArgFrom, ArgRetention, ArgKeyMemory, ArgRetention, ArgLimit)},
			// READ COMMITTED: under REPEATABLE READ a batch locks the gap
			// before the first row past its window (every gap of the index, if
			// the optimizer runs it as a full scan), where fresh claims go when
			// no newer record lies between, so each would wait for the batch
			// to commit; READ COMMITTED takes no gap locks. A batch whose
			// purge or strip meets a row a transaction holds runs purgeHeld
			// and stripHeld instead, which pass over it.
			PurgeIsolation:    sql.LevelReadCommitted,
			ResealRead:        Statement{myResealRead, args(ArgFrom, ArgSealedKey, ArgLimit)},
			ResealWrite:       Statement{myResealWrite, args(ArgBody, ArgSealedKey, ArgScope, ArgKey, ArgToken)},
			ResealLeft:        Statement{myResealLeft, args(ArgSealedKey)},
			Inspect:           Statement{myInspect, append(append(expiry, ArgRetention), ArgScope, ArgKey)},
			InspectKey:        Statement{myInspectKey, append(append(expiry, ArgRetention), ArgKey, ArgLimit)},
			Stats:             Statement{myStats, args(ArgRetention)},
			Size:              Statement{mySize, args(ArgSchema, ArgBase)},
			NoReplicationWait: myNoReplicationWait,
		},
		purgeHeld: Statement{myPurgeHeld, args(ArgFrom, ArgKeyMemory, ArgLimit)},
		stripHeld: Statement{myStripHeld, args(ArgFrom, ArgTo, ArgKeyMemory, ArgLimit, ArgKeyMemory)},
		columns:   columnsProbe,
	}).rendered(parts, quoted, nil, ddl)
}

// myNoReplicationWait is what MySQL and MariaDB offer in place of
// WaitReplicated: the server itself holds each COMMIT until a replica
// has the transaction.
const myNoReplicationWait = "on MySQL and MariaDB use semi-synchronous replication instead: rpl_semi_sync_master_enabled=ON " +
	"(rpl_semi_sync_source_enabled on MySQL 8.0.26+) with rpl_semi_sync_master_wait_point=AFTER_SYNC, so that no other session " +
	"reads a commit before a replica has it, and a rpl_semi_sync_master_timeout longer than your answers' deadline, " +
	"past which the primary falls back to asynchronous replication silently; see docs/replication.md"

const myVersion = `SELECT COUNT(*) > 0, COALESCE(MAX(table_comment), '') FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`

// A token is the clock in microseconds since the Unix epoch,
// TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), or
// one more than the token before it, but for a new claim of Do's, whose
// token Do chose (InsertOwn). forget_at, NULL until the completion, is
// named so that on a table of a schema version before it the claim fails
// before fn runs, with the advice to migrate.
const myInsert = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES (?, ?, ?, ?, 'processing', TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, NULL)`

const myInsertOwn = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at, forget_at)
VALUES (?, ?, ?, ?, 'processing', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, NULL)`

const myInsertDone = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at, expires_at,
  forget_at, completed_at, response_status, response_headers, response_body, sealed_key, result_ref)
VALUES (?, ?, ?, ?, 'completed', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), ?, ?, ?, ?, ?)`

// MySQL evaluates SET from left to right; token is read before it is
// assigned and nothing after it reads it. The WHERE reads the row as last
// committed (an UPDATE's read is a locking one). A record without an
// expiry (written before schema version 3) expires by the Store's
// retention; a completed one is kept to its forget time, or where it has
// none for the Store's key memory past its expiry.
const myTakeover = `UPDATE idempotency_keys SET operation = ?, fingerprint = ?, status = 'processing',
  token = GREATEST(token + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, created_at = UTC_TIMESTAMP(6),
  expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
  forget_at = NULL, completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL, sealed_key = NULL, result_ref = NULL
WHERE scope = ? AND idem_key = ? AND token = ?
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= UTC_TIMESTAMP(6)
    OR status = 'completed' AND (CASE WHEN forget_at >= expires_at THEN forget_at
      ELSE COALESCE(expires_at, completed_at + INTERVAL ? MICROSECOND) + INTERVAL ? MICROSECOND END) <= UTC_TIMESTAMP(6)
    OR status = 'expired' AND expires_at <= UTC_TIMESTAMP(6))`

// The claim's created_at is its statement's start; claimed runs right
// after that statement.
const myClaimed = `SELECT token, TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

// myLive is whether a record is a claim with a live lease, which no
// expiry makes absent: a retention shorter than the lease.
const myLive = `(status = 'processing' AND lease_until > UTC_TIMESTAMP(6))`

// myExpiry is a record's expiry, by the Store's retention where it has
// none of its own.
const myExpiry = `COALESCE(expires_at, (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND)`

// myForgotten and myExpired are whether a record counts as absent (past
// its expiry; a completed one also past its forget time, forget_at, or
// where it has none, a row of a release before schema version 5, past
// the Store's key memory after its expiry, as where its forget time is
// earlier than its expiry (not its own: see pgForget); a tombstone, whose
// expires_at
// is its forget time, past that; never a live claim), and whether its
// response is gone (past its expiry, or a tombstone): with the retention,
// the key memory, the retention and the retention.
const (
	myForgotten = `((CASE WHEN status = 'completed' THEN (CASE WHEN forget_at >= expires_at THEN forget_at ELSE ` + myExpiry + ` + INTERVAL ? MICROSECOND END)
    WHEN status = 'expired' THEN expires_at ELSE ` + myExpiry + ` END) <= UTC_TIMESTAMP(6) AND NOT ` + myLive + `)`
	myExpired = `(status = 'expired' OR status = 'completed' AND ` + myExpiry + ` <= UTC_TIMESTAMP(6))`
)

// myRead, myReadCompleted and myState are Read, ReadCompleted and State
// without their locking clause, which is the database's.
const (
	myRead = `SELECT operation, fingerprint, status, token, ` + myForgotten + `, ` + myExpired + `,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until),
  response_status, response_headers, response_body, sealed_key, result_ref
FROM idempotency_keys WHERE scope = ? AND idem_key = ?`
	myReadCompleted = `SELECT operation, fingerprint, response_status, response_headers, response_body, sealed_key,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), COALESCE(expires_at, completed_at + INTERVAL ? MICROSECOND)), result_ref
FROM idempotency_keys WHERE scope = ? AND idem_key = ?
  AND status = 'completed' AND COALESCE(expires_at, completed_at + INTERVAL ? MICROSECOND) > UTC_TIMESTAMP(6)`
	myState = `SELECT status, token FROM idempotency_keys WHERE scope = ? AND idem_key = ?`
)

// Do's completion (a NULL retention) leaves expires_at as it was: the
// update changes no indexed column. A Claim's moves it to the retention
// from now only where that is later than the expiry its Begin gave it (the
// lease's end plus the retention): a completion within the lease leaves
// it too. forget_at (unindexed) is that expiry plus the request's key
// memory: set before expires_at, so that it reads the expiry as the row
// had it whether SET reads the columns as the assignments before left
// them (MySQL's way) or as the row had them (MariaDB's
// SIMULTANEOUS_ASSIGNMENT). On schema version 4, where expires_at
// leads the primary key,
// moving it moves the record, and its entry in the unique index, whose
// duplicate check locks the entry after it: completions of neighbouring
// keys at once deadlocked when each moved its expiry.
const myComplete = `UPDATE idempotency_keys SET status = 'completed', completed_at = UTC_TIMESTAMP(6),
  response_status = ?, response_headers = ?, response_body = ?, sealed_key = ?, result_ref = ?,
  forget_at = (CASE WHEN expires_at >= UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND THEN expires_at
    ELSE COALESCE(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at) END) + INTERVAL ? MICROSECOND,
  expires_at = CASE WHEN expires_at >= UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND THEN expires_at
    ELSE COALESCE(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at) END
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myExtend = `UPDATE idempotency_keys
SET lease_until = GREATEST(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, lease_until + INTERVAL 1 MICROSECOND)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myRelease = `UPDATE idempotency_keys SET status = 'released', lease_until = UTC_TIMESTAMP(6)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myRemove = `DELETE FROM idempotency_keys WHERE scope = ? AND idem_key = ? AND token = ?`

// myDue picks the records whose expiry has come, from the purge's cursor
// (µs since the Unix epoch) on, in the order of expires_at: the primary
// key's (schema version 4), or its index's (TiDB; MySQL's version 3).
const myDue = `expires_at >= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AND expires_at <= UTC_TIMESTAMP(6)`

// myPurgeWindow reads the rows of the clustered index, whole: counting
// those kept costs no more reads.
const myPurgeWindow = `SELECT COUNT(*), COALESCE(MAX(expires_us), 0), COALESCE(SUM(kept), 0) FROM (
  SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) AS expires_us, ` + myKept + ` AS kept FROM idempotency_keys
  WHERE ` + myDue + `
  ORDER BY expires_at LIMIT ?) w`

// myKept is whether a due record keeps its key past its expiry: it is
// completed and its forget time (its own, or its expiry plus the Store's
// key memory) is ahead.
const myKept = `(status = 'completed' AND ` + myForgetDue + ` > UTC_TIMESTAMP(6))`

// myForgetDue is a due record's forget time where it is completed: its
// own (see pgForgetDue), or its expiry plus the Store's key memory.
const myForgetDue = `(CASE WHEN forget_at >= expires_at THEN forget_at ELSE expires_at + INTERVAL ? MICROSECOND END)`

// myPurge deletes the due records but those kept, oldest first: a range
// of the primary key (schema version 4's). A record first met after its
// forget time is deleted whole.
const myPurge = `DELETE FROM idempotency_keys WHERE ` + myDue + ` AND NOT ` + myKept + ` AND NOT ` + myLive + `
ORDER BY expires_at LIMIT ?`

// myStrip makes tombstones of the kept records of the window, up to its
// last expiry: the scan stops there even where none is kept. A
// tombstone's expires_at is its forget time.
const myStrip = `UPDATE idempotency_keys SET status = 'expired', response_headers = NULL, response_body = NULL, sealed_key = NULL,
  expires_at = ` + myForgetDue + `
WHERE ` + myDue + ` AND expires_at <= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AND ` + myKept + `
ORDER BY expires_at LIMIT ?`

// myPurgeHeld and myStripHeld are myPurge and myStrip that pass over the
// rows a transaction holds, where those wait for them (a DELETE or UPDATE
// has no SKIP LOCKED): they choose their rows in a derived table that
// reads them FOR UPDATE SKIP LOCKED (MySQL 8.0, MariaDB 10.6), then, by
// STRAIGHT_JOIN, find each by its primary key (joined the other way
// round, the statement scanned the table for the rows to join, and waited
// for a held one). A multi-table DELETE defers its deletions: on 100,000
// due records in one batch it took 2.1 s where myPurge took 0.4 s, so
// these run only after myPurge or myStrip met a held row (purge.go).
const (
	myPurgeHeld = `DELETE t FROM (
  SELECT expires_at, scope, idem_key FROM idempotency_keys WHERE ` + myDue + ` AND NOT ` + myKept + ` AND NOT ` + myLive + `
  ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED) d
STRAIGHT_JOIN idempotency_keys t ON t.expires_at = d.expires_at AND t.scope = d.scope AND t.idem_key = d.idem_key`

	myStripHeld = `UPDATE (
  SELECT expires_at, scope, idem_key FROM idempotency_keys WHERE ` + myDue + `
    AND expires_at <= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AND ` + myKept + `
  ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED) d
STRAIGHT_JOIN idempotency_keys t ON t.expires_at = d.expires_at AND t.scope = d.scope AND t.idem_key = d.idem_key
SET t.status = 'expired', t.response_headers = NULL, t.response_body = NULL, t.sealed_key = NULL,
  t.expires_at = CASE WHEN t.forget_at >= t.expires_at THEN t.forget_at ELSE t.expires_at + INTERVAL ? MICROSECOND END`
)

// myLegacyWhere picks the records without an expiry that are past the
// Store's retention (a completed one also past the key memory), created
// at the legacy cursor (µs since the Unix epoch) or later. created_at is
// never later than completed_at or lease_until, so it bounds the scan at
// both ends: it leads the primary key (schema versions 2 and 3) or has an
// index of its own (TiDB). MySQL's version 4 has no such record: its
// migration gives each an expiry, and expires_at is NOT NULL, so the
// optimizer reads nothing for these statements.
const myLegacyWhere = `expires_at IS NULL
  AND created_at >= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
  AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND (CASE WHEN status = 'completed' THEN completed_at + INTERVAL ? MICROSECOND ELSE lease_until END) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`

const myLegacyWindow = `SELECT COUNT(*), COALESCE(MAX(created_us), 0) FROM (
  SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) AS created_us FROM idempotency_keys
  WHERE ` + myLegacyWhere + `
  ORDER BY created_at LIMIT ?) w`

const myLegacyPurge = `DELETE FROM idempotency_keys WHERE ` + myLegacyWhere + `
ORDER BY created_at LIMIT ?`

const myResealRead = `SELECT scope, idem_key, operation, token, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at),
  COALESCE(sealed_key, ''), response_headers, response_body
FROM idempotency_keys
WHERE expires_at >= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND AND expires_at > UTC_TIMESTAMP(6)
  AND status = 'completed' AND NOT (sealed_key <=> ?)
ORDER BY expires_at LIMIT ? FOR UPDATE`

const myResealLeft = `SELECT COUNT(*) FROM idempotency_keys
WHERE expires_at > UTC_TIMESTAMP(6) AND status = 'completed' AND NOT (sealed_key <=> ?)`

const myResealWrite = `UPDATE idempotency_keys SET response_headers = NULL, response_body = ?, sealed_key = ?
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'completed'`

// myInspectRecord is what Inspect and InspectKey read of a record, with
// the arguments of myForgotten and myExpired, then the retention.
const myInspectRecord = `operation, fingerprint, status, token,
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', completed_at), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  ` + myForgotten + `, ` + myExpired + `, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ` + myExpiry + `),
  response_status, response_headers, response_body, COALESCE(sealed_key, ''), result_ref
FROM idempotency_keys`

const myInspect = `SELECT ` + myInspectRecord + ` WHERE scope = ? AND idem_key = ?`

// scope is VARBINARY: the order is the bytes'.
const myInspectKey = `SELECT scope, ` + myInspectRecord + ` WHERE idem_key = ? ORDER BY scope LIMIT ?`

const myStats = `SELECT status, COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)),
  COUNT(CASE WHEN ` + myExpiry + ` <= UTC_TIMESTAMP(6) AND NOT ` + myLive + ` THEN 1 END),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
FROM idempotency_keys GROUP BY status ORDER BY status`

// mySize reads information_schema, whose figures InnoDB refreshes from
// time to time (ANALYZE TABLE refreshes them at once). The primary key is
// the table's clustered index, so it counts in the table's bytes.
const mySize = `SELECT data_length, index_length FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`

// boundLockWait sets innodb_lock_wait_timeout to d, rounded up to whole
// seconds, for fn and sets it back afterwards, whatever fn returned. A lock
// wait timeout rolls back only the statement that waited (unless the server
// runs with innodb_rollback_on_timeout, which rolls back the whole
// transaction: then the error is passed on as it is, and IsRetryable
// reports it), and idem writes nothing before its last statement, so the
// transaction is left as it was before fn.
func (mysqlDialect) boundLockWait(ctx context.Context, c Conn, d time.Duration, fn func() error) (bool, error) {
	var (
		old             int64
		rollbackWholeTx bool
	)
	if err := c.QueryRow(ctx, Query{SQL: `SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_rollback_on_timeout`}, &old, &rollbackWholeTx); err != nil {
		return false, err
	}
	if _, err := c.Exec(ctx, Query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{int64((d + time.Second - 1) / time.Second)}}); err != nil {
		return false, err
	}
	err := fn()
	if _, rerr := c.Exec(ctx, Query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{old}}); rerr != nil {
		return false, errors.Join(err, rerr)
	}
	n, ok := mysqlErrno(err)
	return ok && n == erLockWaitTimeout && !rollbackWholeTx, err
}

// mysqlErrorPkg and mysqlErrorType name github.com/go-sql-driver/mysql's
// *MySQLError. idem recognises it by its package, name and Number field
// instead of importing the driver: an import would link the driver into
// every program that uses idem and register the "mysql" driver name there,
// which panics beside another driver (or a test's mock) of that name.
const (
	mysqlErrorPkg  = "github.com/go-sql-driver/mysql"
	mysqlErrorType = "MySQLError"
)

// mysqlErrno returns the Number of the first *mysql.MySQLError in err's
// tree, as errors.As would find it.
func mysqlErrno(err error) (uint16, bool) {
	for err != nil {
		if v := reflect.ValueOf(err); v.Kind() == reflect.Pointer && !v.IsNil() {
			if e := v.Elem(); e.Kind() == reflect.Struct && e.Type().PkgPath() == mysqlErrorPkg && e.Type().Name() == mysqlErrorType {
				if f := e.FieldByName("Number"); f.IsValid() && f.CanUint() {
					return uint16(f.Uint()), true
				}
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if n, ok := mysqlErrno(e); ok {
					return n, true
				}
			}
			return 0, false
		default:
			return 0, false
		}
	}
	return 0, false
}

// MySQL error numbers idem reads.
const (
	erBadDB           = 1049 // ER_BAD_DB_ERROR: unknown database (a schema-qualified table's schema)
	erBadField        = 1054 // ER_BAD_FIELD_ERROR: unknown column
	erDupFieldName    = 1060 // ER_DUP_FIELDNAME: the column exists
	erDupKeyName      = 1061 // ER_DUP_KEYNAME: the index exists
	erCantDropKey     = 1091 // ER_CANT_DROP_FIELD_OR_KEY: the column or index to drop does not exist
	erNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	erDupEntry        = 1062
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	erCheckread       = 1020 // MariaDB: "Record has changed since last read" (innodb_snapshot_isolation)
	erLockNowait      = 3572 // MySQL 8: NOWAIT could not lock
)

func (mysqlDialect) inserted(_ int64, err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	switch n, _ := mysqlErrno(err); n {
	case erDupEntry:
		return false, nil
	case erSubqueryRows: // galeraGuard
		return false, fmt.Errorf("%w (%w)", errGaleraTxMode, err)
	case erRegexp: // galeraCausalGuard
		return false, fmt.Errorf("%w (%w)", errGaleraCausal, err)
	}
	return false, err
}

// fix names where to run a transaction again that a Galera node refused
// (1047); for the other errors it knows nothing better than the
// messages' own advice.
func (mysqlDialect) fix(err error) string {
	if errors.Is(err, errGaleraTxMode) {
		return galeraTxModeFix
	}
	if errors.Is(err, errGaleraCausal) {
		return galeraCausalFix
	}
	if n, _ := mysqlErrno(err); n == wsrepNotReady {
		return galeraFix
	}
	return ""
}

// applied reads MySQL's error numbers, which MariaDB and TiDB share.
func (mysqlDialect) applied(err error) bool {
	n, _ := mysqlErrno(err)
	return n == erDupFieldName || n == erDupKeyName || n == erCantDropKey
}

func (mysqlDialect) schemaFault(err error) SchemaFault {
	n, _ := mysqlErrno(err)
	switch n {
	case erNoSuchTable:
		return NoTable
	case erBadField:
		return missingFault(err.Error())
	case erBadDB:
		return NoSchema
	}
	return NoSchemaFault
}

// retryable reports, beside InnoDB's, a Galera node that refused the
// statement (1047): nothing ran, and a new connection may reach another
// node. Galera's certification failures and brute-force aborts are 1213.
func (mysqlDialect) retryable(err error) bool {
	n, ok := mysqlErrno(err)
	if !ok {
		return false
	}
	switch n {
	case erLockWaitTimeout, erLockDeadlock, erCheckread, erLockNowait, wsrepNotReady:
		return true
	}
	return false
}

// causalReads refuses a session on a Galera node whose transactions do
// not wait, at their start, for the node to apply what the cluster
// committed before. A causal wait set for one statement (galeraCausal)
// holds for a statement outside a transaction, and for the first of
// one, only. Measured on MariaDB 10.11.19 and galera 26.4.23, a read on
// node B right after a commit on node A, 300 times: outside a
// transaction it missed the row 14 times without the setting and never
// with it for the statement; inside a transaction, with it for the
// statement, a locking read missed it twice and an UPDATE missed it (or
// was aborted) 64 times; with it set for the session before BEGIN,
// never. So a Claim's Complete, in the caller's transaction on another
// node than its Begin's, needs the session's own causal reads: its
// transaction then begins once its node has applied the claim.
func (mysqlDialect) causalReads(ctx context.Context, c Conn) error {
	var off bool
	if err := c.QueryRow(ctx, Query{SQL: galeraCausalOff}, &off); err != nil {
		return &Error{Op: "read the Galera session's settings", Err: err, Hint: hintRollBack}
	}
	if !off {
		return nil
	}
	return &Error{Op: "check the Galera session's settings", Err: errGaleraCausal, Hint: galeraCausalFix}
}

// MariaDB is the dialect for MariaDB 10.6+, through
// github.com/go-sql-driver/mysql: MySQL's table, statements, locking and
// errors (see [MySQL], which runs on MariaDB too), with one statement
// fewer for each new claim of Begin's. Its INSERT returns the claim's
// token (INSERT ... RETURNING, which MySQL lacks), where MySQL reads it
// back with a SELECT after the INSERT. (Do's claim of a new key needs
// neither: it carries a token Do chose.) The RETURNING clause reads no
// auto-increment value and sets none, so LAST_INSERT_ID() stays the
// caller's.
//
// The INSERT does not return how long it waited for the key: MariaDB's
// clock functions are the statement's start throughout it. Begin, which
// needs that to count its lease from the grant, reads it as MySQL does.
var MariaDB Dialect = mustDialect(mysqlSpec("mariadb", mariadbDialect{}.statements))

type mariadbDialect struct{ mysqlDialect }

func (mariadbDialect) statements(parts []string) *statements {
	return galera(myStatements(parts, schema.MySQL, mariadbInsert, Returning{Token: true}, myShareLock), galeraCausal)
}

// mariadbInsert is MySQL's insert, returning the token.
const mariadbInsert = myInsert + `
RETURNING token`
