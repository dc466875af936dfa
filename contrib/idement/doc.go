// Package idement runs ent's transactions for idem.
//
// ent's *Tx, generated with the sql/execquery feature, has ExecContext
// and QueryContext, and Commit and Rollback: it is an [idem.DBTX] that is
// a transaction, so [idem.Store.Do] and [idem.Claim.Complete] take it as
// they take a *sql.Tx, and write idem's record inside the transaction
// that writes ent's rows. [RunTx] begins ent's transaction with
// client.BeginTx, commits it, and runs it again when the database aborts
// a duplicate (a serialization failure, a deadlock), which then replays:
//
//	err := idement.RunTx(ctx, client.BeginTx, nil, func(tx *ent.Tx) error {
//		res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
//			c, err := tx.Charge.Create().SetAmount(amount).Save(ctx)
//			if err != nil {
//				return idem.Response{}, err
//			}
//			return idem.Response{StatusCode: 201, Body: body(c)}, nil
//		})
//		return err
//	})
//
// Generate ent's code with the feature:
//
//	go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./schema
//
// The other way needs no package of idem's: begin the transaction as a
// *sql.Tx with [idem.RunTx], build an ent client on it, and hand the
// *sql.Tx to [idem.Store.Do] (ent documents this for a transaction begun
// outside it):
//
//	err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
//		client := ent.NewClient(ent.Driver(entsql.NewDriver(dialect.Postgres, entsql.Conn{ExecQuerier: tx})))
//		res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) { ... })
//		return err
//	})
//
// A handler behind idemhttp's middleware, whose transaction the middleware
// owns, builds its client the same way on idemhttp.TxFrom(r.Context()).
//
// ent's client runs each statement on its own: it has ExecContext and
// QueryContext too, but no Commit and Rollback, and Do and Complete
// refuse it before any statement, saying what to pass. docs/orm.md shows
// the same for the other ORMs and query builders.
package idement
