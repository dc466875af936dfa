// Package idempgx runs idem on PostgreSQL through jackc/pgx/v5 directly:
// pgx.Tx, *pgx.Conn and *pgxpool.Pool, without database/sql. A service
// whose repository transactions are pgx.Tx (pgxpool, sqlc generating for
// pgx/v5) puts its idempotency record in the transaction that writes its
// rows, exactly as a database/sql service does with [idem.Store.Do].
//
// It is not a second implementation: [Store] wraps an [*idem.Store] and
// runs the same engine (the claim algorithm, the Postgres statements, the
// fencing and the Observer) over pgx instead of database/sql. Requests,
// responses, results, errors and [idem.IsRetryable] are package idem's,
// and one [*idem.Store] serves both paths on one table:
//
//	store, err := idem.New(idem.Postgres, idem.WithTable("idempotency_keys"))
//	...
//	keys, err := idempgx.New(store)
//	...
//	err = idempgx.RunTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		res, err := keys.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
//			// write the business rows through tx
//		})
//		...
//	})
//
// pgx prepares each statement once per connection and reuses it (its
// default statement cache), so idem's statements are parsed and planned
// once per connection, not on every call. Package idem itself does not
// import pgx.
package idempgx
