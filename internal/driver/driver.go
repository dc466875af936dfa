// Package driver is the seam between idem's engine (the claim algorithm and
// its statements, in package idem) and the database drivers it runs on.
// Package idem adapts database/sql to [Conn] itself; a native driver's
// package in this module (idempgx) adapts its own connections and
// transactions the same way, and reaches the engine through [Engine].
package driver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
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

// Engine is package idem's engine: its init sets it to a value whose
// methods run each operation of a Store or Claim over a Conn or TxRunner
// (Do, Begin, Extend, Complete, Release, Migrate, Purge, PurgeBatch,
// Inspect, Stats; see package idem's native.go). A driver package asserts
// it to an interface of the methods it calls, once, when it starts: it
// imports package idem, so idem's init has run by then.
var Engine any

// The bounds of Retry.
const (
	maxAttempts = 10
	baseBackoff = 5 * time.Millisecond
	maxBackoff  = 500 * time.Millisecond
)

// Retry calls once until it returns nil or an error for which retryable is
// false, up to 10 attempts in all, after a jittered exponential backoff
// (5ms doubling to at most 500ms) between attempts. It gives up with the
// last error, and at once when ctx ends. idem.RunTx and idempgx.RunTx
// retry their transactions with it.
func Retry(ctx context.Context, retryable func(error) bool, once func() error) error {
	backoff := baseBackoff
	for attempt := 1; ; attempt++ {
		err := once()
		if err == nil || !retryable(err) {
			return err
		}
		if attempt == maxAttempts {
			return fmt.Errorf("idem: giving up after %d attempts: %w", attempt, err)
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
