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
	"github.com/idemkit/idem/internal/httpdriver"
	"github.com/idemkit/idem/internal/keygate"
)

const (
	// DefaultMaxBody is the default of [Config.MaxBody]: 1 MiB.
	DefaultMaxBody = 1 << 20
	// DefaultTimeout is the default of [Config.Timeout]: 30 s, the Store's
	// default lease ([idem.DefaultLease]). In [ModeClaim] the default is
	// the Store's lease when that is shorter.
	DefaultTimeout = 30 * time.Second
	// DefaultRetryAfter is the default of [Config.RetryAfter]: 1 s.
	DefaultRetryAfter = time.Second
)

// Mode says how the middleware runs a handler.
type Mode int

const (
	// ModeTransaction (the default) opens a transaction, then runs the
	// handler inside [idem.Store.Do]: a duplicate waits for the first
	// request (in memory in this process, on the row lock in another) and
	// replays its result. The transaction stays open while the handler
	// runs, so the handler must be quick.
	ModeTransaction Mode = iota
	// ModeClaim commits a claim on the key with [idem.Store.Begin], then
	// runs the handler with no transaction open, for handlers that call a
	// slow external service (a payment provider): the handler passes
	// ClaimFrom(ctx).RelayKey() on as the provider's idempotency key, then
	// writes its rows through [TxFrom], whose first call begins the
	// transaction. The middleware completes the claim in that transaction
	// with the captured response and commits. A duplicate that arrives
	// meanwhile is a 409 with Retry-After, not a wait.
	ModeClaim
)

// Config configures the middleware. Store, DB and Scope are required; a
// pgx service leaves DB and TxOptions unset and builds the middleware
// with idempgx.Middleware, on its *pgxpool.Pool.
type Config struct {
	// Store records the keys; its table must exist ([idem.Store.Migrate]).
	Store *idem.Store
	// DB is the database the transactions run on, the one holding the
	// Store's table and the handler's rows.
	DB *sql.DB
	// TxOptions are the options of every transaction, e.g. its isolation
	// level; nil means the database's default.
	TxOptions *sql.TxOptions
	// Mode is [ModeTransaction] (the default) or [ModeClaim], for handlers
	// that call slow external services.
	Mode Mode

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
	// MaxBody is the largest request body accepted, in bytes; a larger one
	// is a 413 before any database work. Default [DefaultMaxBody] (1 MiB).
	MaxBody int64
	// Timeout bounds the work of a request that holds its key: the handler
	// and the middleware's statements run on a context that the client's
	// disconnect does not cancel, but that ends after Timeout, so that work
	// that started finishes and is stored for the client's retry. A
	// duplicate in this process waits in memory for the request ahead of
	// it at most as long as one in another process waits on the row lock
	// (the Store's [idem.WithLockTimeout], or Timeout when it has none),
	// then is a 409, as that one is. Default [DefaultTimeout] (30 s); in
	// [ModeClaim] it must not exceed the Store's lease ([idem.WithLease]),
	// which is its default when shorter, so that no retry takes over a
	// claim whose handler may still be running.
	Timeout time.Duration
	// RetryAfter is the Retry-After of a 409 (another request holds the
	// key) and of a 503 (contention): when a retry is likely to succeed,
	// not when it is sure to. Default [DefaultRetryAfter] (1 s); a 409 is
	// never told more than the lease left on the claim that holds the key.
	// It is sent in whole seconds, rounded up.
	RetryAfter time.Duration
	// ReplayHeaders are response header fields replayed in addition to
	// Content-Type, Location and ETag. Set-Cookie is refused.
	ReplayHeaders []string
	// StoreServerErrors makes 5xx answers results too: committed with the
	// handler's rows, stored and replayed. By default they are rolled back
	// and a retry runs the handler again.
	StoreServerErrors bool
	// Logger receives the errors answered with a 500 Problem, whose detail
	// does not show them to the client. Default [slog.Default].
	Logger *slog.Logger
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

// New checks cfg, fills in its defaults and returns the middleware, which
// runs its transactions on cfg.DB.
func New(cfg Config) (*Middleware, error) {
	if cfg.DB == nil {
		return nil, errors.New("idemhttp: Config needs a DB, the *sql.DB holding the Store's table and the handler's rows; a pgx service builds the middleware with idempgx.Middleware on its *pgxpool.Pool instead")
	}
	return newMiddleware(cfg, &sqlDriver{store: cfg.Store, db: cfg.DB, opts: cfg.TxOptions})
}

func init() {
	httpdriver.NewMiddleware = func(cfg any, d httpdriver.Driver) (any, error) {
		return newMiddleware(cfg.(Config), d)
	}
}

// newMiddleware is New on the driver d.
func newMiddleware(cfg Config, d httpdriver.Driver) (*Middleware, error) {
	if cfg.Store == nil {
		return nil, errors.New("idemhttp: Config needs a Store, the *idem.Store that records the keys")
	}
	if cfg.Scope == nil {
		return nil, errors.New("idemhttp: Config needs a Scope: a function that returns who owns the request's key (the authenticated principal, tenant or API client), so that one caller's key never replays another's response; a service with a single trusted caller sets Scope: idemhttp.SingleTenant")
	}
	if cfg.Mode != ModeTransaction && cfg.Mode != ModeClaim {
		return nil, fmt.Errorf("idemhttp: unknown Mode %d", cfg.Mode)
	}
	if cfg.MaxBody < 0 {
		return nil, fmt.Errorf("idemhttp: MaxBody must not be negative, got %d", cfg.MaxBody)
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	var err error
	cfg.Timeout, cfg.RetryAfter, err = keygate.Bounds("idemhttp", cfg.Store, cfg.Mode == ModeClaim, cfg.Timeout, cfg.RetryAfter, DefaultTimeout, DefaultRetryAfter)
	if err != nil {
		return nil, err
	}
	if cfg.Methods == nil {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Operation == nil {
		cfg.Operation = defaultOperation
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Middleware{cfg: cfg, drv: d, methods: map[string]bool{}, replayable: map[string]bool{}}
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
