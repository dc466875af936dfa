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

// Results are the results of the statements of a [Pipeline]'s batch, read
// one at a time, in the order they were sent, each once: Exec reads a
// statement's as [Conn.Exec] returns it, QueryRow as [Conn.QueryRow] does
// (an error that wraps sql.ErrNoRows when it has no row). Exec of a
// statement that returns rows discards them.
type Results interface {
	Exec() (int64, error)
	QueryRow(dest ...any) error
}

// Pipeline is a transaction that sends several of idem's statements in
// one round trip, and its BEGIN and its COMMIT with the first and the last
// of them: one a [Pipeliner] begins. It begins when it first sends
// something, so that BEGIN goes in the same round trip as its first
// statement (or the statements of its first Batch); Rollback of one that
// has sent nothing sends nothing either.
//
// A statement of a batch that fails ends it, as the database ends a
// pipeline at its first error: the statements after it do not run, and
// their results are that error. A transaction in which one failed is
// aborted, as after any failed statement, and must be rolled back.
type Pipeline interface {
	Tx
	// Batch sends qs, in order, in one round trip, and calls read, which
	// reads each of their results in turn (a result read sends nothing
	// more). It returns read's error, or else the batch's.
	Batch(ctx context.Context, qs []Query, read func(r Results) error) error
	// Defer has q sent ahead of anything else the transaction sends
	// next: with its COMMIT, in one round trip, or on its own before any
	// other statement. done is called with q's error, nil when it ran,
	// and returns the error of what q was sent with: of the COMMIT, which
	// then did not commit, or of that other statement, which then did not
	// run. q's own failure keeps the COMMIT after it from running; done
	// cannot stop it once q ran, so a statement on whose outcome the
	// commit depends must fail when it may not commit.
	Defer(q Query, done func(err error) error)
}

// Pipeliner is a [Runner] whose driver can send several statements in one
// round trip: idempgx's Runner, on a *pgxpool.Pool or a *pgx.Conn. The
// layers that run a handler in a transaction of theirs (idemhttp,
// idemgrpc, the consumer middleware) and idempgx.RunTx run it in one, with
// [InPipelinedTx]: a Do with a fresh key then costs one round trip for
// BEGIN with the claim, the handler's own statements, and one for the
// completion with COMMIT, where BeginTx's transaction costs two more.
type Pipeliner interface {
	Runner
	// BeginPipeline returns a transaction such as BeginTx would begin at
	// iso, which has sent nothing yet; nil when the Runner's pool cannot
	// send a transaction's statements together (then BeginTx).
	BeginPipeline(iso sql.IsolationLevel) Pipeline
}
