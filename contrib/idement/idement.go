package idement

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemkit/idem"
)

// Tx is what RunTx needs of ent's transaction, the *ent.Tx that
// client.BeginTx returns: it commits and rolls back.
type Tx interface {
	Commit() error
	Rollback() error
}

// RunTx runs fn in a transaction that begin (client.BeginTx) begins with
// opts, and commits it. When begin, fn or the commit fails with an error
// for which [idem.IsRetryable] is true, the transaction is rolled back
// and run again, as [idem.Retry] runs it: the duplicate that lost a race
// then replays the winner's result. fn must not commit or roll back tx
// itself. Unless the commit succeeds, tx is rolled back, also when fn
// panics (the panic goes on).
//
//	err := idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
//		res, err = store.Do(ctx, tx, req, fn)
//		return err
//	})
func RunTx[T Tx](ctx context.Context, begin func(ctx context.Context, opts *sql.TxOptions) (T, error), opts *sql.TxOptions, fn func(tx T) error) error {
	if begin == nil || fn == nil {
		return errors.New("idement: RunTx needs client.BeginTx and a function")
	}
	return idem.Retry(ctx, func() error {
		tx, err := begin(ctx, opts)
		if err != nil {
			return err
		}
		committed := false
		defer func() {
			if !committed {
				_ = tx.Rollback()
			}
		}()
		if err := fn(tx); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		committed = true
		return nil
	})
}
