package idem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// DBTX runs statements: a *sql.Tx, a *sql.DB, a *sql.Conn, and every
// handle with their ExecContext and QueryContext. Do and [Claim.Complete]
// write through it inside the caller's transaction, so there it must be
// one: a *sql.Tx, a *sqlx.Tx (which embeds one), GORM's transaction
// (tx.Statement.ConnPool inside db.Transaction: a *sql.Tx, or with
// PrepareStmt a *gorm.PreparedStmtTX, whose *sql.Tx idem uses,
// unprepared), a bun.Tx (whose *sql.Tx idem uses: bun rewrites statements
// itself), ent's *Tx (generated with the sql/execquery feature, which
// gives it these methods), sqlc's DBTX holding one of these, or a type of
// the caller's with Commit and Rollback methods that wraps one. Do and
// Complete refuse, before any statement, every handle that is not inside
// a transaction: *sql.DB and *sql.Conn satisfy DBTX but run each
// statement on its own and commit it at once, and so do sqlx's, GORM's,
// bun's and ent's pools and connections, and any handle without Commit
// and Rollback. Migrate, [Claim.Extend], [Claim.Release], Inspect and
// Stats take any DBTX, a *sql.DB included. docs/orm.md shows each ORM's
// line. (DBTX had QueryRowContext too until v0.1.0: removing it breaks no
// caller, and lets ent's transaction through.)
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ DBTX = (*sql.DB)(nil)
	_ DBTX = (*sql.Tx)(nil)
	_ DBTX = (*sql.Conn)(nil)
)

// IsRetryable reports whether err means the whole transaction should be
// retried: a serialization failure, a deadlock or a lock wait timeout, from
// any of the supported databases and drivers (and, in an [Error] of a
// Store's statement, from its dialect's Retryable, one built with
// [NewDialect] too), or idem's own report that a key changed hands while it
// was being claimed, or that the database rolled back the transaction
// under Do (its claim was gone after fn).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errContended) || errors.Is(err, errTxEnded) || errors.Is(err, errRetryable) {
		return true
	}
	for _, d := range dialects {
		if d.retryable(err) {
			return true
		}
	}
	return false
}

// RunTx runs fn in a transaction on db and commits it. When fn, the begin or
// the commit fails with an error for which [IsRetryable] is true, the
// transaction is rolled back and run again, as [Retry] runs it: up to 10
// attempts in all, after a jittered exponential backoff (5ms doubling to
// at most 500ms), giving up with the last error, and at once when ctx
// ends. fn must not commit or roll back tx itself. A panic in fn rolls
// back and is passed on.
func RunTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	if db == nil || fn == nil {
		return errors.New("idem: RunTx needs a *sql.DB and a function")
	}
	return Retry(ctx, func() error { return runSQLTx(ctx, db, opts, fn) })
}

// Retry is RunTx's retry loop around any function that runs one whole
// transaction, such as an ORM's transaction helper:
//
//	err := idem.Retry(ctx, func() error {
//		return db.Transaction(func(tx *gorm.DB) error { ... }) // GORM
//	})
//
// fn runs again when it fails with an error for which [IsRetryable] is
// true (the duplicate that lost a race then replays the winner's result),
// up to 10 attempts in all, after a jittered exponential backoff (5ms
// doubling to at most 500ms). Retry returns nil, fn's first error that is
// not retryable, or, after the last attempt, an error that says it gave
// up and wraps the last one; at once when ctx ends, the last error joined
// with ctx's. fn must begin, commit and roll back its transaction itself,
// as the helpers of GORM (db.Transaction), bun (db.RunInTx) and ent do.
func Retry(ctx context.Context, fn func() error) error {
	if fn == nil {
		return errors.New("idem: Retry needs a function")
	}
	backoff := baseBackoff
	for try := 1; ; try++ {
		err := fn()
		if err == nil || !IsRetryable(err) {
			return err
		}
		if try == maxAttempts {
			return gaveUp(try, err)
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

// The bounds of Retry.
const (
	maxAttempts = 10
	baseBackoff = 5 * time.Millisecond
	maxBackoff  = 500 * time.Millisecond
)

// gaveUp is Retry's error after its last attempt failed with err.
func gaveUp(attempts int, err error) error {
	return &Error{Op: "run the transaction", Err: err,
		Detail: fmt.Sprintf("gave up after %d attempts, each rolled back for an error that a retry may cure (IsRetryable): "+
			"the key stayed contended, or something else kept failing the transaction; the last: %s", attempts, reason(err))}
}

// hintRetry is the hint of the Errors of a statement inside a
// transaction that a retry of the whole transaction may cure.
const hintRetry = "roll back and run the whole transaction again (RunTx and Retry do so)"
