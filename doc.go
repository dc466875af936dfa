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
// PostgreSQL ([Postgres]), MySQL 8.0+ and MariaDB 10.6+ ([MySQL],
// [MariaDB]), TiDB ([TiDB]) and SQLite ([SQLite]). Where an isolation
// level makes the database abort a duplicate instead of letting it wait,
// the error satisfies [IsRetryable] and [RunTx] retries the transaction,
// which then replays. On a MariaDB Galera cluster, where a row lock is one
// node's, Do refuses a session that does not stream its statements, and
// Begin one without causal reads (docs/replication.md).
//
// # Use
//
// Create the table once with [Store.Migrate] (or copy the DDL from package
// schema into your migrations), then call [Store.Do] inside the
// transaction that writes your business rows, as the package's example
// shows. For work that must not hold a transaction open, such as a call
// to a payment provider, [Store.Begin] commits a claim with a lease in a
// short transaction of its own and [Claim.Complete] stores the result
// later, fenced by a token so that a claim taken over after its lease ran
// out can never overwrite the winner.
//
// # Drivers
//
// The methods of [Store] and [Claim] that take a [DBTX] or a *sql.DB run
// on database/sql. Each has a twin named with On that takes the seam
// every driver adapts to: a [Tx] (the caller's transaction), a [Runner]
// (a pool, for idem's own short transactions) or a [Conn] (any handle).
// Package idempgx adapts pgx's handles to them, and idemhttp, idemgrpc and
// the consumer middleware take a Runner, so that each works on every
// driver. docs/architecture.md draws the layers.
//
// All times (leases, retention) come from the database clock. Keys and
// scopes compare byte for byte. Nothing is truncated: input over a limit is
// an error that names the field. An error of a statement is an [*Error],
// whose Hint says what to do about it.
//
// See docs/semantics.md in the repository for the state machine, what is
// stored, and the behaviour under each isolation level.
package idem
