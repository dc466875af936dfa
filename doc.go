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
// out can never overwrite the winner. For a function whose result is not
// an HTTP response (a job, a service method, a queue worker), [Call] runs
// it under a key and stores and replays its typed result.
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
// # Replays from memory
//
// [WithReplayCache] keeps completed records in the process's memory, so
// that a replay costs no round trip: a record enters once the transaction
// that completed or read it is known committed ([RunTx], the serving
// layers, or [TrackCommit]), and leaves before its expiry; [Store.Cached]
// answers before a transaction is opened.
//
// All times (leases, retention) come from the database clock (the replay
// cache counts the durations the database gives on the monotonic clock). Keys and
// scopes compare byte for byte. Nothing is truncated: input over a limit is
// an error that names the field. An error of a statement is an [*Error],
// whose Hint says what to do about it; on a table of an earlier schema
// version its message says so. A nil handle of any type is refused before
// any statement.
//
// # Key memory and references
//
// [WithKeyMemory] and [Request.KeyMemory] keep a key past its retention:
// a late retry is [ErrExpired] and nothing runs. A response may record
// what its operation created ([Response.Reference], [WithReference] for
// [Call]); the record keeps it when the purge drops the response, and
// the late retry's [*ExpiredError] carries it, so that the caller can
// fetch the object.
//
// # Sealing
//
// [WithSealer] seals the stored responses (and their references) at rest, with
// [NewAESGCMSealer]'s keys, which [ParseKeys] reads from the keys file
// that the idem command reads too. A record sealed with a key the Store
// lacks is [ErrUnsealable]: never replayed, never run again. [Store.Reseal]
// (or [Store.ResealBatch], a batch at a time) rewrites the records of an
// older key after a rotation.
//
// See docs/semantics.md in the repository for the state machine, what is
// stored, and the behaviour under each isolation level.
package idem
