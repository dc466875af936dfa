package idemhttp

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// DefaultMaxBody is the default of [Config.MaxBody]: 1 MiB.
const DefaultMaxBody = 1 << 20

// Config configures the middleware. Store, Scope and one of DB and Runner
// are required.
type Config struct {
	// Store records the keys; its table must exist ([idem.Store.Migrate]).
	Store *idem.Store
	// DB is the database the transactions run on, the one holding the
	// Store's table and the handler's rows, for a service on
	// database/sql; TxOptions are the options of every transaction, e.g.
	// its isolation level (nil: the database's defaults).
	DB        *sql.DB
	TxOptions *sql.TxOptions
	// Runner, in place of DB and TxOptions, runs the transactions on
	// another driver's pool: idempgx.New(pool, pgx.TxOptions{...}) for
	// pgx, whose handlers get their pgx.Tx from idempgx.TxFrom.
	Runner idem.Runner
	// Mode is [idemserve.ModeTransaction] (the default) or [idemserve.ModeClaim], for handlers
	// that call slow external services.
	Mode idemserve.Mode

	// Methods are the request methods the middleware handles, default
	// POST and PATCH. Requests with any other method pass through
	// untouched, with no transaction ([TxFrom] returns nil).
	Methods []string
	// Required makes a request without an Idempotency-Key a 400. When
	// false, such a request runs in a transaction like any other, but with
	// no key recorded, so a retry runs it again.
	Required bool
	// Scope returns who owns the request's key: the authenticated
	// principal, tenant or API client, so that keys never collide across
	// owners and one caller's key never replays another's response. It is
	// required; a service with a single caller sets [SingleTenant]. A
	// *[Problem] it returns is the answer (say a 401); any other error is a
	// 500. It may read the body (to check a signature, say): it gets a copy
	// of its own, as does Operation.
	Scope func(*http.Request) (string, error)
	// Operation returns what the key is bound to: a key reused with another
	// operation is a 422. Default: the method and path, "POST /v1/charges"
	// (a path too long for [idem.MaxOperationLen] is replaced by its
	// SHA-256).
	Operation func(*http.Request) string
	// Retention returns how long the record of a request replays once
	// completed, per route or method (idem.Request.Retention); nil, or 0
	// for a request: the Store's ([idem.WithRetention]).
	Retention func(*http.Request) time.Duration
	// FingerprintFields names, by JSON Pointer (RFC 6901: "/amount",
	// "/order/items"), the members of a JSON request body that count in
	// its fingerprint: a retry whose other members changed (a timestamp, a
	// trace id, a retry counter) replays, and one whose counted members
	// changed is a 422. FingerprintIgnore names members that do not count,
	// wherever they are; with both, what counts is the fields, less what
	// is ignored within them. Package jsonsel says exactly what is hashed:
	// member order and whitespace never matter, numbers and strings count
	// as written, and a counted field that is absent counts as absent (it
	// differs from any value, null included).
	//
	// With either set, a request with a key must have a JSON body: another
	// Content-Type is a 415 and a body that is not valid JSON a 400
	// (problem types [TypeBodyNotJSON] and [TypeBodyInvalidJSON]), never
	// a silent digest of the whole body. Unset (the default), the whole
	// body counts, as docs/http.md describes.
	//
	// The fingerprint then carries a version made from these settings
	// and FingerprintHeaders (idem.VersionedFingerprint), so that after a
	// change of them a retry of a key stored before is a 422 of its own
	// type ([TypeFingerprintChanged]), which says so, rather than a
	// reused key's.
	FingerprintFields []string
	FingerprintIgnore []string
	// FingerprintHeaders names request header fields that count in the
	// fingerprint beside the method, path, query and body (a tenant or an
	// API version header): each name, and its values in order, an absent
	// field counting as no values. Names are case-insensitive.
	FingerprintHeaders []string
	// KeyMemory returns how long past its retention the key of a
	// request's record is still refused (410) instead of run again, per
	// route or method (idem.Request.KeyMemory); nil, or 0 for a request:
	// the Store's ([idem.WithKeyMemory]). The record keeps it: every
	// purge honours it, whatever its own settings.
	KeyMemory func(*http.Request) time.Duration
	// ReferenceField returns, per route, the JSON Pointer (RFC 6901:
	// "/id", "/charge/id") of the member of the handler's JSON response
	// body whose value (a string, or a number as written) the record keeps
	// as its reference to what the request created
	// (idem.Response.Reference); nil, or "" for a request: the response's
	// Location header. The record keeps the reference past its response
	// within the key memory, and a retry refused then (410) gets it as
	// its Location and the problem's "reference" member, so that the
	// client can fetch the object. A response without the member (a
	// decline) keeps none; a pointer that is not one, a body that is not
	// JSON, or a reference over idem.MaxReference bytes is an error (500,
	// logged, nothing stored).
	ReferenceField func(*http.Request) string
	// MaxBody is the largest request body accepted, in bytes; a larger one
	// is a 413 before any database work. Default [DefaultMaxBody] (1 MiB).
	MaxBody int64
	// Timeout bounds the work of a request that holds its key, and how
	// long a duplicate in this process waits in memory for the request
	// ahead of it, as idemserve.Config.Timeout says; then the duplicate is
	// a 409. Default [idemserve.DefaultTimeout].
	Timeout time.Duration
	// RetryAfter is the Retry-After of a 409 (another request holds the
	// key) and of a 503 (contention), as idemserve.Config.RetryAfter says;
	// it is sent in whole seconds, rounded up. Default [idemserve.DefaultRetryAfter].
	RetryAfter time.Duration
	// ReplayHeaders are response header fields replayed in addition to
	// Content-Type, Location and ETag. Set-Cookie is refused.
	ReplayHeaders []string
	// StoreServerErrors makes 5xx answers results too: committed with the
	// handler's rows, stored and replayed. By default they are rolled back
	// and a retry runs the handler again.
	StoreServerErrors bool
	// Logger receives every error answered with a 500 Problem, whose
	// detail does not show it to the client ([Middleware.Fail] included),
	// a claim that could not be released, and once per key ID a stored
	// response that cannot be opened (501 [TypeUnsealable]). Default
	// [slog.Default].
	Logger *slog.Logger
	// Standbys, when positive, answers only what survives a failover of
	// a PostgreSQL primary: each answer (fresh or replayed, and a 422 or
	// 410 read from a record) waits until the commit it rests on has
	// reached this many standbys, as idemserve.Config.Standbys says.
	// Past StandbyWait the answer is a 503 of type [TypeNotReplicated]
	// with Retry-After: outcome unknown, retry with the same key. New
	// refuses it on another dialect.
	Standbys int
	// StandbyWait bounds that wait. Default [idemserve.DefaultStandbyWait].
	StandbyWait time.Duration
}

// SingleTenant is the [Config.Scope] of a service with a single caller:
// every request's key is in one scope, "". It costs isolation between
// callers: they all share one key space, so a key one caller sent replays
// its stored response (status, body, Location) to any other caller who
// sends the same key and request, and tells one who sends another request
// that the key exists (a 422). Use it only where every request comes from
// one trusted client; otherwise return the authenticated caller from
// [Config].Scope.
func SingleTenant(*http.Request) (string, error) { return "", nil }

// New checks cfg, fills in its defaults and returns the middleware.
func New(cfg Config) (*Middleware, error) {
	if cfg.Scope == nil {
		return nil, errors.New("idemhttp: Config needs a Scope: a function that returns who owns the request's key (the authenticated principal, tenant or API client), so that one caller's key never replays another's response; a service with a single trusted caller sets Scope: idemhttp.SingleTenant")
	}
	if cfg.MaxBody < 0 {
		return nil, fmt.Errorf("idemhttp: MaxBody must not be negative, got %d", cfg.MaxBody)
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.Methods == nil {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Operation == nil {
		cfg.Operation = defaultOperation
	}
	core, err := idemserve.New(idemserve.Config{Layer: "idemhttp", Store: cfg.Store, DB: cfg.DB, TxOptions: cfg.TxOptions, Runner: cfg.Runner, Mode: cfg.Mode,
		Timeout: cfg.Timeout, RetryAfter: cfg.RetryAfter, Logger: cfg.Logger, Standbys: cfg.Standbys, StandbyWait: cfg.StandbyWait})
	if err != nil {
		return nil, err
	}
	fp, err := newFingerprinter(cfg)
	if err != nil {
		return nil, err
	}
	m := &Middleware{cfg: cfg, core: core, fp: fp, methods: map[string]bool{}, replayable: map[string]bool{}}
	for _, method := range cfg.Methods {
		m.methods[method] = true
	}
	for _, name := range append([]string{"Content-Type", "Location", "ETag"}, cfg.ReplayHeaders...) {
		c := textproto.CanonicalMIMEHeaderKey(name)
		if c == "Set-Cookie" || c == "Set-Cookie2" {
			return nil, fmt.Errorf("idemhttp: ReplayHeaders may not hold %s: a cookie set for one client must never be replayed", name)
		}
		m.replayable[c] = true
	}
	return m, nil
}

func defaultOperation(r *http.Request) string {
	op := r.Method + " " + r.URL.EscapedPath()
	if len(op) > idem.MaxOperationLen {
		sum := sha256.Sum256([]byte(r.URL.EscapedPath()))
		op = r.Method + " sha256:" + hex.EncodeToString(sum[:])
	}
	return op
}
