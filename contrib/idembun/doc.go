// Package idembun documents and tests idem inside bun's transactions; it
// has no API of its own, since bun needs none.
//
// Inside db.RunInTx, hand [idem.Store.Do] the bun.Tx as it is, and wrap
// the whole transaction in [idem.Retry], so that a duplicate the database
// aborted (a serialization failure, a deadlock) runs again and replays:
//
//	err := idem.Retry(ctx, func() error {
//		return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
//			res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
//				if _, err := tx.NewInsert().Model(&charge).Exec(ctx); err != nil {
//					return idem.Response{}, err
//				}
//				return idem.Response{StatusCode: 201, Body: body}, nil
//			})
//			return err
//		})
//	})
//
// A bun.Tx formats each statement itself, writing the arguments into its
// text, and passes the driver none, which idem's PostgreSQL statements
// ($1, $2) cannot run with; so idem runs its statements on the *sql.Tx
// that the bun.Tx holds (bun's query hooks do not see them). A *bun.DB
// and a bun.Conn are refused by Do and [idem.Claim.Complete] before any
// statement, since each statement through them would commit on its own,
// apart from the business rows.
//
// A handler behind idemhttp's middleware (or idemgrpc's interceptor),
// where the middleware runs Do and owns the transaction, runs bun's
// queries on that transaction with Conn:
//
//	_, err := db.NewInsert().Conn(idemhttp.TxFrom(r.Context())).Model(&charge).Exec(r.Context())
//
// [idem.IsRetryable] knows the serialization failures and deadlocks of
// bun's pgdriver, of pgx and of go-sql-driver/mysql. The tests run bun's
// pgdialect on pgdriver and on pgx's database/sql driver, and its
// mysqldialect on MariaDB. docs/orm.md shows the same for the other ORMs
// and query builders.
package idembun
