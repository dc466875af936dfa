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

func (mysqlDialect) quote(parts []string) string {
	return "`" + strings.Join(parts, "`.`") + "`"
}

func (m mysqlDialect) schema(parts []string) []string {
	return schemaStatements(schema.MySQL, m.quote(parts), parts[len(parts)-1])
}

const (
	myNow   = "UTC_TIMESTAMP(6)"
	myToken = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + myNow + ")"
)

// myEpoch is a DATETIME(6) column (UTC) in microseconds since the Unix epoch.
func myEpoch(col string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
}

func (mysqlDialect) queries(t string) queries {
	const fenced = ` WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`
	return queries{
		insert: `INSERT INTO ` + t + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', ` + myToken + `, ` + myNow + ` + INTERVAL ? MICROSECOND, ` + myNow + `)`,
		get: `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= ` + myNow + `,
  TIMESTAMPDIFF(MICROSECOND, ` + myNow + `, lease_until),
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = ? AND idem_key = ? LOCK IN SHARE MODE`,
		// MySQL evaluates SET from left to right; token is read before it
		// is assigned and nothing after it reads it. The WHERE reads the row
		// as last committed (an UPDATE's read is a locking one).
		takeover: `UPDATE ` + t + ` SET operation = ?, fingerprint = ?, status = 'processing',
  token = GREATEST(token + 1, ` + myToken + `), lease_until = ` + myNow + ` + INTERVAL ? MICROSECOND, created_at = ` + myNow + `,
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = ? AND idem_key = ? AND token = ?
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= ` + myNow + `
    OR status = 'completed' AND completed_at + INTERVAL ? MICROSECOND <= ` + myNow + `)`,
		// The claim's created_at is its statement's start; this runs right
		// after that statement.
		token: `SELECT token, TIMESTAMPDIFF(MICROSECOND, created_at, ` + myNow + `) FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
		state: `SELECT status, token FROM ` + t + ` WHERE scope = ? AND idem_key = ? LOCK IN SHARE MODE`,
		completeClaim: `UPDATE ` + t + ` SET status = 'completed', completed_at = ` + myNow + `,
  response_status = ?, response_headers = ?, response_body = ?` + fenced,
		extend:  `UPDATE ` + t + ` SET lease_until = GREATEST(` + myNow + ` + INTERVAL ? MICROSECOND, lease_until + INTERVAL 1 MICROSECOND)` + fenced,
		release: `UPDATE ` + t + ` SET status = 'released', lease_until = ` + myNow + fenced,
		remove:  `DELETE FROM ` + t + fenced,
		inspect: `SELECT operation, fingerprint, status, token,
  ` + myEpoch("lease_until") + `, ` + myEpoch("created_at") + `, ` + myEpoch("completed_at") + `, ` + myToken + `,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= ` + myNow + `,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
		stats: `SELECT status, COUNT(*), MIN(` + myEpoch("created_at") + `),
  COUNT(CASE WHEN created_at <= ` + myNow + ` - INTERVAL ? MICROSECOND
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + myNow + ` - INTERVAL ? MICROSECOND THEN 1 END),
  ` + myToken + `
FROM ` + t + ` GROUP BY status ORDER BY status`,
		// created_at is never later than completed_at or lease_until, so
		// its index bounds the scan.
		purge: `DELETE FROM ` + t + `
WHERE created_at <= ` + myNow + ` - INTERVAL ? MICROSECOND
  AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + myNow + ` - INTERVAL ? MICROSECOND
ORDER BY created_at LIMIT ?`,
		// Under REPEATABLE READ, a batch the optimizer runs as a full scan
		// (a batch near the table's size) locks every gap of the primary
		// key, so each fresh claim waits for the batch to commit; READ
		// COMMITTED takes no gap locks.
		purgeIsolation: sql.LevelReadCommitted,
		// innodb_lock_wait_timeout is a session variable in whole seconds.
		// lockWaitSave reads it and whether a timeout rolls back the whole
		// transaction; lockWaitSet and lockWaitRestore set it (arg: seconds).
		lockWaitSave:    `SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_rollback_on_timeout`,
		lockWaitSet:     `SET SESSION innodb_lock_wait_timeout = ?`,
		lockWaitRestore: `SET SESSION innodb_lock_wait_timeout = ?`,
	}
}

// size reads information_schema, whose figures InnoDB refreshes from time
// to time (ANALYZE TABLE refreshes them at once). The primary key is the
// table's clustered index, so it counts in the table's bytes.
func (mysqlDialect) size(parts []string) (string, []any) {
	var schema any
	if len(parts) == 2 {
		schema = parts[0]
	}
	return `SELECT data_length, index_length FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`, []any{schema, parts[len(parts)-1]}
}

// boundLockWait sets innodb_lock_wait_timeout to d, rounded up to whole
// seconds, for fn and sets it back afterwards, whatever fn returned. A lock
// wait timeout rolls back only the statement that waited (unless the server
// runs with innodb_rollback_on_timeout, which rolls back the whole
// transaction: then the error is passed on as it is, and IsRetryable
// reports it), and idem writes nothing before its last statement, so the
// transaction is left as it was before fn.
func (mysqlDialect) boundLockWait(ctx context.Context, db DBTX, q queries, d time.Duration, fn func() error) (bool, error) {
	var (
		old             int64
		rollbackWholeTx bool
	)
	if err := db.QueryRowContext(ctx, q.lockWaitSave).Scan(&old, &rollbackWholeTx); err != nil {
		return false, err
	}
	if _, err := db.ExecContext(ctx, q.lockWaitSet, int64((d+time.Second-1)/time.Second)); err != nil {
		return false, err
	}
	err := fn()
	if _, rerr := db.ExecContext(ctx, q.lockWaitRestore, old); rerr != nil {
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
	erDupEntry        = 1062
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	erCheckread       = 1020 // MariaDB: "Record has changed since last read" (innodb_snapshot_isolation)
	erLockNowait      = 3572 // MySQL 8: NOWAIT could not lock
)

func (mysqlDialect) inserted(_ sql.Result, err error) (bool, error) {
	if err == nil {
		return true, nil
	}
	if n, ok := mysqlErrno(err); ok && n == erDupEntry {
		return false, nil
	}
	return false, err
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

// maxInline bounds the text of a statement whose arguments inline writes
// into it; a statement with larger arguments (a big response body) is sent
// with parameters, whose size only max_allowed_packet limits.
const maxInline = 64 << 10

// inline writes the arguments into the query as literals: strings and
// byte slices as hexadecimal literals (X'6869'), which mean the same bytes
// whatever the connection's character set or sql_mode, a nil byte slice as
// NULL, integers in decimal. go-sql-driver/mysql then sends the statement
// as text in one round trip, where with parameters it prepares, executes
// and closes it (two round trips and a statement the server builds and
// frees), unless the DSN sets interpolateParams. The query's only "?" are
// its placeholders: idem's SQL holds no string literal or identifier with
// one.
func (mysqlDialect) inline(query string, args []any) (string, []any) {
	size := len(query)
	for _, a := range args {
		switch v := a.(type) {
		case string:
			size += 3 + hex.EncodedLen(len(v))
		case []byte:
			size += 4 + hex.EncodedLen(len(v))
		case int, int64:
			size += 20
		default:
			return query, args
		}
	}
	if size > maxInline || strings.Count(query, "?") != len(args) {
		return query, args
	}
	b := make([]byte, 0, size)
	for _, a := range args {
		i := strings.IndexByte(query, '?')
		b = append(b, query[:i]...)
		query = query[i+1:]
		switch v := a.(type) {
		case string:
			b = appendHex(b, v)
		case []byte:
			if v == nil {
				b = append(b, "NULL"...)
			} else {
				b = appendHex(b, v)
			}
		case int:
			b = strconv.AppendInt(b, int64(v), 10)
		case int64:
			b = strconv.AppendInt(b, v, 10)
		}
	}
	return string(append(b, query...)), nil
}

func appendHex[T string | []byte](b []byte, v T) []byte {
	const digits = "0123456789abcdef"
	b = append(b, "X'"...)
	for i := 0; i < len(v); i++ {
		b = append(b, digits[v[i]>>4], digits[v[i]&15])
	}
	return append(b, '\'')
}
