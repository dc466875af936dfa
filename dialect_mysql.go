package idem

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"reflect"
	"strconv"
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
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

func (mysqlDialect) Name() string { return "mysql" }

func (mysqlDialect) statements(parts []string) *statements {
	return myStatements(parts, schema.MySQL, myInsert, returning{}, myRead, myReadCompleted, myState)
}

// myStatements are the MySQL family's statements for a table, with the
// migrations, the insert (and what it returns) and the three locking
// reads (read, readCompleted and state) of one database. No claim
// statement returns anything but MariaDB's insert (its token): MySQL has
// no RETURNING, MariaDB none on UPDATE, and LAST_INSERT_ID() must stay
// the caller's; claimed reads the rest.
func myStatements(parts []string, ddl []schema.Migration, insert string, insertReturns returning, read, readCompleted, state string) *statements {
	quoted := "`" + strings.Join(parts, "`.`") + "`"
	return (&statements{
		version:       statement{myVersion, args(argSchema, argBase)},
		insert:        statement{insert, args(argScope, argKey, argOperation, argFingerprint, argLease)},
		insertOwn:     statement{myInsertOwn, args(argScope, argKey, argOperation, argFingerprint, argToken, argLease)},
		takeover:      statement{myTakeover, args(argOperation, argFingerprint, argLease, argScope, argKey, argToken, argRetention)},
		insertReturns: insertReturns,
		claimed:       statement{myClaimed, args(argScope, argKey)},
		read:          statement{read, args(argRetention, argScope, argKey)},
		readCompleted: statement{readCompleted, args(argScope, argKey, argRetention)},
		state:         statement{state, args(argScope, argKey)},
		complete:      statement{myComplete, args(argStatus, argHeader, argBody, argScope, argKey, argToken)},
		extend:        statement{myExtend, args(argLease, argScope, argKey, argToken)},
		release:       statement{myRelease, args(argScope, argKey, argToken)},
		remove:        statement{myRemove, args(argScope, argKey, argToken)},
		purgeWindow:   statement{myPurgeWindow, args(argFrom, argRetention, argRetention, argLimit)},
		purge:         statement{myPurge, args(argFrom, argRetention, argRetention, argLimit)},
		// READ COMMITTED: under REPEATABLE READ a batch locks the gap
		// before the first row past its window (every gap of the primary
		// key, if the optimizer runs it as a full scan), where fresh claims
		// go when no newer record lies between, so each would wait for the
		// batch to commit; READ COMMITTED takes no gap locks. The batch
		// still waits for a row past its window that a transaction holds.
		purgeIsolation: sql.LevelReadCommitted,
		inspect:        statement{myInspect, args(argRetention, argScope, argKey)},
		inspectKey:     statement{myInspectKey, args(argRetention, argKey, argLimit)},
		columns:        columnsProbe,
		stats:          statement{myStats, args(argRetention, argRetention)},
		size:           statement{mySize, args(argSchema, argBase)},
	}).rendered(table{parts: parts, quoted: quoted}, ddl)
}

const myVersion = `SELECT COUNT(*) > 0, COALESCE(MAX(table_comment), '') FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`

// A token is the clock in microseconds since the Unix epoch,
// TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), or
// one more than the token before it, but for a new claim of Do's, whose
// token Do chose (insertOwn).
const myInsert = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))`

const myInsertOwn = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))`

// MySQL evaluates SET from left to right; token is read before it is
// assigned and nothing after it reads it. The WHERE reads the row as last
// committed (an UPDATE's read is a locking one).
const myTakeover = `UPDATE idempotency_keys SET operation = ?, fingerprint = ?, status = 'processing',
  token = GREATEST(token + 1, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
  lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, created_at = UTC_TIMESTAMP(6),
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = ? AND idem_key = ? AND token = ?
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= UTC_TIMESTAMP(6)
    OR status = 'completed' AND completed_at + INTERVAL ? MICROSECOND <= UTC_TIMESTAMP(6))`

// The claim's created_at is its statement's start; claimed runs right
// after that statement.
const myClaimed = `SELECT token, TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

// myReadRecord is read without its locking clause, which TiDB's read
// has another of.
const myReadRecord = `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= UTC_TIMESTAMP(6),
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until),
  response_status, response_headers, response_body
FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

// A shared-lock read sees the latest committed row even when the
// transaction's REPEATABLE READ snapshot is older.
const myRead = myReadRecord + ` LOCK IN SHARE MODE`

// myReadCompletedRecord is readCompleted without its locking clause.
const myReadCompletedRecord = `SELECT operation, fingerprint, response_status, response_headers, response_body
FROM idempotency_keys WHERE scope = ? AND idem_key = ?
  AND status = 'completed' AND completed_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6)`

const myReadCompleted = myReadCompletedRecord + ` LOCK IN SHARE MODE`

const myStateRecord = `SELECT status, token FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

const myState = myStateRecord + ` LOCK IN SHARE MODE`

const myComplete = `UPDATE idempotency_keys SET status = 'completed', completed_at = UTC_TIMESTAMP(6),
  response_status = ?, response_headers = ?, response_body = ?
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myExtend = `UPDATE idempotency_keys
SET lease_until = GREATEST(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, lease_until + INTERVAL 1 MICROSECOND)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myRelease = `UPDATE idempotency_keys SET status = 'released', lease_until = UTC_TIMESTAMP(6)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

const myRemove = `DELETE FROM idempotency_keys WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

// myPurgeWhere picks the records a purge deletes: created at the purge's
// cursor (µs since the Unix epoch) or later, and past retention.
// created_at is never later than completed_at or lease_until, so it bounds
// the scan at both ends: it leads the primary key (schema version 2) or
// has an index of its own.
const myPurgeWhere = `created_at >= '1970-01-01 00:00:00' + INTERVAL ? MICROSECOND
  AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`

const myPurgeWindow = `SELECT COUNT(*), COALESCE(MAX(created_us), 0) FROM (
  SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) AS created_us FROM idempotency_keys
  WHERE ` + myPurgeWhere + `
  ORDER BY created_at LIMIT ?) w`

const myPurge = `DELETE FROM idempotency_keys WHERE ` + myPurgeWhere + `
ORDER BY created_at LIMIT ?`

// myInspectRecord is what inspect and inspectKey read of a record, with
// the retention as its one argument.
const myInspectRecord = `operation, fingerprint, status, token,
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', completed_at), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= UTC_TIMESTAMP(6),
  response_status, response_headers, response_body
FROM idempotency_keys`

const myInspect = `SELECT ` + myInspectRecord + ` WHERE scope = ? AND idem_key = ?`

// scope is VARBINARY: the order is the bytes'.
const myInspectKey = `SELECT scope, ` + myInspectRecord + ` WHERE idem_key = ? ORDER BY scope LIMIT ?`

const myStats = `SELECT status, COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)),
  COUNT(CASE WHEN created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND THEN 1 END),
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
func (mysqlDialect) boundLockWait(ctx context.Context, c conn, d time.Duration, fn func() error) (bool, error) {
	var (
		old             int64
		rollbackWholeTx bool
	)
	if err := c.queryRow(ctx, Query{SQL: `SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_rollback_on_timeout`}, &old, &rollbackWholeTx); err != nil {
		return false, err
	}
	if _, err := c.exec(ctx, Query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{int64((d + time.Second - 1) / time.Second)}}); err != nil {
		return false, err
	}
	err := fn()
	if _, rerr := c.exec(ctx, Query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{old}}); rerr != nil {
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
	if n, ok := mysqlErrno(err); ok && n == erDupEntry {
		return false, nil
	}
	return false, err
}

// schemaFault reads MySQL's error numbers, which MariaDB and TiDB share.
// fix knows nothing better than the messages' own advice.
func (mysqlDialect) fix(error) string { return "" }

func (mysqlDialect) schemaFault(err error) schemaFault {
	n, _ := mysqlErrno(err)
	switch n {
	case erNoSuchTable:
		return noTable
	case erBadField:
		return notIdemTable
	case erBadDB:
		return noSchema
	}
	return noSchemaFault
}

func (mysqlDialect) retryable(err error) bool {
	n, ok := mysqlErrno(err)
	if !ok {
		return false
	}
	switch n {
	case erLockWaitTimeout, erLockDeadlock, erCheckread, erLockNowait:
		return true
	}
	return false
}

// checkSession runs nothing: every InnoDB transaction makes a duplicate
// wait for the claim.
func (mysqlDialect) checkSession(context.Context, conn) error { return nil }

// maxInline bounds the text of a statement whose arguments literals writes
// into it; a statement with larger arguments (a big response body) is sent
// with parameters, whose size only max_allowed_packet limits.
const maxInline = 64 << 10

// literals: every statement through database/sql goes as text.
func (mysqlDialect) literals(c Conn) func(Query) Query {
	if _, ok := c.(interface{ sqlHandle() DBTX }); !ok {
		return nil
	}
	return myLiterals
}

// myLiterals writes the arguments into the query as literals: strings and
// byte slices as hexadecimal literals (X'6869'), which mean the same bytes
// whatever the connection's character set or sql_mode, a nil byte slice as
// NULL, integers in decimal. go-sql-driver/mysql then sends the statement
// as text in one round trip, where with parameters it prepares, executes
// and closes it (two round trips and a statement the server builds and
// frees), unless the DSN sets interpolateParams. The query's only "?" are
// its placeholders: idem's SQL holds no string literal or identifier with
// one.
func myLiterals(q Query) Query {
	size := len(q.SQL)
	for _, a := range q.Args {
		switch v := a.(type) {
		case string:
			size += 3 + hex.EncodedLen(len(v))
		case []byte:
			size += 4 + hex.EncodedLen(len(v))
		case int, int64:
			size += 20
		default:
			return q
		}
	}
	if size > maxInline || strings.Count(q.SQL, "?") != len(q.Args) {
		return q
	}
	var b strings.Builder
	b.Grow(size)
	rest := q.SQL
	for _, a := range q.Args {
		i := strings.IndexByte(rest, '?')
		b.WriteString(rest[:i])
		rest = rest[i+1:]
		switch v := a.(type) {
		case string:
			writeHexLiteral(&b, v)
		case []byte:
			if v == nil {
				b.WriteString("NULL")
			} else {
				writeHexLiteral(&b, v)
			}
		case int:
			var buf [20]byte
			b.Write(strconv.AppendInt(buf[:0], int64(v), 10))
		case int64:
			var buf [20]byte
			b.Write(strconv.AppendInt(buf[:0], v, 10))
		}
	}
	b.WriteString(rest)
	return Query{SQL: b.String()}
}

// writeHexLiteral writes v as MySQL's hexadecimal literal, X'6869'.
func writeHexLiteral[T string | []byte](b *strings.Builder, v T) {
	b.WriteString("X'")
	writeHex(b, v)
	b.WriteByte('\'')
}

// writeHex writes the bytes of v in lowercase hexadecimal.
func writeHex[T string | []byte](b *strings.Builder, v T) {
	const digits = "0123456789abcdef"
	for i := 0; i < len(v); i++ {
		b.WriteByte(digits[v[i]>>4])
		b.WriteByte(digits[v[i]&15])
	}
}
