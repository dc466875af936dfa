package idem

import (
	"database/sql"
	"errors"
	"strings"

	"github.com/idemkit/idem/schema"
)

// Postgres is the dialect for PostgreSQL 12 and later, through lib/pq or
// pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib).
//
// A duplicate waits in INSERT ... ON CONFLICT DO NOTHING for the
// transaction that holds the key. Under REPEATABLE READ and SERIALIZABLE,
// a duplicate whose winner committed after the snapshot was taken fails with
// a serialization failure (SQLSTATE 40001), which IsRetryable reports.
var Postgres Dialect = postgres{}

type postgres struct{}

func (postgres) Name() string { return "postgres" }

func (postgres) quote(parts []string) string {
	return `"` + strings.Join(parts, `"."`) + `"`
}

func (p postgres) schema(parts []string) []string {
	return schemaStatements(schema.Postgres, p.quote(parts), parts[len(parts)-1])
}

// Times come from statement_timestamp(): the database clock when the
// statement arrived, the same for every use within one statement.
const (
	pgNow   = "statement_timestamp()"
	pgToken = "(extract(epoch FROM " + pgNow + ") * 1000000)::bigint"
)

func pgMicros(param string) string { return "(" + param + "::bigint * interval '1 microsecond')" }

func (postgres) queries(t string) queries {
	return queries{
		insert: `INSERT INTO ` + t + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES ($1, $2, $3, $4, 'processing', ` + pgToken + `, ` + pgNow + ` + ` + pgMicros("$5") + `, ` + pgNow + `)
ON CONFLICT (scope, idem_key) DO NOTHING`,
		get: `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ` + pgMicros("$1") + ` <= ` + pgNow + `,
  (extract(epoch FROM lease_until - ` + pgNow + `) * 1000000)::bigint,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = $2 AND idem_key = $3`,
		takeover: `UPDATE ` + t + ` SET operation = $1, fingerprint = $2, status = 'processing',
  token = GREATEST(token + 1, ` + pgToken + `), lease_until = ` + pgNow + ` + ` + pgMicros("$3") + `, created_at = ` + pgNow + `,
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = $4 AND idem_key = $5 AND token = $6`,
		complete: `UPDATE ` + t + ` SET status = 'completed', completed_at = ` + pgNow + `,
  response_status = $1, response_headers = $2, response_body = $3
WHERE scope = $4 AND idem_key = $5`,
		remove: `DELETE FROM ` + t + ` WHERE scope = $1 AND idem_key = $2`,
		// created_at is never later than completed_at or lease_until, so
		// its index bounds the scan; SKIP LOCKED passes over rows a live
		// transaction holds instead of waiting for them.
		purge: `DELETE FROM ` + t + ` WHERE (scope, idem_key) IN (
  SELECT scope, idem_key FROM ` + t + `
  WHERE created_at <= ` + pgNow + ` - ` + pgMicros("$1") + `
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + pgNow + ` - ` + pgMicros("$2") + `
  ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		// Whatever the server's default: no serialization failures
		// against live traffic.
		purgeIsolation: sql.LevelReadCommitted,
	}
}

func (postgres) inserted(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// sqlState is implemented by the errors of lib/pq (*pq.Error) and pgx
// (*pgconn.PgError).
type sqlState interface{ SQLState() string }

func (postgres) retryable(err error) bool {
	var e sqlState
	if !errors.As(err, &e) {
		return false
	}
	switch e.SQLState() {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03": // lock_not_available (lock_timeout)
		return true
	}
	return false
}
