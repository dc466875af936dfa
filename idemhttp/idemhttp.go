// Package idemhttp is net/http middleware that gives a handler the
// Idempotency-Key behaviour of draft-ietf-httpapi-idempotency-key-header,
// on top of idem.Store.
//
// In ModeTransaction (the default), for every request whose method it
// handles (POST and PATCH by default), the middleware reads the key and the
// body, opens a transaction with idem.RunTx and runs the handler inside
// idem.Store.Do. The handler writes its rows through Tx(r.Context()); its
// response is captured, stored with the key in the same transaction, and
// written to the client only after the commit succeeded. A retry with the
// same key gets the stored response back, marked Idempotent-Replayed: true,
// and the handler does not run. Of concurrent requests with one key, one
// runs the handler and the others wait for its transaction, then replay its
// result.
//
// A retryable database error (serialization failure, deadlock) in the
// middleware's own statements or the commit rolls back and runs the whole
// transaction again, handler included: a handler may therefore run more
// than once for one request, but only the rows of the attempt that commits
// remain. Side effects outside the transaction must be idempotent
// themselves. An error of the handler's own statements is the handler's to
// answer; a 5xx rolls back, and the client's retry runs it again.
//
// ModeClaim is for handlers that call a slow external service, such as a
// payment provider, which must not run inside an open transaction. The
// middleware commits a claim on the key (idem.Store.Begin) and runs the
// handler with no transaction open; the handler passes
// ClaimFrom(ctx).RelayKey() to the provider as its idempotency key, then
// writes its rows through Tx, whose first call begins the transaction in
// which the middleware completes the claim. Duplicates that arrive while it
// runs get a 409 with Retry-After.
//
// What is stored and what is not, in both modes:
//   - 2xx, 3xx and 4xx answers are results: stored and replayed.
//   - 5xx answers are rolled back and not stored (a claim is released), so
//     the client's retry runs the handler again (Config.StoreServerErrors
//     changes this).
//   - A handler that panics is rolled back and nothing is stored; the panic
//     is passed on to net/http (or a recovering middleware around this one),
//     which drops the connection: nothing was written before the commit.
//   - A handler that calls Flush or Hijack is refused: see ErrStreaming.
//
// Replays carry the stored status and body and, of the stored header
// fields, Content-Type, Location, ETag and those in Config.ReplayHeaders;
// Set-Cookie is never stored or replayed. The middleware's own answers are
// application/problem+json (RFC 9457): 400 for a malformed key, 413 for a
// body over Config.MaxBody, 409 with Retry-After while another request
// holds the key, 422 for a key reused with another request. docs/http.md
// describes them all and gives a client retry recipe.
package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// DefaultMaxBody is the default of Config.MaxBody: 1 MiB.
const DefaultMaxBody = 1 << 20

// Config configures the middleware. Store and DB are required.
type Config struct {
	// Store records the keys; its table must exist (idem.Store.Migrate).
	Store *idem.Store
	// DB is the database the transactions run on, the one holding the
	// Store's table and the handler's rows.
	DB *sql.DB
	// TxOptions are the options of every transaction, e.g. its isolation
	// level; nil means the database's default.
	TxOptions *sql.TxOptions
	// Mode is ModeTransaction (the default) or ModeClaim, for handlers that
	// call slow external services.
	Mode Mode

	// Methods are the request methods the middleware handles, default
	// POST and PATCH. Requests with any other method pass through
	// untouched, with no transaction (Tx returns nil).
	Methods []string
	// Required makes a request without an Idempotency-Key a 400. When
	// false, such a request runs in a transaction like any other, but with
	// no key recorded, so a retry runs it again.
	Required bool
	// Scope returns who owns the request's key (the authenticated user,
	// tenant or API client), so that keys never collide across owners.
	// Default: one scope, "", for everyone. A *Problem it returns is the
	// answer (say a 401); any other error is a 500. It may read the body
	// (to check a signature, say): it gets a copy of its own, as does
	// Operation.
	Scope func(*http.Request) (string, error)
	// Operation returns what the key is bound to: a key reused with another
	// operation is a 422. Default: the method and path, "POST /v1/charges"
	// (a path too long for idem.MaxOperationLen is replaced by its SHA-256).
	Operation func(*http.Request) string
	// MaxBody is the largest request body accepted, in bytes; a larger one
	// is a 413 before any database work. Default DefaultMaxBody (1 MiB).
	MaxBody int64
	// ReplayHeaders are response header fields replayed in addition to
	// Content-Type, Location and ETag. Set-Cookie is refused.
	ReplayHeaders []string
	// StoreServerErrors makes 5xx answers results too: committed with the
	// handler's rows, stored and replayed. By default they are rolled back
	// and a retry runs the handler again.
	StoreServerErrors bool
	// Logger receives the errors answered with a 500 Problem, whose detail
	// does not show them to the client. Default slog.Default().
	Logger *slog.Logger
}

// Middleware is the configured middleware; it is safe for concurrent use.
type Middleware struct {
	cfg        Config
	methods    map[string]bool
	replayable map[string]bool // canonical header names
}

// New checks cfg and returns the middleware.
func New(cfg Config) (*Middleware, error) {
	if cfg.Store == nil || cfg.DB == nil {
		return nil, errors.New("idemhttp: Config needs a Store and a DB")
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
	if cfg.Methods == nil {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Scope == nil {
		cfg.Scope = func(*http.Request) (string, error) { return "", nil }
	}
	if cfg.Operation == nil {
		cfg.Operation = defaultOperation
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Middleware{cfg: cfg, methods: map[string]bool{}, replayable: map[string]bool{}}
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

type ctxKey int

const (
	txKey ctxKey = iota
	requestKey
	claimKey
)

// Tx returns the transaction the handler writes its rows through, or nil
// outside the middleware and for a method it passes through. The handler
// must not commit or roll it back: the middleware does.
//
// In ModeTransaction the transaction is open before the handler runs. In
// ModeClaim the first call of Tx begins it, so call Tx only once the slow
// work is done. Tx returns nil if it could not begin; the middleware then
// rolls back and answers 500 in place of any 2xx, 3xx or 4xx the handler
// writes (a 5xx of the handler's own is passed on).
func Tx(ctx context.Context) *sql.Tx {
	h, _ := ctx.Value(txKey).(*txHolder)
	if h == nil {
		return nil
	}
	return h.get()
}

// txHolder is a request's transaction: open from the start in
// ModeTransaction, begun by the first call of Tx in ModeClaim.
type txHolder struct {
	mu    sync.Mutex
	tx    *sql.Tx
	begin func() (*sql.Tx, error) // ModeClaim: nil once called
	err   error                   // from begin
}

func (h *txHolder) get() *sql.Tx {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.begin != nil {
		h.tx, h.err = h.begin()
		h.begin = nil
	}
	return h.tx
}

// rollback rolls the transaction back if it began, and keeps it from
// beginning later.
func (h *txHolder) rollback() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.begin = nil
	if h.tx != nil {
		_ = h.tx.Rollback()
	}
}

// RequestFrom returns the idem.Request (scope, key, operation,
// fingerprint) the middleware is running the handler for; ok is false when
// the request carried no key.
func RequestFrom(ctx context.Context) (req idem.Request, ok bool) {
	req, ok = ctx.Value(requestKey).(idem.Request)
	return req, ok
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(next, w, r)
	})
}

// attemptError ends an attempt without storing anything: the handler
// answered 5xx or tried to stream. Do passes it back unchanged and RunTx
// rolls back.
type attemptError struct{ rec *recorder }

func (e *attemptError) Error() string {
	if e.rec.streamed != "" {
		return "idemhttp: handler called " + e.rec.streamed
	}
	return fmt.Sprintf("idemhttp: handler answered %d", e.rec.statusCode())
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, present, p := parseKey(r.Header)
	if p == nil && !present && m.cfg.Required {
		p = problem(http.StatusBadRequest, TypeMissingKey, "Missing Idempotency-Key",
			"%s %s requires an %s header: send a new unique key (e.g. a UUID) with each new request, and the same key when you retry it", r.Method, r.URL.Path, HeaderName)
	}
	if p != nil {
		p.ServeHTTP(w, r)
		return
	}
	body, p := m.readBody(r)
	if p != nil {
		p.ServeHTTP(w, r)
		return
	}
	var req *idem.Request
	if present {
		scope, err := m.cfg.Scope(withBody(r, body))
		if err != nil {
			m.fail(w, r, "scope", err)
			return
		}
		req = &idem.Request{Scope: scope, Key: key, Operation: m.cfg.Operation(withBody(r, body)), Fingerprint: fingerprint(r, body)}
		r = r.WithContext(context.WithValue(r.Context(), requestKey, *req))
	}
	if m.cfg.Mode == ModeClaim {
		m.serveClaim(next, w, r, req, body)
		return
	}
	m.serveTx(next, w, r, req, body)
}

// serveTx runs the handler inside Store.Do, in a transaction RunTx opens
// and retries.
func (m *Middleware) serveTx(next http.Handler, w http.ResponseWriter, r *http.Request, req *idem.Request, body []byte) {
	var (
		rec *recorder
		res idem.Result
	)
	err := idem.RunTx(r.Context(), m.cfg.DB, m.cfg.TxOptions, func(tx *sql.Tx) error {
		run := func(ctx context.Context) (idem.Response, error) {
			rec = m.run(next, r.WithContext(ctx), &txHolder{tx: tx}, body)
			return m.result(rec)
		}
		if req == nil {
			_, err := run(r.Context())
			return err
		}
		var err error
		res, err = m.cfg.Store.Do(r.Context(), tx, *req, run)
		return err
	})
	switch {
	case err != nil:
		m.answerError(w, r, err)
	case res.Replayed:
		m.replay(w, res)
	default:
		writeResponse(w, rec.header, rec.statusCode(), rec.body.Bytes())
	}
}

// run runs the handler on a fresh copy of the body, with h as its
// transaction, and returns what it answered.
func (m *Middleware) run(next http.Handler, r *http.Request, h *txHolder, body []byte) *recorder {
	rec := newRecorder()
	next.ServeHTTP(rec, withBody(r.WithContext(context.WithValue(r.Context(), txKey, h)), body))
	return rec
}

// withBody returns a shallow copy of r whose Body reads body from the
// start: the middleware has read r.Body already.
func withBody(r *http.Request, body []byte) *http.Request {
	c := r.WithContext(r.Context())
	c.Body = io.NopCloser(bytes.NewReader(body))
	return c
}

// result is the Response to store for what the handler answered, or an
// *attemptError when nothing is to be stored.
func (m *Middleware) result(rec *recorder) (idem.Response, error) {
	if rec.streamed != "" || rec.statusCode() >= 500 && !m.cfg.StoreServerErrors {
		return idem.Response{}, &attemptError{rec: rec}
	}
	return idem.Response{StatusCode: rec.statusCode(), Header: m.allowed(rec.header), Body: rec.body.Bytes()}, nil
}

// replay writes a stored response: status, body, the allow-listed header
// fields and Idempotent-Replayed: true.
func (m *Middleware) replay(w http.ResponseWriter, res idem.Result) {
	h := m.allowed(res.Header)
	if h == nil {
		h = http.Header{}
	}
	h.Set(ReplayedHeader, "true")
	writeResponse(w, h, res.StatusCode, res.Body)
}

// readBody reads the whole body, or answers 413 when it is over MaxBody.
func (m *Middleware) readBody(r *http.Request) ([]byte, *Problem) {
	tooLarge := func() *Problem {
		return problem(http.StatusRequestEntityTooLarge, TypeBodyTooLarge, "Request body too large",
			"the request body is over %d bytes, the most this endpoint accepts with an %s; send a smaller body", m.cfg.MaxBody, HeaderName)
	}
	if r.ContentLength > m.cfg.MaxBody {
		return nil, tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBody+1))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok || int64(len(body)) > m.cfg.MaxBody {
		return nil, tooLarge()
	}
	if err != nil {
		return nil, problem(http.StatusBadRequest, TypeBodyUnread, "Request body unreadable",
			"reading the request body failed after %d bytes (%v); send the request again", len(body), err)
	}
	return body, nil
}

// allowed returns the fields of h that may be stored and replayed, names
// and values as they are, or nil when there are none.
func (m *Middleware) allowed(h http.Header) http.Header {
	var out http.Header
	for name, values := range h {
		if m.replayable[textproto.CanonicalMIMEHeaderKey(name)] {
			if out == nil {
				out = http.Header{}
			}
			out[name] = slices.Clone(values)
		}
	}
	return out
}

func (m *Middleware) answerError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		attempt  *attemptError
		inFlight *idem.InFlightError
	)
	switch {
	case errors.As(err, &attempt) && attempt.rec.streamed != "":
		problem(http.StatusInternalServerError, TypeStreaming, "Streaming not supported",
			"the handler of %s %s called %s, but behind idemhttp a response is buffered until its transaction commits; nothing was stored; serve streaming endpoints without the middleware",
			r.Method, r.URL.Path, attempt.rec.streamed).ServeHTTP(w, r)
	case errors.As(err, &attempt):
		writeResponse(w, attempt.rec.header, attempt.rec.statusCode(), attempt.rec.body.Bytes())
	case errors.Is(err, idem.ErrMismatch):
		problem(http.StatusUnprocessableEntity, TypeKeyReused, "Idempotency-Key reused",
			"this %s was already used for a different request (another method, path, query or body); a retry must repeat the request exactly, and a new request needs a new key", HeaderName).ServeHTTP(w, r)
	case errors.Is(err, idem.ErrLeaseLost):
		p := problem(http.StatusConflict, TypeInFlight, "Request taken over",
			"this request ran past its lease and a retry with the same %s took it over; nothing of this attempt was stored; retry to get that request's result", HeaderName)
		p.RetryAfter = time.Second
		p.ServeHTTP(w, r)
	case errors.As(err, &inFlight):
		p := problem(http.StatusConflict, TypeInFlight, "Request in progress",
			"a request with this %s is still being processed; retry after %d seconds to get its result", HeaderName, int(inFlight.RetryAfter.Seconds()))
		p.RetryAfter = inFlight.RetryAfter
		p.ServeHTTP(w, r)
	case errors.Is(err, idem.ErrInvalidKey):
		invalidKey("%v", err).ServeHTTP(w, r)
	case idem.IsRetryable(err):
		p := problem(http.StatusServiceUnavailable, TypeContention, "Database contention",
			"the transaction kept failing with serialization failures or deadlocks and was rolled back; nothing was stored; retry with the same %s", HeaderName)
		p.RetryAfter = time.Second
		p.ServeHTTP(w, r)
	default:
		m.fail(w, r, "transaction", err)
	}
}

// fail answers an error of the server with a 500, or with the error itself
// when it is a *Problem, and logs it.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, stage string, err error) {
	if p, ok := errors.AsType[*Problem](err); ok {
		p.ServeHTTP(w, r)
		return
	}
	m.cfg.Logger.ErrorContext(r.Context(), "idemhttp: request failed", "stage", stage, "method", r.Method, "path", r.URL.Path, "err", err)
	problem(http.StatusInternalServerError, TypeInternal, "Internal error",
		"the request failed on the server and was rolled back; nothing was stored; retry with the same %s", HeaderName).ServeHTTP(w, r)
}
