package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"sync/atomic"
	"time"
)

// Request identifies one idempotent operation.
type Request struct {
	Scope       string // who owns the key (user, tenant, API client); keys never collide across scopes
	Key         string // the client's Idempotency-Key: 1..255 bytes, visible ASCII (0x21..0x7E)
	Operation   string // what the key is bound to, e.g. "POST /v1/charges"
	Fingerprint string // digest of the request payload, e.g. from Fingerprint
	// Retention is how long this record replays once completed (per
	// operation, route or method); 0: the Store's ([WithRetention]). At
	// most [MaxDuration]. The record stores its own expiry, which the
	// purge honours.
	Retention time.Duration
	// KeyMemory is how long past its retention this record's key is
	// still refused ([ErrExpired]) instead of run again (per operation,
	// route or method); 0: the Store's ([WithKeyMemory]). At most
	// [MaxDuration]. The record stores its own forget time when it is
	// completed, which every purge and every Store honours, whatever its
	// own key memory.
	KeyMemory time.Duration
}

// Response is the final result of an operation, stored and replayed.
type Response struct {
	StatusCode int
	Header     http.Header // may be nil
	Body       []byte      // any bytes; replayed byte for byte
	// Reference is a small reference to what the operation created: a
	// URL or path to GET it, or its ID; "" for none. At most
	// [MaxReference] bytes of UTF-8 without control characters
	// ([ErrInvalidReference]). It is replayed with the response, sealed
	// like it ([WithSealer]), and kept when the purge drops the response
	// within the key memory, so that a late retry's [ExpiredError]
	// carries it.
	Reference string
}

// Result is what Do returns.
type Result struct {
	Response
	Replayed bool // the response comes from an earlier execution; fn did not run
}

// Fingerprint is the hex SHA-256 of the parts, each length-prefixed, so that
// ("ab","c") and ("a","bc") differ.
func Fingerprint(parts ...[]byte) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Store records idempotency keys in one table through one [Dialect].
// It holds no connections and is safe for concurrent use.
type Store struct {
	dialect   Dialect
	table     string
	lease     time.Duration
	retention time.Duration
	keyMemory time.Duration // WithKeyMemory; 0: none
	lockWait  time.Duration // with hasLockWait: the bound of WithLockTimeout
	st        *statements   // the dialect's statements for the table
	observer  Observer
	// completed holds the keys this Store has served (completed.go).
	completed *completedKeys
	// expirySweep and legacySweep are the purge's walks through the
	// records in the order of their expiry, and through those without one
	// in the order of created_at (purge.go).
	expirySweep, legacySweep sweep
	// sealer seals the stored responses (WithSealer); nil: in the clear.
	sealer Sealer
	// cache is the replay cache (WithReplayCache, cache.go); nil: none.
	cache *replayCache
	// hasLockWait and hasSealer report that WithLockTimeout and
	// WithSealer were given.
	hasLockWait, hasSealer bool
	// watches are the reads of the standbys' positions that the waits of
	// WaitReplicatedOn share (replication.go).
	watches *standbyWatches
}

// sweep is the purge's walk through the records in one order: the
// cursor where the next batch starts (an expires_at, or for the records
// without one a created_at, in µs since the Unix epoch, 0 for the
// beginning), and, where a window's read is bounded ahead (spanned), the
// span the last full window needed.
type sweep struct {
	cursor, span atomic.Int64
}

// Option configures a [Store].
type Option func(*Store)

// Table returns the table name the [Store] was configured with.
func (s *Store) Table() string { return s.table }

// Dialect returns the [Dialect] the [Store] was made for.
func (s *Store) Dialect() Dialect { return s.dialect }

// Lease returns how long a PROCESSING claim is honoured ([WithLease]).
func (s *Store) Lease() time.Duration { return s.lease }

// Retention returns how long a completed key replays by default
// ([WithRetention]).
func (s *Store) Retention() time.Duration { return s.retention }

// KeyMemory returns how long past its retention a key is still refused
// ([WithKeyMemory]); 0 when the Store keeps no key memory.
func (s *Store) KeyMemory() time.Duration { return s.keyMemory }

// retentionOf is how long req's record replays: its own retention, or
// the Store's.
func (s *Store) retentionOf(req Request) time.Duration {
	if req.Retention > 0 {
		return req.Retention
	}
	return s.retention
}

// keyMemoryOf is how long past its expiry req's record keeps its key:
// its own key memory, or the Store's.
func (s *Store) keyMemoryOf(req Request) time.Duration {
	if req.KeyMemory > 0 {
		return req.KeyMemory
	}
	return s.keyMemory
}

// LockTimeout returns the bound of [WithLockTimeout] on how long Do and
// Begin wait for another open transaction that holds the key, and whether
// the Store has one. A layer that makes duplicates wait in memory before
// they reach the database (idemhttp, idemgrpc) bounds that wait by it too,
// so that a duplicate gets the same answer whichever instance it reaches.
func (s *Store) LockTimeout() (time.Duration, bool) { return s.lockWait, s.hasLockWait }

// Do runs fn at most once per (Scope, Key) among all transactions that
// commit. tx must be an open transaction (see [DBTX] for which handles are
// one; a pool or a connection is refused before any statement): the
// record is written through it, so it commits or rolls back with the
// caller's own rows.
//
// When fn runs and returns a [Response], the [Response] is stored in tx and
// returned with Replayed false. When an earlier execution completed, its
// [Response] is returned with Replayed true and fn is not called. When fn
// returns an error, Do returns it (errors.Is and errors.As still find it),
// removes its claim from tx and stores nothing; the caller should roll
// back. See docs/semantics.md.
//
// Every statement Do runs after its claim is fenced on the claim's token:
// if the database ended tx while fn ran (MySQL and SQLite do so at a
// deadlock or an interrupted write, and the *sql.Tx stays open, so the
// statement runs on its own), it changes nothing, whoever holds the key by
// then, and Do returns an error that says so, wraps fn's error if any, and
// for which [IsRetryable] is true: roll back and retry.
func (s *Store) Do(ctx context.Context, tx DBTX, req Request, fn func(ctx context.Context) (Response, error)) (Result, error) {
	tx, err := txOf(tx, "Do")
	if err != nil {
		return Result{}, err
	}
	return s.DoOn(ctx, sqlTx{sqlConn{tx}}, req, fn)
}
