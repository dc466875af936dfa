package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"slices"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/httpdriver"
	"github.com/idemkit/idem/internal/keygate"
)

// Middleware is the configured middleware; it is safe for concurrent use.
type Middleware struct {
	cfg        Config
	methods    map[string]bool
	replayable map[string]bool   // canonical header names
	drv        httpdriver.Driver // the database driver: database/sql, or idempgx's pgx
	gate       keygate.Gate      // ModeTransaction: one request per key at the database
}

// Handler wraps next: requests whose method is in [Config.Methods] are
// served as the package documentation describes; others reach next
// untouched.
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
			"%s %s requires an %s header: send a new unique key (e.g. a UUID) with each new request, and the same key when you retry it", r.Method, r.URL.Path, HeaderIdempotencyKey)
	}
	if p != nil {
		m.refuse(w, r, key, p)
		return
	}
	body, p := m.readBody(r)
	if p != nil {
		m.refuse(w, r, key, p)
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
		ctx := context.WithValue(r.Context(), requestKey, *req)
		if m.cfg.Mode == ModeTransaction {
			leave, ok := m.wait(ctx, w, r, *req)
			if !ok {
				return
			}
			defer leave()
		}
		// From here the request holds its key: the work is not cancelled
		// when the client goes, so that it finishes and its result is
		// stored for the client's retry, but it is bounded.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Timeout)
		defer cancel()
		if isRetry(r.Header) {
			ctx = idem.WithRetryHint(ctx)
		}
		r = r.WithContext(ctx)
	}
	if m.cfg.Mode == ModeClaim {
		m.serveClaim(next, w, r, req, body)
		return
	}
	m.serveTx(next, w, r, req, body)
}

// refuse answers p, a request refused before the Store saw it, and
// counts it with the Store's Observer as invalid ([idem.Store.Report]).
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, key string, p *Problem) {
	m.cfg.Store.Report(r.Context(), idem.Event{Kind: idem.EventInvalid, Key: key, Err: p})
	p.ServeHTTP(w, r)
}

// wait lets the request r, whose context is now ctx, through the gate
// of its key once no other request with that key in this process is at
// the database, so that it waits in memory, not on a pooled connection,
// as long as a duplicate in another process waits on the row lock
// (keygate). Then it answers what that one gets, a 409, or nothing when
// the client went first.
func (m *Middleware) wait(ctx context.Context, w http.ResponseWriter, r *http.Request, req idem.Request) (leave func(), ok bool) {
	leave, err := m.gate.Wait(ctx, m.cfg.Store, req, m.cfg.Timeout, m.cfg.RetryAfter)
	if err != nil {
		m.cfg.Store.Report(ctx, idem.Event{Kind: idem.EventInFlight, Scope: req.Scope, Key: req.Key, Operation: req.Operation})
		if ctx.Err() == nil {
			m.answerError(w, r, err)
		}
		return nil, false
	}
	return leave, true
}

// serveTx runs the handler inside Store.Do, in a transaction RunTx opens
// and retries.
func (m *Middleware) serveTx(next http.Handler, w http.ResponseWriter, r *http.Request, req *idem.Request, body []byte) {
	var (
		rec *recorder
		res idem.Result
	)
	err := m.drv.RunTx(r.Context(), func(tx httpdriver.Tx) error {
		run := func(ctx context.Context) (idem.Response, error) {
			rec = m.run(next, r.WithContext(ctx), httpdriver.Open(m.drv, tx), body)
			return m.result(rec)
		}
		if req == nil {
			_, err := run(r.Context())
			return err
		}
		var err error
		res, err = m.drv.Do(r.Context(), tx, *req, run)
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
func (m *Middleware) run(next http.Handler, r *http.Request, h *httpdriver.Holder, body []byte) *recorder {
	rec := newRecorder()
	next.ServeHTTP(rec, withBody(r.WithContext(httpdriver.WithHolder(r.Context(), h)), body))
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
	h.Set(HeaderIdempotentReplayed, "true")
	writeResponse(w, h, res.StatusCode, res.Body)
}

// readBody reads the whole body, or answers 413 when it is over MaxBody.
func (m *Middleware) readBody(r *http.Request) ([]byte, *Problem) {
	tooLarge := func() *Problem {
		return problem(http.StatusRequestEntityTooLarge, TypeBodyTooLarge, "Request body too large",
			"the request body is over %d bytes, the most this endpoint accepts with an %s; send a smaller body", m.cfg.MaxBody, HeaderIdempotencyKey)
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
