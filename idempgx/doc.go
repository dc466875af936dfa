// Package idempgx is idem's adapter for jackc/pgx/v5: it runs idem on
// PostgreSQL through pgx.Tx, *pgx.Conn and *pgxpool.Pool, without
// database/sql. A service whose repository transactions are pgx.Tx
// (pgxpool, sqlc generating for pgx/v5) puts its idempotency record in
// the transaction that writes its rows, as a database/sql service does
// with [idem.Store.Do].
//
// It is no second implementation: it adapts pgx's handles to idem's seam
// ([idem.Conn], [idem.Tx], [idem.Runner]), and the methods of
// [idem.Store] and [idem.Claim] named with On run over them, with the
// same claim algorithm, statements, fencing and Observer. One
// [*idem.Store] serves both drivers on one table:
//
//	store, err := idem.New(idem.Postgres)
//	...
//	err = idempgx.RunTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
//		res, err := store.DoOn(ctx, idempgx.Tx(tx), req, func(ctx context.Context) (idem.Response, error) {
//			// write the business rows through tx
//		})
//		...
//	})
//
// The handle each call takes:
//
//   - [Tx] of a pgx.Tx for DoOn and CompleteOn, which write through the
//     caller's transaction;
//   - [New] of a pool (a [Runner]) for BeginOn, PurgeOn and PurgeBatchOn,
//     which run short transactions of their own, and for the layers that
//     begin the handler's transaction (idemhttp.Config.Runner,
//     idemgrpc.Config.Runner, the consumer middleware's), whose handlers
//     get their pgx.Tx from [TxFrom];
//   - [Conn] of any handle (a Runner is one too) for ExtendOn, ReleaseOn,
//     MigrateOn, InspectOn, InspectKeyOn and StatsOn.
//
// pgx prepares each statement once per connection and reuses it (its
// default statement cache), so idem's statements are parsed and planned
// once per connection, not on every call. Package idem itself does not
// import pgx. This package imports idem and, for [TxFrom], the serving
// core idemserve (which imports only idem), and no serving layer: a
// program on pgx without HTTP links neither idemhttp nor contrib's.
package idempgx
