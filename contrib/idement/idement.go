package idement

import (
	"context"
	"database/sql"
	"errors"
	"reflect"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/driver"
	"github.com/idemkit/idem/internal/engine"
)

// Tx is ent's transaction, the *ent.Tx that client.Tx and client.BeginTx
// return, generated with the sql/execquery feature (which gives it
// ExecContext and QueryContext). idem writes its record through it, so
// that the record commits or rolls back with the rows ent writes.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	Commit() error
	Rollback() error
}

// eng is package idem's engine: it runs Do and Complete through ent's
// transaction as through any database/sql handle, with the statements
// its dialect sends.
var eng = engine.E

// Do is [idem.Store.Do] inside ent's transaction tx: it runs fn at most
// once per (Scope, Key) among all transactions that commit, and writes
// the record through tx, so that it commits or rolls back with the rows
// fn writes through tx. Its results and errors are Do's; when fn fails,
// roll tx back (RunTx does).
func Do(ctx context.Context, s *idem.Store, tx Tx, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	switch {
	case s == nil:
		return idem.Result{}, errors.New("idement: Do needs an *idem.Store, got nil")
	case isNil(tx):
		return idem.Result{}, errors.New("idement: Do needs ent's open *Tx (client.Tx or client.BeginTx), got nil")
	}
	return eng.Do(ctx, s, eng.SQL(s, tx), req, fn)
}

// Complete is [idem.Claim.Complete] inside ent's transaction tx, the one
// that writes the operation's rows: it stores resp as the claim's result
// through tx, so that both commit or neither does. Its errors are
// Complete's.
func Complete(ctx context.Context, c *idem.Claim, tx Tx, resp idem.Response) error {
	switch {
	case c == nil:
		return errors.New("idement: Complete on a nil Claim; use the claim Begin returned")
	case isNil(tx):
		return errors.New("idement: Complete needs ent's open *Tx (client.Tx or client.BeginTx), got nil")
	}
	return eng.Complete(ctx, c, eng.ClaimSQL(c, tx), resp)
}

// RunTx runs fn in a transaction that begin (client.BeginTx) begins with
// opts, and commits it. When begin, fn or the commit fails with an error
// for which [idem.IsRetryable] is true, the transaction is rolled back
// and run again, as [idem.Retry] runs it: the duplicate that lost a race
// then replays the winner's result. fn must not commit or roll back tx
// itself. A panic in fn rolls back and is passed on.
//
//	err := idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
//		res, err = idement.Do(ctx, store, tx, req, fn)
//		return err
//	})
func RunTx[T Tx](ctx context.Context, begin func(ctx context.Context, opts *sql.TxOptions) (T, error), opts *sql.TxOptions, fn func(tx T) error) error {
	if begin == nil || fn == nil {
		return errors.New("idement: RunTx needs client.BeginTx and a function")
	}
	return idem.Retry(ctx, func() error { return runTxOnce(ctx, begin, opts, fn) })
}

func runTxOnce[T Tx](ctx context.Context, begin func(context.Context, *sql.TxOptions) (T, error), opts *sql.TxOptions, fn func(tx T) error) error {
	tx, err := begin(ctx, opts)
	return driver.Attempt(ctx, driver.NoContext[T]{Tx: tx}, err, func(e driver.NoContext[T]) error { return fn(e.Tx) })
}

// isNil reports whether tx is nil, or a nil pointer in an interface.
func isNil(tx Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
