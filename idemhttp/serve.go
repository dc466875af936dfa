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
	"github.com/idemkit/idem/idemserve"
)

// Middleware is the configured middleware; it is safe for concurrent use.
type Middleware struct {
	cfg        Config
	methods    map[string]bool
	replayable map[string]bool // canonical header names
	fp         fingerprinter
	core       *idemserve.Server
}

// Handler wraps next: requests whose method is in [Config.Methods] are
// served as the package documentation describes; others reach next
// untouched.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.Handles(r) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(next, w, r)
	})
}

// Handles reports whether the middleware serves r (its method is one of
// [Config.Methods]), or passes it through to the handler untouched, with
// no transaction: the test a router's adapter makes to tell the two apart.
func (m *Middleware) Handles(r *http.Request) bool { return m.methods[r.Method] }

// attemptError ends an attempt without storing anything: the handler
// answered 5xx or tried to stream. Serve passes it back unchanged and the
// transaction rolls back.
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
	call := idemserve.Call{Retry: isRetry(r.Header)}
	if present {
		scope, err := m.cfg.Scope(withBody(r, body))
		if err != nil {
			m.fail(w, r, "scope", err)
			return
		}
		fingerprint, p := m.fp.of(r, body)
		if p != nil {
			m.refuse(w, r, key, p)
			return
		}
		call.Request = &idem.Request{Scope: scope, Key: key, Operation: m.cfg.Operation(withBody(r, body)), Fingerprint: fingerprint}
		if m.cfg.Retention != nil {
			call.Request.Retention = m.cfg.Retention(r)
		}
		if m.cfg.KeyMemory != nil {
			call.Request.KeyMemory = m.cfg.KeyMemory(r)
		}
	}
	var rec *recorder
	call.Run = func(ctx context.Context) (idem.Response, error) {
		rec = newRecorder()
		next.ServeHTTP(rec, withBody(r.WithContext(ctx), body))
		return m.result(r, rec)
	}
	res, err := m.core.Serve(r.Context(), call)
	switch {
	case err != nil && r.Context().Err() != nil && errors.Is(err, r.Context().Err()):
		// the client went while its request waited for another with its key
	case err != nil:
		m.answerError(w, r, err)
	case res.Replayed:
		m.replay(w, res)
	default:
		writeResponse(w, rec.header, rec.statusCode(), rec.body.Bytes())
	}
}

// refuse answers p, a request refused before the Store saw it, and
// counts it with the Store's Observer as invalid ([idem.Store.Report]).
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, key string, p *Problem) {
	m.cfg.Store.Report(r.Context(), idem.Event{Kind: idem.EventInvalid, Key: key, Err: p})
	p.ServeHTTP(w, r)
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
func (m *Middleware) result(r *http.Request, rec *recorder) (idem.Response, error) {
	if rec.streamed != "" || rec.statusCode() >= 500 && !m.cfg.StoreServerErrors {
		return idem.Response{}, &attemptError{rec: rec}
	}
	ref, err := m.reference(r, rec)
	if err != nil {
		return idem.Response{}, err
	}
	return idem.Response{StatusCode: rec.statusCode(), Header: m.allowed(rec.header), Body: rec.body.Bytes(), Reference: ref}, nil
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
