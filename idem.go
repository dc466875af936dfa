package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
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
	completed *completed
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

// New returns a [Store] for the dialect, or an error that names the bad
// option (a table name that is not an identifier, a lease, retention or
// lock timeout out of bounds, an option the dialect does not support). A
// [Store] that New returns is usable: no later call reports its
// configuration.
func New(d Dialect, opts ...Option) (*Store, error) {
	s := &Store{dialect: d, table: DefaultTable, lease: DefaultLease, retention: DefaultRetention, completed: new(completed), watches: new(standbyWatches)}
	for _, o := range opts {
		o(s)
	}
	if err := s.configure(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) configure() error {
	if s.dialect == nil {
		return errors.New("idem: New needs a Dialect (idem.Postgres, idem.MySQL, idem.MariaDB, idem.TiDB or idem.SQLite)")
	}
	if err := checkDuration("lease", s.lease); err != nil {
		return err
	}
	if err := checkDuration("retention", s.retention); err != nil {
		return err
	}
	if s.keyMemory != 0 {
		if err := checkDuration("key memory", s.keyMemory); err != nil {
			return err
		}
	}
	if s.hasLockWait {
		if s.lockWait <= 0 || s.lockWait > MaxLockTimeout {
			return fmt.Errorf("idem: lock timeout must be positive and at most %v, got %v", MaxLockTimeout, s.lockWait)
		}
		if _, ok := s.dialect.(lockWaiter); !ok {
			return fmt.Errorf("idem: WithLockTimeout is not supported by the %s dialect", s.dialect.Name())
		}
	}
	if s.hasSealer && s.sealer == nil {
		return errors.New("idem: WithSealer needs a Sealer, got nil")
	}
	if err := s.configureCache(); err != nil {
		return err
	}
	parts, err := parseTable(s.table)
	if err != nil {
		return err
	}
	s.st = s.dialect.statements(parts)
	s.st.migrations = withRetention(s.st.migrations, s.retention)
	return nil
}

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

// Migrate creates the table if it is absent, and brings a table made by an
// earlier release of idem to the newest layout this release knows, with
// the migrations of package schema for the [Store]'s dialect and table
// name. It is safe to run again, and from several processes at once, and
// beside live traffic; it leaves a table of a newer layout as it is.
// docs/operations.md says what each migration locks and for how long. On
// MySQL, DDL commits any transaction open on db.
func (s *Store) Migrate(ctx context.Context, db DBTX) error {
	if isNil(db) {
		return errors.New("idem: Migrate needs a database handle, got nil")
	}
	return s.MigrateOn(ctx, sqlConn{db})
}

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

// DoOn is [Store.Do] in tx, the caller's open transaction through any
// driver's adapter (idempgx.Tx for a pgx.Tx): fn runs at most once per
// (Scope, Key) among all transactions that commit, and the record is
// written through tx. DoOn never commits or rolls back tx.
//
// When tx is a [Pipeline] (the transaction of [InPipelinedTx] on pgx:
// idemhttp's, idemgrpc's, the consumer middleware's, idempgx.RunTx's),
// the claim goes in one round trip with tx's BEGIN, and with the read of
// an existing record under READ COMMITTED, and the response is stored
// with tx's COMMIT, after DoOn has returned: a completion that fails then
// fails the commit, which does not commit, so the result DoOn returned
// counts only once tx has committed.
func (s *Store) DoOn(ctx context.Context, tx Tx, req Request, fn func(ctx context.Context) (Response, error)) (res Result, err error) {
	start := startWatch()
	switch {
	case isNil(tx):
		return Result{}, errors.New("idem: Do needs an open transaction, got nil")
	case fn == nil:
		return Result{}, errors.New("idem: Do needs a function to run, got nil")
	}
	defer s.observeDo(ctx, req, start, &res, &err)
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	return s.run(ctx, s.conn(tx), req, nil, fn)
}

// Apply is [Store.Do] for an operation whose response is known before it
// runs, such as a message consumer's acknowledgement or a webhook's 200:
// resp is stored with the claim of a new key, in one statement where Do's
// claim and its completion are two, and fn runs at most once per (Scope,
// Key) among all transactions that commit, as in Do. tx must be an open
// transaction, as Do's.
//
// When fn runs and returns nil, Apply returns resp with Replayed false;
// when an earlier execution completed, its stored response with Replayed
// true, and fn is not called; when fn returns an error, Apply returns it,
// removes its claim from tx and stores nothing, and the caller should
// roll back. A duplicate meets the record as it meets Do's: it waits for
// tx, then replays, or runs if tx rolled back. resp is checked (and
// sealed, with [WithSealer]) before the claim.
//
// Unlike Do, Apply runs no statement after fn when it claimed a new key,
// so it does not check that the database kept tx open while fn ran:
// MySQL and SQLite end a transaction whole at a deadlock or an
// interrupted write while the *sql.Tx stays open, and its statements
// after that commit on their own. fn must return the error of any
// statement of its that fails, as a handler that checks its errors does:
// then the caller rolls back. (On PostgreSQL a failed statement makes the
// COMMIT fail.)
func (s *Store) Apply(ctx context.Context, tx DBTX, req Request, resp Response, fn func(ctx context.Context) error) (Result, error) {
	tx, err := txOf(tx, "Apply")
	if err != nil {
		return Result{}, err
	}
	return s.ApplyOn(ctx, sqlTx{sqlConn{tx}}, req, resp, fn)
}

// ApplyOn is [Store.Apply] in tx, the caller's open transaction through
// any driver's adapter, as [Store.DoOn] is Do's. Through a [Pipeline] the
// claim goes with tx's BEGIN, as DoOn's, and tx's COMMIT goes alone.
func (s *Store) ApplyOn(ctx context.Context, tx Tx, req Request, resp Response, fn func(ctx context.Context) error) (res Result, err error) {
	start := startWatch()
	switch {
	case isNil(tx):
		return Result{}, errors.New("idem: Apply needs an open transaction, got nil")
	case fn == nil:
		return Result{}, errors.New("idem: Apply needs a function to run, got nil")
	}
	defer s.observeDo(ctx, req, start, &res, &err)
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	if err := resp.validate(); err != nil {
		return Result{}, err
	}
	out, err := s.seal(req, resp)
	if err != nil {
		return Result{}, err
	}
	return s.run(ctx, s.conn(tx), req, &out, func(ctx context.Context) (Response, error) { return resp, fn(ctx) })
}

// run is Do and Apply of a valid req through c: the claim (of a record
// stored completed with done, for Apply), fn, and the completion with
// fn's response where the claim did not store it already.
func (s *Store) run(ctx context.Context, c conn, req Request, done *stored, fn func(ctx context.Context) (Response, error)) (Result, error) {
	if replay, hit, err := s.fromCache(ctx, req, true); hit {
		return resultOf(replay), err
	}
	sent := monotonic() // for the replay cache: before the claim, which sets the record's expiry
	replay, cl, err := s.acquire(ctx, c, req, forDo, done)
	if err != nil {
		return Result{}, err
	}
	if replay != nil {
		return *replay, nil
	}
	resp, err := fn(ctx)
	if err == nil {
		err = resp.validate()
	}
	if err != nil {
		return Result{}, s.unclaim(ctx, c, req, cl.token, err)
	}
	if cl.done {
		s.completed.add(req)
		s.cacheCompleted(c, req, *done, sent)
		return Result{Response: resp}, nil
	}
	out := stored{}
	if done != nil { // Apply's claim took a record over: it is a PROCESSING one
		out = *done
	} else if out, err = s.seal(req, resp); err != nil {
		return Result{}, err
	}
	if err := s.store(ctx, c, req, cl.token, out); err != nil {
		return Result{}, err
	}
	s.cacheCompleted(c, req, out, sent)
	return Result{Response: resp}, nil
}

// observeDo reports the outcome of a Do that began at start and returns
// res, err. It is deferred by Do, so that every return reports once.
func (s *Store) observeDo(ctx context.Context, req Request, start stopwatch, res *Result, err *error) {
	if s.observer == nil {
		return
	}
	done, e := EventExecuted, *err
	switch {
	case e == nil && res.StatusCode == 0:
		e = ErrPanicked // every return with a nil error carries a valid status
	case res.Replayed:
		done = EventReplayed
	}
	s.observeErr(ctx, Event{Kind: done, Scope: req.Scope, Key: req.Key, Operation: req.Operation, Duration: start.elapsed()}, e)
}
