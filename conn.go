package idem

import (
	"context"
	"database/sql"
)

// This file is the seam between idem and the database drivers it runs on.
// Every operation of a [Store] and a [Claim] is written once, over a
// [Conn] (its statements), a [Tx] (the caller's transaction) or a
// [Runner] (a pool that begins idem's own short transactions), and each
// driver is an adapter value passed in: database/sql's is in this
// package ([NewSQLRunner], and the [DBTX] that Do and the other
// database/sql methods take), pgx's in package idempgx. The methods
// named after an operation with On (DoOn, BeginOn, CompleteOn, ...)
// take the seam's values; the others take database/sql's handles and
// adapt them.

// Query is one statement, whole, with its arguments in order.
type Query struct {
	SQL  string
	Args []any
}

// Conn runs idem's statements on one database handle: a transaction, or
// for the calls that need none (Extend, Release, Migrate, Inspect,
// Stats), a pool. A driver's adapter implements it: the errors it returns
// are the driver's own, unwrapped or wrapped so that errors.As finds
// them, for IsRetryable and the dialects.
type Conn interface {
	// Exec runs q and returns the number of rows it changed.
	Exec(ctx context.Context, q Query) (int64, error)
	// QueryRow runs q and scans its first row into dest, or returns an
	// error that wraps sql.ErrNoRows when there is none.
	QueryRow(ctx context.Context, q Query, dest ...any) error
	// QueryRows runs q and calls each once per row, with the function
	// that scans that row, and returns the first error of each or of the
	// rows.
	QueryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error
}

// Tx is an open transaction: a Conn that commits or rolls back. DoOn and
// CompleteOn take one, so that a pool, whose statements would each
// commit on their own, cannot be passed where the caller's transaction
// belongs.
type Tx interface {
	Conn
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Runner is a pool of one driver: a Conn whose statements run outside
// any transaction, that begins transactions. BeginOn and PurgeOn run
// their own short transactions on it, and so do the layers that run a
// handler in a transaction of theirs (idemhttp, idemgrpc, the consumer
// middleware), which take a Runner so that they work on every driver.
type Runner interface {
	Conn
	// BeginTx begins a transaction. iso is sql.LevelDefault for a
	// transaction of the caller's work, which has the options the Runner
	// was made with; another level is for a short transaction of idem's
	// own (a purge batch's: READ COMMITTED), which has that isolation
	// level and none of those options.
	BeginTx(ctx context.Context, iso sql.IsolationLevel) (Tx, error)
}

// InTx runs fn in a transaction that r begins at isolation level iso (see
// [Runner]) and commits it, retrying it as [RunTx] does: up to 10
// attempts in all, with a jittered backoff, while the begin, fn or the
// commit fails with an error for which [IsRetryable] is true. fn must not
// commit or roll back tx. Unless the commit succeeds, tx is rolled back,
// on a context that ctx's end does not cancel so that the rollback is
// sent, also when fn panics (the panic goes on).
func InTx(ctx context.Context, r Runner, iso sql.IsolationLevel, fn func(tx Tx) error) error {
	return Retry(ctx, func() error {
		tx, err := r.BeginTx(ctx, iso)
		if err != nil {
			return err
		}
		return attempt(ctx, tx, fn)
	})
}

// ender ends a transaction: a Tx, a pgx.Tx.
type ender interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// attempt runs fn in tx, a transaction its caller began, and commits it.
// Unless the commit succeeds, tx is rolled back (on a context that ctx's
// end does not cancel, so that the rollback is sent): when fn or the
// commit fails, and when fn panics or its goroutine exits (a test's
// t.Fatal), whose panic goes on.
func attempt[T ender](ctx context.Context, tx T, fn func(tx T) error) error {
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

// conn is a Conn as the Store's dialect sends statements through it:
// with their arguments written into the text where lit says so
// (Dialect.literals), which is asked once per handle.
type conn struct {
	c   Conn
	lit func(Query) Query // nil: parameters
}

// conn is c as s's dialect sends statements through it.
func (s *Store) conn(c Conn) conn { return conn{c: c, lit: s.dialect.literals(c)} }

// sent is q as the driver should be sent it.
func (c conn) sent(q Query) Query {
	if c.lit == nil {
		return q
	}
	return c.lit(q)
}

func (c conn) exec(ctx context.Context, q Query) (int64, error) { return c.c.Exec(ctx, c.sent(q)) }

func (c conn) queryRow(ctx context.Context, q Query, dest ...any) error {
	return c.c.QueryRow(ctx, c.sent(q), dest...)
}

func (c conn) queryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error {
	return c.c.QueryRows(ctx, c.sent(q), each)
}
