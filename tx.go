package idem

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem/internal/driver"
)

// DBTX runs statements: *sql.Tx, *sqlx.Tx, *sql.Conn and *sql.DB satisfy it.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ DBTX = (*sql.DB)(nil)
	_ DBTX = (*sql.Tx)(nil)
	_ DBTX = (*sql.Conn)(nil)
)

// IsRetryable reports whether err means the whole transaction should be
// retried: a serialization failure, a deadlock or a lock wait timeout, from
// any of the supported databases and drivers, or idem's own report that a
// key changed hands while it was being claimed, or that the database rolled
// back the transaction under Do (its claim was gone after fn).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errContended) || errors.Is(err, errTxEnded) {
		return true
	}
	for _, d := range dialects {
		if d.retryable(err) {
			return true
		}
	}
	return false
}

// dialects are the Dialects IsRetryable consults.
var dialects = []Dialect{Postgres, MySQL, MariaDB, TiDB, SQLite}

// RunTx runs fn in a transaction on db and commits it. When fn, the begin or
// the commit fails with an error for which [IsRetryable] is true, the
// transaction is rolled back and run again, up to 10 attempts in all, after
// a jittered exponential backoff (5ms doubling to at most 500ms). It gives
// up with the last error, and at once when ctx ends. fn must not commit or
// roll back tx itself. A panic in fn rolls back and is passed on.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	if db == nil || fn == nil {
		return errors.New("idem: RunTx needs a *sql.DB and a function")
	}
	return driver.Retry(ctx, IsRetryable, func() error { return runTxOnce(ctx, db, opts, fn) })
}

func runTxOnce(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// sqlConn runs statements through a database/sql handle, each as its
// dialect has it sent (inline).
type sqlConn struct {
	db DBTX
	d  Dialect
}

func (c sqlConn) exec(ctx context.Context, q query) (int64, error) {
	q = c.d.inline(q)
	res, err := c.db.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqlConn) queryRow(ctx context.Context, q query, dest ...any) error {
	q = c.d.inline(q)
	return c.db.QueryRowContext(ctx, q.SQL, q.Args...).Scan(dest...)
}

func (c sqlConn) queryRows(ctx context.Context, q query, each func(scan func(dest ...any) error) error) error {
	q = c.d.inline(q)
	rows, err := c.db.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return driver.EachRow(rows, each)
}

var _ conn = sqlConn{}

// txRunner runs fn in a short transaction of its own at isolation level
// iso (sql.LevelDefault: the server's), commits it, and retries it as
// RunTx does. Begin and Purge run their transactions through one, whatever
// the driver.
type txRunner func(ctx context.Context, iso sql.IsolationLevel, fn func(c conn) error) error

// sqlTx runs transactions on a database/sql pool with RunTx.
func sqlTx(db *sql.DB, d Dialect) txRunner {
	return func(ctx context.Context, iso sql.IsolationLevel, fn func(c conn) error) error {
		return RunTx(ctx, db, &sql.TxOptions{Isolation: iso}, func(tx *sql.Tx) error {
			return fn(sqlConn{tx, d})
		})
	}
}
