// Package idem makes a non-idempotent operation (charge a card, create an
// order, move money) safe to retry.
//
// A client sends an Idempotency-Key with each unsafe request. idem claims
// that key, runs the operation once, and stores the key, a fingerprint of
// the request and the final response in the caller's own database
// transaction, beside the business rows, so that they commit together or
// not at all. Of any number of concurrent or repeated requests with one key,
// exactly one runs the operation and commits; the others wait on the
// database's row lock and replay its response, or are told the key is in
// flight (409) and retry. A reused key with another payload is refused
// ([ErrMismatch], 422).
//
// The database does the deciding: a unique primary key on (scope, key) and
// its row lock, never a read-then-write in Go and never an application
// lock. It holds under READ COMMITTED, REPEATABLE READ and SERIALIZABLE on
// PostgreSQL and MySQL (8.0+, MariaDB 10.6+). Where an isolation level makes
// the database abort a duplicate instead of letting it wait, the error
// satisfies [IsRetryable] and [RunTx] retries the transaction, which then
// replays.
//
// # Use
//
// Create the table once with [Store.Migrate] (or copy the DDL from package
// schema into your migrations), then call [Store.Do] inside the transaction
// that writes your business rows:
//
//	store, err := idem.New(idem.Postgres) // a bad option is an error here
//	err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
//		res, err := store.Do(ctx, tx, idem.Request{
//			Scope:       customerID,
//			Key:         r.Header.Get("Idempotency-Key"),
//			Operation:   "POST /v1/charges",
//			Fingerprint: idem.Fingerprint(body),
//		}, func(ctx context.Context) (idem.Response, error) {
//			// Write the business rows through tx.
//			return idem.Response{StatusCode: 201, Body: chargeJSON}, nil
//		})
//		...
//	})
//
// For work that must not hold a transaction open, such as a call to a
// payment provider, [Store.Begin] commits a claim with a lease in a short
// transaction of its own and [Claim.Complete] stores the result later, fenced
// by a token so that a claim taken over after its lease ran out can never
// overwrite the winner.
//
// All times (leases, retention) come from the database clock. Keys and
// scopes compare byte for byte. Nothing is truncated: input over a limit is
// an error that names the field.
//
// See docs/semantics.md in the repository for the state machine, what is
// stored, and the behaviour under each isolation level.
package idem
