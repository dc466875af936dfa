// Package driver is the seam between idem's engine (the claim algorithm and
// its statements, in package idem) and the database drivers it runs on:
// the engine runs every statement through a [Conn] and its own short
// transactions through a [TxRunner]. Package idem adapts database/sql to
// them (its sqlconn.go); a native driver's package (idempgx) adapts its
// own connections and transactions the same way, and runs the engine
// through package internal/engine.
package driver

import (
	"context"
	"database/sql"
)

// Query is one statement, whole, with its arguments in order.
type Query struct {
	SQL  string
	Args []any
}

// Conn runs idem's statements on one database handle.
type Conn interface {
	// Exec runs q and returns the number of rows it changed.
	Exec(ctx context.Context, q Query) (int64, error)
	// QueryRow runs q and scans its first row into dest; an error that
	// wraps sql.ErrNoRows when there is none.
	QueryRow(ctx context.Context, q Query, dest ...any) error
	// QueryRows runs q and calls each once per row, with the function
	// that scans that row.
	QueryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error
}

// ExecQuerier runs statements with database/sql's types: a *sql.Tx, any
// idem.DBTX, ent's Tx (which has no QueryRowContext).
type ExecQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Rows is what the result sets of database/sql and pgx have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// EachRow calls each once per row of rows, with the function that scans
// that row, as Conn.QueryRows does, and returns the first error of each or
// of rows. Closing rows is the caller's.
func EachRow(rows Rows, each func(scan func(dest ...any) error) error) error {
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// TxRunner runs fn in a short transaction of its own at isolation level
// iso (sql.LevelDefault: the server's default), commits it, and runs it
// again, after a backoff, when it fails with an error for which
// idem.IsRetryable is true, as idem.RunTx does.
type TxRunner func(ctx context.Context, iso sql.IsolationLevel, fn func(c Conn) error) error

// Engine is package idem's engine, set by its init: package
// internal/engine asserts it to the interface engine.Engine, the one
// declaration of what a driver package can run. (It is held here, as an
// any, because package idem cannot import internal/engine, which imports
// idem.)
var Engine any

// Ender ends a transaction: a pgx.Tx is one, and NoContext makes one of
// a *sql.Tx or ent's Tx.
type Ender interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// NoContext is a transaction whose Commit and Rollback take no context
// (*sql.Tx, ent's Tx) as an Ender.
type NoContext[T interface {
	Commit() error
	Rollback() error
}] struct{ Tx T }

func (e NoContext[T]) Commit(context.Context) error   { return e.Tx.Commit() }
func (e NoContext[T]) Rollback(context.Context) error { return e.Tx.Rollback() }

// Attempt is one attempt of a transaction that the caller has begun (tx,
// or beginErr when the begin failed): it runs fn in tx and commits it.
// Unless the commit succeeds, tx is rolled back (on a context that ctx's
// end does not cancel, so that the rollback is sent): when fn or the
// commit fails, and when fn panics or its goroutine exits (a test's
// t.Fatal), whose panic goes on. idem.RunTx and idempgx.RunTx run each
// attempt through it, and idem.Retry the attempts.
func Attempt[T Ender](ctx context.Context, tx T, beginErr error, fn func(tx T) error) error {
	if beginErr != nil {
		return beginErr
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committed = true
	return nil
}
