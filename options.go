package idem

import (
	"fmt"
	"time"
)

// Defaults for the options of New.
// (DefaultTable, the table's, is beside the table's name, in dialect.go.)
const (
	DefaultLease     = 30 * time.Second
	DefaultRetention = 24 * time.Hour
)

// WithTable sets the table's name (default "idempotency_keys"). It must be
// an identifier, optionally schema-qualified: letters, digits and
// underscores, not starting with a digit, at most 48 bytes a part. Any other
// name makes New return an error; it is never interpolated into SQL.
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithLease sets how long a PROCESSING claim is honoured before another
// request may take it over (default 30s). It must be positive and at most
// [MaxDuration].
func WithLease(d time.Duration) Option { return func(s *Store) { s.lease = d } }

// WithRetention sets how long a completed key replays (default 24h), for
// a request that sets no Retention of its own. Past it the key is
// forgotten and may be reused with any payload (unless the Store keeps a
// key memory: [WithKeyMemory]). It must be positive and at most
// [MaxDuration]. A record replays for at least its retention after it
// was completed, and for at most its lease more: its expiry is set when
// the key is claimed, so that a completion within the lease changes no
// index.
func WithRetention(d time.Duration) Option { return func(s *Store) { s.retention = d } }

// WithKeyMemory keeps a key for d past its retention: when a completed
// record's response has passed its retention, Purge drops the response
// (its body and header) but keeps the small record (scope, key,
// operation, fingerprint, status code, completion time) until d has
// passed as well. Until then a request with the key is refused without
// running: [ErrExpired] when it matches the record, [ErrMismatch] when it
// does not. A client that retries after a day offline is then told its
// response is gone rather than charged a second time. Off by default and
// with d 0 (a key is forgotten at the end of its retention); else d must
// be positive and at most [MaxDuration]. A request's own
// [Request.KeyMemory] takes its place for that request.
//
// The record keeps its key memory: its completion stores when the key
// may be forgotten (its expiry plus the key memory, from the database
// clock), and every Store and every purge (the idem command's too)
// honours that time whatever its own key memory. The Store's key memory
// applies to the records that stored none: those of a release before
// this one. docs/operations.md, Key memory, gives its storage cost.
func WithKeyMemory(d time.Duration) Option { return func(s *Store) { s.keyMemory = d } }

// checkDuration refuses a duration that is not positive or exceeds
// MaxDuration, naming what it is for.
func checkDuration(what string, d time.Duration) error {
	if d <= 0 || d > MaxDuration {
		return fmt.Errorf("idem: %s must be positive and at most %v (MaxDuration), got %v", what, MaxDuration, d)
	}
	return nil
}

// MaxLockTimeout is the largest bound [WithLockTimeout] accepts.
const MaxLockTimeout = 24 * time.Hour

// WithLockTimeout bounds how long Do and Begin wait for another open
// transaction that holds the same key (a duplicate request still running
// inside Do). After d the duplicate gives up with an *InFlightError whose
// RetryAfter is d rounded up to a second, and the caller's transaction is
// left usable and as it was: idem runs the claim inside a savepoint with
// lock_timeout set for it (PostgreSQL), or with innodb_lock_wait_timeout
// set for it, in whole seconds, rounded up (MySQL), and sets the session's
// own value back. This costs four more statements per Do on PostgreSQL
// and three on MySQL; on PostgreSQL a replay of a key the Store reads
// first (one it has served, or a retry: [WithRetryHint]) costs none,
// since that read waits for no other transaction and runs before the
// bound. d must be positive and at most [MaxLockTimeout].
//
// Without it, a duplicate waits as long as the database lets it: for ever
// on PostgreSQL unless lock_timeout, statement_timeout or
// idle_in_transaction_session_timeout ends the wait or the holder, and
// innodb_lock_wait_timeout (default 50s) on MySQL. See docs/claims.md.
func WithLockTimeout(d time.Duration) Option {
	return func(s *Store) { s.lockWait, s.hasLockWait = d, true }
}

// WithObserver sets the [Observer] that receives an [Event] for every outcome
// of Do, Begin, [Claim.Complete], [Claim.Release] and each purge batch (of
// Purge or PurgeBatch), and for a [Claim.Extend] that fails (not for each
// heartbeat that succeeds). A request refused as invalid before any
// statement ([ErrInvalidKey], [ErrInvalidRequest]) is [EventInvalid]; a
// call that is a programming error (a nil transaction or fn) is not
// reported. By default there is no [Observer].
// Use [SlogObserver] to log the events, or count them into your own metrics.
func WithObserver(o Observer) Option { return func(s *Store) { s.observer = o } }
