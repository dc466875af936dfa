package idem

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// Limits on the fields of a Request, checked before any statement runs.
const (
	MaxKeyLen         = 255 // bytes in Request.Key
	MaxScopeLen       = 255 // bytes in Request.Scope
	MaxOperationLen   = 255 // bytes in Request.Operation
	MaxFingerprintLen = 128 // bytes in Request.Fingerprint
)

// Defaults for the options of New.
const (
	DefaultTable     = "idempotency_keys"
	DefaultLease     = 30 * time.Second
	DefaultRetention = 24 * time.Hour
)

var (
	// ErrInvalidKey reports an Idempotency-Key that is empty, longer than
	// 255 bytes, or holds a byte outside visible ASCII (0x21..0x7E). A key is
	// never truncated or trimmed. HTTP: 400.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")
	// ErrInvalidRequest reports a Scope or Operation over 255 bytes, holding
	// NUL or not valid UTF-8, or a Fingerprint over 128 bytes; the message
	// names the field. HTTP: 400.
	ErrInvalidRequest = errors.New("idem: invalid request")
	// ErrMismatch reports a (Scope, Key) already used with another Operation
	// or Fingerprint, whether that request completed or is still running.
	// HTTP: 422.
	ErrMismatch = errors.New("idem: idempotency key reused with a different request")
	// ErrInFlight reports that another live claim holds the key. The error
	// is an *InFlightError that says when to retry. HTTP: 409.
	ErrInFlight = errors.New("idem: a request with this idempotency key is in flight")
	// ErrLeaseLost reports that a Claim is no longer current: another
	// request took the key over after the lease ran out or after Release,
	// or the claim was already completed or released, or its record was
	// purged. Its completion, heartbeat or release changed nothing; the
	// message says which case it is. Roll back the transaction it was part
	// of.
	ErrLeaseLost = errors.New("idem: lease lost")
)

// InFlightError is returned while another live claim holds the key.
// errors.Is(err, ErrInFlight) reports true for it.
type InFlightError struct {
	// RetryAfter is the claim's remaining lease, by the database clock,
	// rounded up to a whole second (at least one second).
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("%v; retry after %v", ErrInFlight, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInFlight) true.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

func inFlight(leaseLeft time.Duration) *InFlightError {
	secs := (leaseLeft + time.Second - 1) / time.Second
	return &InFlightError{RetryAfter: max(secs, 1) * time.Second}
}

// Request identifies one idempotent operation.
type Request struct {
	Scope       string // who owns the key (user, tenant, API client); keys never collide across scopes
	Key         string // the client's Idempotency-Key: 1..255 bytes, visible ASCII (0x21..0x7E)
	Operation   string // what the key is bound to, e.g. "POST /v1/charges"
	Fingerprint string // digest of the request payload, e.g. from Fingerprint
}

// Response is the final result of an operation, stored and replayed.
type Response struct {
	StatusCode int
	Header     http.Header // may be nil
	Body       []byte      // any bytes; replayed byte for byte
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

// Store records idempotency keys in one table through one Dialect.
// It holds no connections and is safe for concurrent use.
type Store struct {
	dialect   Dialect
	table     string
	parts     []string // table, split into its validated identifiers
	lease     time.Duration
	retention time.Duration
	lockWait  time.Duration // with hasLockWait: the bound of WithLockTimeout
	q         queries
	observer  Observer
	// hasLockWait reports that WithLockTimeout was given.
	hasLockWait bool
}

// Option configures a Store.
type Option func(*Store)

// WithTable sets the table's name (default "idempotency_keys"). It must be
// an identifier, optionally schema-qualified: letters, digits and
// underscores, not starting with a digit, at most 48 bytes a part. Any other
// name makes New return an error; it is never interpolated into SQL.
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithLease sets how long a PROCESSING claim is honoured before another
// request may take it over (default 30s). It must be positive and at most
// MaxDuration.
func WithLease(d time.Duration) Option { return func(s *Store) { s.lease = d } }

// WithRetention sets how long a completed key replays (default 24h). Past
// it the key is forgotten and may be reused with any payload. It must be
// positive and at most MaxDuration.
func WithRetention(d time.Duration) Option { return func(s *Store) { s.retention = d } }

// MaxDuration is the largest lease, retention or Extend that idem accepts:
// 100 years. Durations are sent to the database in microseconds and added
// to its clock; a larger one could overflow that arithmetic (Go's
// time.Duration near its maximum) or a DATETIME column (year 9999 on
// MySQL), and would then mean a lease or retention already over.
const MaxDuration = 100 * 365 * 24 * time.Hour

// checkDuration refuses a duration that is not positive or exceeds
// MaxDuration, naming what it is for.
func checkDuration(what string, d time.Duration) error {
	if d <= 0 || d > MaxDuration {
		return fmt.Errorf("idem: %s must be positive and at most %v (MaxDuration), got %v", what, MaxDuration, d)
	}
	return nil
}

// MaxLockTimeout is the largest bound WithLockTimeout accepts.
const MaxLockTimeout = 24 * time.Hour

// WithLockTimeout bounds how long Do and Begin wait for another open
// transaction that holds the same key (a duplicate request still running
// inside Do). After d the duplicate gives up with an *InFlightError whose
// RetryAfter is d rounded up to a second, and the caller's transaction is
// left usable and as it was: idem runs the claim inside a savepoint with
// lock_timeout set for it (PostgreSQL), or with innodb_lock_wait_timeout
// set for it, in whole seconds, rounded up (MySQL), and sets the session's
// own value back. This costs four more statements per Do on PostgreSQL
// and three on MySQL. d must be positive and at most MaxLockTimeout.
//
// Without it, a duplicate waits as long as the database lets it: for ever
// on PostgreSQL unless lock_timeout, statement_timeout or
// idle_in_transaction_session_timeout ends the wait or the holder, and
// innodb_lock_wait_timeout (default 50s) on MySQL. See docs/claims.md.
func WithLockTimeout(d time.Duration) Option {
	return func(s *Store) { s.lockWait, s.hasLockWait = d, true }
}

// New returns a Store for the dialect, or an error that names the bad
// option (a table name that is not an identifier, a lease, retention or
// lock timeout out of bounds, an option the dialect does not support). A
// Store that New returns is usable: no later call reports its
// configuration.
func New(d Dialect, opts ...Option) (*Store, error) {
	s := &Store{dialect: d, table: DefaultTable, lease: DefaultLease, retention: DefaultRetention}
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
		return errors.New("idem: New needs a Dialect (idem.Postgres, idem.MySQL or idem.SQLite)")
	}
	if err := checkDuration("lease", s.lease); err != nil {
		return err
	}
	if err := checkDuration("retention", s.retention); err != nil {
		return err
	}
	if s.hasLockWait {
		if s.lockWait <= 0 || s.lockWait > MaxLockTimeout {
			return fmt.Errorf("idem: lock timeout must be positive and at most %v, got %v", MaxLockTimeout, s.lockWait)
		}
		if _, ok := s.dialect.(lockWaiter); !ok {
			return fmt.Errorf("idem: WithLockTimeout is not supported by the %s dialect", s.dialect.Name())
		}
	}
	parts, err := parseTable(s.table)
	if err != nil {
		return err
	}
	s.parts = parts
	s.q = s.dialect.queries(s.dialect.quote(parts))
	return nil
}

// Table returns the table name the Store was configured with.
func (s *Store) Table() string { return s.table }

// Lease returns how long a PROCESSING claim is honoured ([WithLease]).
func (s *Store) Lease() time.Duration { return s.lease }

// Migrate creates the table and its index if they are absent, with the DDL
// of package schema for the Store's dialect and table name. It is safe to
// run again. On MySQL, DDL commits any transaction open on db.
func (s *Store) Migrate(ctx context.Context, db DBTX) error {
	if db == nil {
		return errors.New("idem: Migrate needs a database handle, got nil")
	}
	for _, stmt := range s.dialect.schema(s.parts) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("idem: migrate table %s: %w; check that the database user may create tables and indexes, then run Migrate again (it is safe to repeat)", s.table, err)
		}
	}
	return nil
}

// Do runs fn at most once per (Scope, Key) among all transactions that
// commit. tx must be an open transaction (*sql.Tx or *sqlx.Tx): the record is
// written through it, so it commits or rolls back with the caller's own rows.
//
// When fn runs and returns a Response, the Response is stored in tx and
// returned with Replayed false. When an earlier execution completed, its
// Response is returned with Replayed true and fn is not called. When fn
// returns an error, Do returns that error unchanged, removes its claim from
// tx and stores nothing; the caller should roll back. See docs/semantics.md.
//
// Every statement Do runs after its claim is fenced on the claim's token:
// if the database ended tx while fn ran (MySQL and SQLite do so at a
// deadlock or an interrupted write, and the *sql.Tx stays open, so the
// statement runs on its own), it changes nothing, whoever holds the key by
// then, and Do returns an error that says so, wraps fn's error if any, and
// for which IsRetryable is true: roll back and retry.
func (s *Store) Do(ctx context.Context, tx DBTX, req Request, fn func(ctx context.Context) (Response, error)) (res Result, err error) {
	start := startWatch()
	if err := checkTx(tx); err != nil {
		return Result{}, err
	}
	if fn == nil {
		return Result{}, errors.New("idem: Do needs a function to run, got nil")
	}
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	defer s.observeDo(ctx, req, start, &res, &err)
	replay, token, err := s.claim(ctx, tx, req, false)
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
		// Best effort: if the caller commits anyway, the key stays free.
		// An error here means tx is already unusable and must be rolled
		// back; no record changed means the claim is no longer there.
		if res, rerr := s.exec(ctx, tx, s.q.remove, req.Scope, req.Key, token); rerr == nil {
			if n, rerr := res.RowsAffected(); rerr == nil && n == 0 {
				return Result{}, txEnded("remove the claim", req, err)
			}
		}
		return Result{}, err
	}
	res1, err := s.exec(ctx, tx, s.q.completeClaim,
		resp.StatusCode, encodeHeader(resp.Header), resp.Body, req.Scope, req.Key, token)
	if err != nil {
		return Result{}, stmtErr("store the response", req, err)
	}
	if n, err := res1.RowsAffected(); err != nil {
		return Result{}, stmtErr("store the response", req, err)
	} else if n != 1 {
		return Result{}, txEnded("store the response", req, nil)
	}
	return Result{Response: resp}, nil
}

// errTxEnded is wrapped by the error Do returns when its statement after
// fn, fenced on its claim's token, changed nothing: the claim this
// transaction made is gone. IsRetryable reports true for it.
var errTxEnded = errors.New("idem: the transaction was rolled back by the database")

// txEnded reports that Do's statement after fn (what) found no claim of
// its own to change, wrapping cause (fn's error) when there is one. MySQL
// and SQLite end a transaction whole at a deadlock, a lock wait timeout
// with innodb_rollback_on_timeout, or an interrupted write, while the
// *sql.Tx stays open: the statement then ran on its own and, fenced on the
// token, changed nothing. A retry of the whole transaction replays the
// result of whoever holds the key now, or runs again.
func txEnded(what string, req Request, cause error) error {
	const why = "the claim this transaction made is gone: the database ended the transaction " +
		"(a deadlock or an interrupted statement does so on MySQL and SQLite while the *sql.Tx stays open), " +
		"or a statement in it deleted or changed the claim"
	const next = "roll back and retry (RunTx does this): the retry replays the result of whoever holds the key now, or runs again"
	if cause != nil {
		return fmt.Errorf("%w: %s for key %q in scope %q changed nothing; %s; fn's error: %w; %s", errTxEnded, what, req.Key, req.Scope, why, cause, next)
	}
	return fmt.Errorf("%w: %s for key %q in scope %q changed nothing; %s; %s", errTxEnded, what, req.Key, req.Scope, why, next)
}

// stmtErr reports that one of idem's statements failed: what idem was
// doing, for which key, the database's error, and what to do next.
func stmtErr(what string, req Request, err error) error {
	next := "roll back the transaction"
	if IsRetryable(err) {
		next = "roll back and run the whole transaction again (RunTx does this)"
	}
	return fmt.Errorf("idem: %s for key %q in scope %q: %w; %s", what, req.Key, req.Scope, err, next)
}

// checkTx refuses handles that are not a transaction: anything that can
// begin one (*sql.DB, *sql.Conn, *sqlx.DB) runs each statement on its own.
func checkTx(tx DBTX) error {
	if tx == nil {
		return errors.New("idem: Do needs an open transaction, got nil")
	}
	if _, ok := tx.(interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	}); ok {
		return fmt.Errorf("idem: Do needs an open transaction (*sql.Tx or *sqlx.Tx), got %T: its statements would commit one by one", tx)
	}
	return nil
}

func (r Request) validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if err := checkField("Scope", r.Scope, MaxScopeLen); err != nil {
		return err
	}
	if err := checkField("Operation", r.Operation, MaxOperationLen); err != nil {
		return err
	}
	return checkField("Fingerprint", r.Fingerprint, MaxFingerprintLen)
}

// ValidateKey reports whether key is a valid Idempotency-Key: 1..255 bytes
// of visible ASCII (0x21..0x7E). The error wraps ErrInvalidKey.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7E {
			return fmt.Errorf("%w: byte %#02x at offset %d is not visible ASCII (0x21..0x7E)", ErrInvalidKey, c, i)
		}
	}
	return nil
}

func checkField(name, v string, limit int) error {
	switch {
	case len(v) > limit:
		return fmt.Errorf("%w: %s is %d bytes, at most %d allowed", ErrInvalidRequest, name, len(v), limit)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidRequest, name)
	}
	for i := 0; i < len(v); i++ {
		if v[i] == 0 {
			return fmt.Errorf("%w: %s holds a NUL byte at offset %d", ErrInvalidRequest, name, i)
		}
	}
	return nil
}

func (r Response) validate() error {
	if r.StatusCode < 100 || r.StatusCode > 999 {
		return fmt.Errorf("idem: response status code %d is not a valid HTTP status (100..999); nothing was stored: return a valid status from fn, and roll back the transaction", r.StatusCode)
	}
	return nil
}
