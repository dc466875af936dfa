package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// pgEpoch is a timestamptz column in microseconds since the Unix epoch.
func pgEpoch(col string) string { return "(extract(epoch FROM " + col + ") * 1000000)::bigint" }

func pgMicros(param string) string { return "(" + param + "::bigint * interval '1 microsecond')" }

func (postgres) queries(t string) queries {
	insert := `INSERT INTO ` + t + ` (scope, idem_key, operation, fingerprint, status, token, lease_until, created_at)
VALUES ($1, $2, $3, $4, 'processing', ` + pgToken + `, ` + pgNow + ` + ` + pgMicros("$5") + `, ` + pgNow + `)
ON CONFLICT (scope, idem_key) DO NOTHING`
	// Under READ COMMITTED, an update that waited for another transaction
	// evaluates this WHERE again on the row that one committed.
	takeover := `UPDATE ` + t + ` SET operation = $1, fingerprint = $2, status = 'processing',
  token = GREATEST(token + 1, ` + pgToken + `), lease_until = ` + pgNow + ` + ` + pgMicros("$3") + `, created_at = ` + pgNow + `,
  completed_at = NULL, response_status = NULL, response_headers = NULL, response_body = NULL
WHERE scope = $4 AND idem_key = $5 AND token = $6
  AND (status = 'released'
    OR status = 'processing' AND lease_until <= ` + pgNow + `
    OR status = 'completed' AND completed_at + ` + pgMicros("$7") + ` <= ` + pgNow + `)`
	fenced := ` WHERE scope = $%d AND idem_key = $%d AND token = $%d AND status = 'processing'`
	// RETURNING runs once the row is written, after any wait for another
	// transaction that held the key; created_at is the statement's start.
	returning := "\nRETURNING token, " + pgEpoch("clock_timestamp()") + " - " + pgEpoch("created_at")
	return queries{
		insert:        insert,
		insertToken:   insert + returning,
		takeover:      takeover,
		takeoverToken: takeover + returning,
		get: `SELECT operation, fingerprint, status, token,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ` + pgMicros("$1") + ` <= ` + pgNow + `,
  (extract(epoch FROM lease_until - ` + pgNow + `) * 1000000)::bigint,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = $2 AND idem_key = $3`,
		state: `SELECT status, token FROM ` + t + ` WHERE scope = $1 AND idem_key = $2`,
		completeClaim: `UPDATE ` + t + ` SET status = 'completed', completed_at = ` + pgNow + `,
  response_status = $1, response_headers = $2, response_body = $3` + fmt.Sprintf(fenced, 4, 5, 6),
		extend: `UPDATE ` + t + ` SET lease_until = GREATEST(` + pgNow + ` + ` + pgMicros("$1") + `, lease_until + interval '1 microsecond')` +
			fmt.Sprintf(fenced, 2, 3, 4),
		release: `UPDATE ` + t + ` SET status = 'released', lease_until = ` + pgNow + fmt.Sprintf(fenced, 1, 2, 3),
		remove:  `DELETE FROM ` + t + fmt.Sprintf(fenced, 1, 2, 3),
		inspect: `SELECT operation, fingerprint, status, token,
  ` + pgEpoch("lease_until") + `, ` + pgEpoch("created_at") + `, ` + pgEpoch("completed_at") + `, ` + pgToken + `,
  (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) + ` + pgMicros("$1") + ` <= ` + pgNow + `,
  response_status, response_headers, response_body
FROM ` + t + ` WHERE scope = $2 AND idem_key = $3`,
		stats: `SELECT status, COUNT(*), MIN(` + pgEpoch("created_at") + `),
  COUNT(CASE WHEN created_at <= ` + pgNow + ` - ` + pgMicros("$1") + `
    AND (CASE WHEN status = 'completed' THEN completed_at ELSE lease_until END) <= ` + pgNow + ` - ` + pgMicros("$2") + ` THEN 1 END),
  ` + pgToken + `
FROM ` + t + ` GROUP BY status ORDER BY status`,
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
		// set_config(..., true) is SET LOCAL: it lasts to the end of the
		// transaction, or until the savepoint is rolled back to.
		// lockWaitSet evaluates its columns left to right, so it returns
		// the bound in force before it. Its arg: the new bound;
		// lockWaitRestore's: the old one.
		lockWaitSave:    `SAVEPOINT idem_lock_wait`,
		lockWaitSet:     `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`,
		lockWaitRestore: `SELECT set_config('lock_timeout', $1, true)`,
		lockWaitUndo:    `ROLLBACK TO SAVEPOINT idem_lock_wait`,
		lockWaitRelease: `RELEASE SAVEPOINT idem_lock_wait`,
	}
}

func (postgres) inserted(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// size asks Postgres for the table's size (with its TOAST data) and that of
// its indexes.
func (p postgres) size(parts []string) (string, []any) {
	return `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass)`, []any{p.quote(parts)}
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

// boundLockWait runs fn inside a savepoint with lock_timeout set to d for
// the transaction. On success lock_timeout is set back and the savepoint
// released. On any error, rolling back to the savepoint undoes fn and the
// setting, and leaves the transaction usable (Postgres aborts a transaction
// at its first error, so this is the only way back).
func (postgres) boundLockWait(ctx context.Context, db DBTX, q queries, d time.Duration, fn func() error) (bool, error) {
	if _, err := db.ExecContext(ctx, q.lockWaitSave); err != nil {
		return false, err
	}
	var old, set string
	bound := fmt.Sprintf("%dms", (d+time.Millisecond-1)/time.Millisecond)
	if err := db.QueryRowContext(ctx, q.lockWaitSet, bound).Scan(&old, &set); err != nil {
		return false, err
	}
	if err := fn(); err != nil {
		var e sqlState
		timedOut := errors.As(err, &e) && e.SQLState() == "55P03"
		for _, stmt := range []string{q.lockWaitUndo, q.lockWaitRelease} {
			if _, uerr := db.ExecContext(ctx, stmt); uerr != nil {
				return false, errors.Join(err, uerr)
			}
		}
		return timedOut, err
	}
	if _, err := db.ExecContext(ctx, q.lockWaitRestore, old); err != nil {
		return false, err
	}
	_, err := db.ExecContext(ctx, q.lockWaitRelease)
	return false, err
}
