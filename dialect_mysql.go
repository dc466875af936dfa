package idem

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"

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

func (mysqlDialect) queries(t string) queries {
	return queries{
		insert: `INSERT INTO ` + t + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES (?, ?, ?, ?, 'processing', ` + myToken + `, ` + myNow + ` + INTERVAL ? MICROSECOND, ` + myNow + `)`,
		get: `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + INTERVAL ? MICROSECOND <= ` + myNow + `,
  TIMESTAMPDIFF(MICROSECOND, ` + myNow + `, lease_until),
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = ? AND idem_key = ? LOCK IN SHARE MODE`,
		// MySQL evaluates SET from left to right; token is read before it
		// is assigned and nothing after it reads it.
		takeover: `UPDATE ` + t + ` SET operation = ?, fingerprint = ?, status = 'processing',
  token = GREATEST(token + 1, ` + myToken + `), lease_until = ` + myNow + ` + INTERVAL ? MICROSECOND, created_at = ` + myNow + `,
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = ? AND idem_key = ? AND token = ?`,
		complete: `UPDATE ` + t + ` SET status = 'completed', completed_at = ` + myNow + `,
  response_status = ?, response_headers = ?, response_body = ?
WHERE scope = ? AND idem_key = ?`,
		remove: `DELETE FROM ` + t + ` WHERE scope = ? AND idem_key = ?`,
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
	}
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
	if e, ok := errors.AsType[*mysql.MySQLError](err); ok && e.Number == erDupEntry {
		return false, nil
	}
	return false, err
}

func (mysqlDialect) retryable(err error) bool {
	e, ok := errors.AsType[*mysql.MySQLError](err)
	if !ok {
		return false
	}
	switch e.Number {
	case erLockWaitTimeout, erLockDeadlock, erCheckread, erLockNowait:
		return true
	}
	return false
}
