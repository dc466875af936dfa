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
// sql.IsolationLevel and ignores it. WithLockTimeout is refused: a duplicate
// waits at BEGIN IMMEDIATE, before idem runs, and busy_timeout bounds that
// wait. Times are INTEGER microseconds since the Unix epoch from the
// database clock, which has millisecond resolution. See docs/dialects.md.
var SQLite Dialect = sqliteDialect{}

type sqliteDialect struct{}

func (sqliteDialect) Name() string { return "sqlite" }

func (sqliteDialect) quote(parts []string) string {
	return `"` + strings.Join(parts, `"."`) + `"`
}

// schema renders the DDL. SQLite qualifies an index's name with the schema
// (the attached database) and never the table it is on.
func (d sqliteDialect) schema(parts []string) []string {
	base := parts[len(parts)-1]
	stmts := schemaStatements(schema.SQLite, d.quote(parts), base)
	if len(parts) == 2 {
		index := base + "_created_at_idx"
		for i, s := range stmts {
			stmts[i] = strings.Replace(s, " "+index+" ON "+d.quote(parts)+" ",
				" "+d.quote([]string{parts[0], index})+" ON "+d.quote(parts[1:])+" ", 1)
		}
	}
	return stmts
}

// sqNow is the database clock in microseconds since the Unix epoch. SQLite's
// 'now' has millisecond resolution and is the same for every use within one
// statement.
const sqNow = "(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)"

func (sqliteDialect) queries(t string) queries {
	const fenced = ` WHERE scope = ? AND idem_key = ? AND token = ? AND status = 'processing'`
	// A claim statement never waits for another transaction that holds the
	// key: the write lock is taken at BEGIN IMMEDIATE, or when the statement
	// starts, before it reads the clock. So it is granted at its start.
	const returning = "\nRETURNING token, 0"
	insert := `INSERT INTO ` + t + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', ` + sqNow + `, ` + sqNow + ` + ?, ` + sqNow + `)
ON CONFLICT (scope, idem_key) DO NOTHING`
	// A writer holds the database's only write lock, so the WHERE reads the
	// row as last committed.
	takeover := `UPDATE ` + t + ` SET operation = ?, fingerprint = ?, status = 'processing',
  token = max(token + 1, ` + sqNow + `), lease_until = ` + sqNow + ` + ?, created_at = ` + sqNow + `,
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = ? AND idem_key = ? AND token = ?
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= ` + sqNow + `
    OR status = 'completed' AND completed_at + ? <= ` + sqNow + `)`
	return queries{
		insert:        insert,
		insertToken:   insert + returning,
		takeover:      takeover,
		takeoverToken: takeover + returning,
		state:         `SELECT status, token FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
		completeClaim: `UPDATE ` + t + ` SET status = 'completed', completed_at = ` + sqNow + `,
  response_status = ?, response_headers = ?, response_body = ?` + fenced,
		extend:  `UPDATE ` + t + ` SET lease_until = max(` + sqNow + ` + ?, lease_until + 1)` + fenced,
		release: `UPDATE ` + t + ` SET status = 'released', lease_until = ` + sqNow + fenced,
		get: `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ? <= ` + sqNow + `,
  lease_until - ` + sqNow + `,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
		remove: `DELETE FROM ` + t + fenced,
		inspect: `SELECT operation, fingerprint, status, token, lease_until, created_at, completed_at, ` + sqNow + `,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ? <= ` + sqNow + `,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
		stats: `SELECT status, COUNT(*), MIN(created_at),
  COUNT(CASE WHEN created_at <= ` + sqNow + ` - ?
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + sqNow + ` - ? THEN 1 END),
  ` + sqNow + `
FROM ` + t + ` GROUP BY status ORDER BY status`,
		// DELETE ... LIMIT needs a compile-time option; a subquery does
		// not. created_at is never later than completed_at or lease_until,
		// so its index bounds the scan.
		purge: `DELETE FROM ` + t + ` WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM ` + t + `
  WHERE created_at <= ` + sqNow + ` - ?
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + sqNow + ` - ?
  ORDER BY created_at LIMIT ?)`,
	}
}

// size sums the pages of the table's b-tree (which holds the primary key:
// WITHOUT ROWID) and of its index, from the dbstat virtual table.
func (sqliteDialect) size(parts []string) (string, []any) {
	schema, base := "main", parts[len(parts)-1]
	if len(parts) == 2 {
		schema = parts[0]
	}
	return `SELECT (SELECT SUM(pgsize) FROM dbstat(?) WHERE name = ?),
  (SELECT SUM(pgsize) FROM dbstat(?) WHERE name = ?)`, []any{schema, base, schema, base + "_created_at_idx"}
}

func (sqliteDialect) inserted(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

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

// retryable reports SQLITE_BUSY and SQLITE_LOCKED, with any extended code,
// from modernc.org/sqlite's *Error.
func (sqliteDialect) retryable(err error) bool {
	var e interface{ Code() int }
	if !errors.As(err, &e) {
		return false
	}
	t := reflect.TypeOf(e)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.PkgPath() != sqliteErrorPkg || t.Name() != "Error" {
		return false
	}
	switch e.Code() & 0xff {
	case sqliteBusy, sqliteLocked:
		return true
	}
	return false
}
