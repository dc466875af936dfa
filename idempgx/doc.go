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
// An HTTP service on pgx puts idemhttp's middleware in front of its
// handlers with [Middleware], on its *pgxpool.Pool, and its handlers get
// their pgx.Tx from [TxFrom] (and, in idemhttp.ModeClaim, their claim from
// [ClaimFrom]); the middleware is idemhttp's own, with the behaviour
// docs/http.md describes:
//
//	mw, err := idempgx.Middleware(pool, pgx.TxOptions{}, idemhttp.Config{Store: store, Scope: accountOf, Required: true})
//	...
//	mux.Handle("POST /v1/charges", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := idempgx.TxFrom(r.Context()) // write the rows here; the middleware commits
//		...
//	})))
//
// pgx prepares each statement once per connection and reuses it (its
// default statement cache), so idem's statements are parsed and planned
// once per connection, not on every call. Package idem itself does not
// import pgx.
package idempgx
