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

	"github.com/idemkit/idem/internal/driver"
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

func (mysqlDialect) statements(parts []string) statements {
	return newMyStatements(parts, schema.MySQL, myInsert, myRead, myReadCompleted, myState)
}

// newMyStatements renders the MySQL family's statements for a table, with
// the migrations, the insert and the three locking reads (read,
// readCompleted and state) of one database.
func newMyStatements(parts []string, ddl []schema.Migration, insert, read, readCompleted, state string) *myStatements {
	quoted := "`" + strings.Join(parts, "`.`") + "`"
	base := parts[len(parts)-1]
	r := func(sql string) string { return render(sql, quoted, base) }
	var schemaName any
	if len(parts) == 2 {
		schemaName = parts[0]
	}
	return &myStatements{
		steps:            migrationStatements(ddl, quoted, base),
		schemaName:       schemaName,
		base:             base,
		insertSQL:        r(insert),
		insertOwnSQL:     r(myInsertOwn),
		takeoverSQL:      r(myTakeover),
		claimedSQL:       r(myClaimed),
		readSQL:          r(read),
		readCompletedSQL: r(readCompleted),
		stateSQL:         r(state),
		completeSQL:      r(myComplete),
		extendSQL:        r(myExtend),
		releaseSQL:       r(myRelease),
		removeSQL:        r(myRemove),
		purgeSQL:         r(myPurge),
		purgeWindowSQL:   r(myPurgeWindow),
		inspectSQL:       r(myInspect),
		inspectKeySQL:    r(myInspectKey),
		columnsSQL:       r(columnsProbe),
		statsSQL:         r(myStats),
	}
}

// myStatements are the statements for one table, rendered once.
type myStatements struct {
	steps      [][]string
	schemaName any // nil: the connection's database
	base       string
	insertSQL, insertOwnSQL, takeoverSQL, claimedSQL, readSQL, readCompletedSQL, stateSQL, completeSQL,
	extendSQL, releaseSQL, removeSQL, purgeWindowSQL, purgeSQL, inspectSQL, inspectKeySQL, columnsSQL, statsSQL string
	insertReturnsToken bool // insertSQL returns the token (MariaDB)
}

func (s *myStatements) migrations() [][]string { return s.steps }

func (s *myStatements) version() query {
	return query{SQL: `SELECT COUNT(*) > 0, COALESCE(MAX(table_comment), '') FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`, Args: []any{s.schemaName, s.base}}
}

// A token is the clock in microseconds since the Unix epoch,
// TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), or
// one more than the token before it, but for a new claim of Do's, whose
// token Do chose (insertOwn).
const myInsert = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))`

func (s *myStatements) insert(r Request, lease int64) query {
	return query{SQL: s.insertSQL, Args: []any{r.Scope, r.Key, r.Operation, r.Fingerprint, lease}}
}

const myInsertOwn = `INSERT INTO idempotency_keys (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6))`

func (s *myStatements) insertOwn(r Request, token, lease int64) query {
	return query{SQL: s.insertOwnSQL, Args: []any{r.Scope, r.Key, r.Operation, r.Fingerprint, token, lease}}
}

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

func (s *myStatements) takeover(r Request, token, lease, retention int64) query {
	return query{SQL: s.takeoverSQL, Args: []any{r.Operation, r.Fingerprint, lease, r.Scope, r.Key, token, retention}}
}

// returns is what MariaDB's insert returns, the token; nothing else
// returns anything: MySQL has no RETURNING, MariaDB none on UPDATE, and
// LAST_INSERT_ID() must stay the caller's.
func (s *myStatements) returns(stmt claimStatement) (token, lag bool) {
	return stmt == byInsert && s.insertReturnsToken, false
}

// The claim's created_at is its statement's start; claimed runs right
// after that statement.
const myClaimed = `SELECT token, TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

func (s *myStatements) claimed(r Request) query {
	return query{SQL: s.claimedSQL, Args: []any{r.Scope, r.Key}}
}

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

func (s *myStatements) read(r Request, retention int64) query {
	return query{SQL: s.readSQL, Args: []any{retention, r.Scope, r.Key}}
}

// myReadCompletedRecord is readCompleted without its locking clause.
const myReadCompletedRecord = `SELECT operation, fingerprint, response_status, response_headers, response_body
FROM idempotency_keys WHERE scope = ? AND idem_key = ?
  AND status = 'completed' AND completed_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6)`

const myReadCompleted = myReadCompletedRecord + ` LOCK IN SHARE MODE`

func (s *myStatements) readCompleted(r Request, retention int64) query {
	return query{SQL: s.readCompletedSQL, Args: []any{r.Scope, r.Key, retention}}
}

const myStateRecord = `SELECT status, token FROM idempotency_keys WHERE scope = ? AND idem_key = ?`

const myState = myStateRecord + ` LOCK IN SHARE MODE`

func (s *myStatements) state(r Request) query {
	return query{SQL: s.stateSQL, Args: []any{r.Scope, r.Key}}
}

const myComplete = `UPDATE idempotency_keys SET status = 'completed', completed_at = UTC_TIMESTAMP(6),
  response_status = ?, response_headers = ?, response_body = ?
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

func (s *myStatements) complete(r Request, token int64, resp Response, header []byte) query {
	return query{SQL: s.completeSQL, Args: []any{resp.StatusCode, header, resp.Body, r.Scope, r.Key, token}}
}

const myExtend = `UPDATE idempotency_keys
SET lease_until = GREATEST(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, lease_until + INTERVAL 1 MICROSECOND)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

func (s *myStatements) extend(r Request, token, lease int64) query {
	return query{SQL: s.extendSQL, Args: []any{lease, r.Scope, r.Key, token}}
}

const myRelease = `UPDATE idempotency_keys SET status = 'released', lease_until = UTC_TIMESTAMP(6)
WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

func (s *myStatements) release(r Request, token int64) query {
	return query{SQL: s.releaseSQL, Args: []any{r.Scope, r.Key, token}}
}

const myRemove = `DELETE FROM idempotency_keys WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`

func (s *myStatements) remove(r Request, token int64) query {
	return query{SQL: s.removeSQL, Args: []any{r.Scope, r.Key, token}}
}

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

func (s *myStatements) purgeWindow(from, retention int64, limit int) query {
	return query{SQL: s.purgeWindowSQL, Args: []any{from, retention, retention, limit}}
}

const myPurge = `DELETE FROM idempotency_keys WHERE ` + myPurgeWhere + `
ORDER BY created_at LIMIT ?`

func (s *myStatements) purge(from, retention int64, limit int) query {
	return query{SQL: s.purgeSQL, Args: []any{from, retention, retention, limit}}
}

// purgeIsolation is READ COMMITTED: under REPEATABLE READ a batch locks
// the gap before the first row past its window (every gap of the primary
// key, if the optimizer runs it as a full scan), where fresh claims go
// when no newer record lies between, so each would wait for the batch to
// commit; READ COMMITTED takes no gap locks. The batch still waits for a
// row past its window that a transaction holds.
func (*myStatements) purgeIsolation() sql.IsolationLevel { return sql.LevelReadCommitted }

// myInspectRecord is what inspect and inspectKey read of a record, with
// the retention as its one argument.
const myInspectRecord = `operation, fingerprint, status, token,
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', lease_until), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', completed_at), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= UTC_TIMESTAMP(6),
  response_status, response_headers, response_body
FROM idempotency_keys`

const myInspect = `SELECT ` + myInspectRecord + ` WHERE scope = ? AND idem_key = ?`

func (s *myStatements) inspect(scope, key string, retention int64) query {
	return query{SQL: s.inspectSQL, Args: []any{retention, scope, key}}
}

// scope is VARBINARY: the order is the bytes'.
const myInspectKey = `SELECT scope, ` + myInspectRecord + ` WHERE idem_key = ? ORDER BY scope LIMIT ?`

func (s *myStatements) inspectKey(key string, retention int64, limit int) query {
	return query{SQL: s.inspectKeySQL, Args: []any{retention, key, limit}}
}

func (s *myStatements) columns() query { return query{SQL: s.columnsSQL} }

const myStats = `SELECT status, COUNT(*), MIN(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)),
  COUNT(CASE WHEN created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND THEN 1 END),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
FROM idempotency_keys GROUP BY status ORDER BY status`

func (s *myStatements) stats(retention int64) query {
	return query{SQL: s.statsSQL, Args: []any{retention, retention}}
}

// size reads information_schema, whose figures InnoDB refreshes from time
// to time (ANALYZE TABLE refreshes them at once). The primary key is the
// table's clustered index, so it counts in the table's bytes.
func (s *myStatements) size() query {
	return query{SQL: `SELECT data_length, index_length FROM information_schema.TABLES
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?`, Args: []any{s.schemaName, s.base}}
}

func (mysqlDialect) lockWaits() bool { return true }

// boundLockWait sets innodb_lock_wait_timeout to d, rounded up to whole
// seconds, for fn and sets it back afterwards, whatever fn returned. A lock
// wait timeout rolls back only the statement that waited (unless the server
// runs with innodb_rollback_on_timeout, which rolls back the whole
// transaction: then the error is passed on as it is, and IsRetryable
// reports it), and idem writes nothing before its last statement, so the
// transaction is left as it was before fn.
func (mysqlDialect) boundLockWait(ctx context.Context, c driver.Conn, d time.Duration, fn func() error) (bool, error) {
	var (
		old             int64
		rollbackWholeTx bool
	)
	if err := c.QueryRow(ctx, query{SQL: `SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_rollback_on_timeout`}, &old, &rollbackWholeTx); err != nil {
		return false, err
	}
	if _, err := c.Exec(ctx, query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{int64((d + time.Second - 1) / time.Second)}}); err != nil {
		return false, err
	}
	err := fn()
	if _, rerr := c.Exec(ctx, query{SQL: `SET SESSION innodb_lock_wait_timeout = ?`, Args: []any{old}}); rerr != nil {
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
func (mysqlDialect) checkSession(context.Context, driver.Conn) error { return nil }

// maxInline bounds the text of a statement whose arguments literals writes
// into it; a statement with larger arguments (a big response body) is sent
// with parameters, whose size only max_allowed_packet limits.
const maxInline = 64 << 10

// literals: every statement, whatever the handle, goes as text.
func (mysqlDialect) literals(driver.ExecQuerier) func(query) query { return myLiterals }

// myLiterals writes the arguments into the query as literals: strings and
// byte slices as hexadecimal literals (X'6869'), which mean the same bytes
// whatever the connection's character set or sql_mode, a nil byte slice as
// NULL, integers in decimal. go-sql-driver/mysql then sends the statement
// as text in one round trip, where with parameters it prepares, executes
// and closes it (two round trips and a statement the server builds and
// frees), unless the DSN sets interpolateParams. The query's only "?" are
// its placeholders: idem's SQL holds no string literal or identifier with
// one.
func myLiterals(q query) query {
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
	return query{SQL: b.String()}
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
