// Package idemserve is the serving core that every layer which runs a
// handler under an idempotency key shares: idemhttp's middleware,
// idemgrpc's interceptor and idemwatermill's consumer middleware. A layer
// reads its protocol's key, scope and fingerprint into an [idem.Request],
// hands the call to [Server.Serve], and maps what comes back to its own
// statuses or codes: a result (fresh or replayed), or an error whose
// [Outcome] says what the client should do next.
//
// Serve holds everything else, once, for every protocol and driver:
//
//   - the mode: in [ModeTransaction] the handler runs inside
//     [idem.Store.DoOn], in a transaction the Runner begins and retries; in
//     [ModeClaim] it runs under a claim committed by
//     [idem.Store.BeginOn], with no transaction open until it asks for one,
//     and the claim is completed in that transaction;
//   - the in-memory gate: in ModeTransaction, duplicates of one key that
//     reach one process wait in memory, holding no pooled connection, as
//     long as a duplicate in another process waits on the row lock (the
//     Store's lock timeout, else Config.Timeout), and then get what it
//     gets;
//   - detach and timeout: once a call holds its key, its work runs on a
//     context that the client's going does not cancel, bounded by
//     Config.Timeout, so that work that started finishes and is stored for
//     the client's retry;
//   - the transaction the handler writes through, which it reaches with
//     its driver's TxFrom (idemhttp.TxFrom for database/sql,
//     idempgx.TxFrom for pgx), both built on [TxFrom], and its claim
//     ([ClaimFrom]) and request ([RequestFrom]);
//   - what an error means for the client ([Server.Outcome]), logging once
//     per key ID a record it cannot open (Unsealable), a fault of the
//     deployment that no retry cures.
//
// The Runner is the driver's adapter, an [idem.Runner]: [idem.NewSQLRunner]
// for a *sql.DB, idempgx.New for a *pgxpool.Pool, so that every layer
// works on every driver.
package idemserve
