package idemhttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/idemserve"
)

// The problem types the middleware answers with. Each is the address of
// its section in docs/http.md, which says what it means and what to do.
const (
	// TypeMissingKey (400): [Config.Required] is set and the request has no
	// Idempotency-Key. Send a new unique key with each new request.
	TypeMissingKey = "https://github.com/idemkit/idem/blob/main/docs/http.md#missing-key"
	// TypeInvalidKey (400): the Idempotency-Key field is malformed (more
	// than one, empty, a list, a bad sf-string, a key too long or not
	// visible ASCII). The detail says which rule was broken.
	TypeInvalidKey = "https://github.com/idemkit/idem/blob/main/docs/http.md#invalid-key"
	// TypeBodyTooLarge (413): the body is over [Config.MaxBody]. Nothing ran.
	TypeBodyTooLarge = "https://github.com/idemkit/idem/blob/main/docs/http.md#body-too-large"
	// TypeBodyUnread (400): reading the request body failed. Nothing ran;
	// send the request again.
	TypeBodyUnread = "https://github.com/idemkit/idem/blob/main/docs/http.md#body-unread"
	// TypeMismatch (422): the key was already used in this scope for
	// another request (method, path, query or body). Do not retry: a new
	// request needs a new key.
	TypeMismatch = "https://github.com/idemkit/idem/blob/main/docs/http.md#key-reused"
	// TypeFingerprintChanged (422): the key was already used, and the
	// server has since changed which parts of a request it compares
	// ([Config].FingerprintFields, FingerprintIgnore, FingerprintHeaders),
	// so it cannot tell a retry from another request. Nothing ran. The
	// first request's response stays stored until its retention passes,
	// but cannot be replayed to this request: look the outcome up another
	// way, or send a new request with a new key.
	TypeFingerprintChanged = "https://github.com/idemkit/idem/blob/main/docs/http.md#fingerprint-changed"
	// TypeBodyNotJSON (415): the route compares selected fields of a JSON
	// body ([Config].FingerprintFields, FingerprintIgnore) and the
	// request's Content-Type is not JSON. Nothing ran.
	TypeBodyNotJSON = "https://github.com/idemkit/idem/blob/main/docs/http.md#body-not-json"
	// TypeBodyInvalidJSON (400): the route compares selected fields of a
	// JSON body and the body is not valid JSON, or a counted member
	// appears twice (in the same or another case), so that which one
	// counts is not known. Nothing ran.
	TypeBodyInvalidJSON = "https://github.com/idemkit/idem/blob/main/docs/http.md#body-invalid-json"
	// TypeExpired (410): the key was used and its stored response is
	// gone: its retention has passed, and the server keeps the key for its
	// key memory (idem.WithKeyMemory) so that the request does not run a
	// second time. Nothing ran. Do not retry with this key: fetch what it
	// created, named by the Location header and the "reference" member
	// when the request recorded it (Config.ReferenceField), or send a new
	// request with a new key.
	TypeExpired = "https://github.com/idemkit/idem/blob/main/docs/http.md#key-expired"
	// TypeInFlight (409, with Retry-After): another request holds the key,
	// or took it over from this one. Retry with the same key and body to
	// get its result.
	TypeInFlight = "https://github.com/idemkit/idem/blob/main/docs/http.md#in-flight"
	// TypeContention (503, with Retry-After): the transaction kept failing
	// with serialization failures or deadlocks. Nothing was stored; retry
	// with the same key.
	TypeContention = "https://github.com/idemkit/idem/blob/main/docs/http.md#contention"
	// TypeNotReplicated (503, with Retry-After): with [Config.Standbys],
	// the request's answer was decided and committed on the primary but
	// had not reached the standbys within [Config.StandbyWait], so a
	// failover could still lose it. Its outcome is unknown: retry with
	// the same key and body, which replays the answer if it survived and
	// runs the request again if it did not.
	TypeNotReplicated = "https://github.com/idemkit/idem/blob/main/docs/http.md#not-replicated"
	// TypeStreaming (500): the handler called Flush or Hijack, which the
	// middleware refuses ([ErrStreaming]). A bug in the server's wiring.
	TypeStreaming = "https://github.com/idemkit/idem/blob/main/docs/http.md#streaming-not-supported"
	// TypeUnsealable (501): the key's request completed, but the server
	// cannot open the response it stored: it is sealed with a key this
	// server lacks (idem.ErrUnsealable), a fault of its deployment that it
	// logs. The request did not run again. A retry will not succeed until
	// the server is fixed, and 501 is the server error that idemclient
	// (and most retrying clients) do not retry; docs/http.md says why.
	TypeUnsealable = "https://github.com/idemkit/idem/blob/main/docs/http.md#unopenable"
	// TypeInternal (500): the server failed; the error is logged to
	// [Config.Logger], not shown. Nothing was stored; retry with the same key.
	TypeInternal = "https://github.com/idemkit/idem/blob/main/docs/http.md#internal"
)

// The names of v0.1.0, before each type took the name of the idem error
// it stands for. Their values, the URIs a client sees, are unchanged.
//
// Deprecated: use TypeMismatch, TypeExpired and TypeUnsealable.
const (
	TypeKeyReused  = TypeMismatch
	TypeKeyExpired = TypeExpired
	TypeUnopenable = TypeUnsealable
)

// Problem is an RFC 9457 problem details object, written as
// application/problem+json. Every answer of the middleware itself is a
// Problem. A [Config.Scope] function may return one (say a 401) to answer
// with it; any other error from Scope is a 500.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Reference, for a [TypeExpired] problem, is what the key's first
	// request created (its Location, or the member Config.ReferenceField
	// names), which its record kept: fetch it. Sent as the Location
	// header too. Empty when the request recorded none.
	Reference string `json:"reference,omitempty"`
	// RetryAfter, when positive, is sent as a Retry-After header in whole
	// seconds, rounded up.
	RetryAfter time.Duration `json:"-"`
}

// Error returns the title and the detail.
func (p *Problem) Error() string {
	return fmt.Sprintf("idemhttp: %d %s: %s", p.Status, p.Title, p.Detail)
}

// ServeHTTP writes the problem: its status, Content-Type
// application/problem+json, Cache-Control no-store, Retry-After when set,
// and the JSON body.
func (p *Problem) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	body, err := json.Marshal(p)
	if err != nil { // a struct of strings and an int always marshals
		panic(err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(seconds(p.RetryAfter), 10))
	}
	if p.Reference != "" {
		h.Set("Location", p.Reference)
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// answerError answers an error of serving a request: a [Problem] of the
// type that says what the client should do next.
func (m *Middleware) answerError(w http.ResponseWriter, r *http.Request, err error) {
	if attempt, ok := errors.AsType[*attemptError](err); ok {
		if attempt.rec.streamed != "" {
			problem(http.StatusInternalServerError, TypeStreaming, "Streaming not supported",
				"the handler of %s %s called %s, but behind idemhttp a response is buffered until its transaction commits; nothing was stored; serve streaming endpoints without the middleware",
				r.Method, r.URL.Path, attempt.rec.streamed).ServeHTTP(w, r)
			return
		}
		writeResponse(w, attempt.rec.header, attempt.rec.statusCode(), attempt.rec.body.Bytes())
		return
	}
	var p *Problem
	switch o := m.core.Outcome(err); o.Kind {
	case idemserve.Mismatch:
		p = problem(http.StatusUnprocessableEntity, TypeMismatch, "Idempotency-Key reused",
			"this %s was already used for a different request (another method, path, query or body); a retry must repeat the request exactly, and a new request needs a new key", HeaderIdempotencyKey)
	case idemserve.FingerprintChanged:
		p = problem(http.StatusUnprocessableEntity, TypeFingerprintChanged, "Idempotency-Key fingerprinted otherwise",
			"this %s was used before the server changed which parts of a request it compares, so it cannot tell whether this request repeats that one; the request did not run; do not retry with this key: look the outcome up another way, or send a new request with a new key", HeaderIdempotencyKey)
	case idemserve.Expired:
		p = problem(http.StatusGone, TypeExpired, "Idempotency-Key expired",
			"this %s was used, and its stored response is gone: its retention has passed; the request did not run again; do not retry with this key: look the outcome up another way, or send a new request with a new key", HeaderIdempotencyKey)
		if o.Reference != "" {
			p = problem(http.StatusGone, TypeExpired, "Idempotency-Key expired",
				"this %s was used, and its stored response is gone: its retention has passed; the request did not run again; do not retry with this key: fetch what it created (the reference, also sent as Location), or send a new request with a new key", HeaderIdempotencyKey)
			p.Reference = o.Reference
		}
	case idemserve.Unsealable:
		p = problem(http.StatusNotImplemented, TypeUnsealable, "Stored response unreadable",
			"this %s was used, and its request completed, but this server cannot read the response it stored (a key it was sealed with is not deployed here); the request did not run again; a retry will not succeed until the server is fixed: do not retry automatically", HeaderIdempotencyKey)
	case idemserve.LeaseLost:
		p = problem(http.StatusConflict, TypeInFlight, "Request taken over",
			"this request ran past its lease and a retry with the same %s took it over; nothing of this attempt was stored; retry to get that request's result", HeaderIdempotencyKey)
		p.RetryAfter = o.RetryAfter
	case idemserve.InFlight:
		p = problem(http.StatusConflict, TypeInFlight, "Request in progress",
			"a request with this %s is still being processed; retry after %s to get its result", HeaderIdempotencyKey, inSeconds(o.RetryAfter))
		p.RetryAfter = o.RetryAfter
	case idemserve.InvalidKey:
		p = invalidKey("%v", err)
	case idemserve.Contention:
		p = problem(http.StatusServiceUnavailable, TypeContention, "Database contention",
			"the transaction kept failing with serialization failures or deadlocks and was rolled back; nothing was stored; retry with the same %s", HeaderIdempotencyKey)
		p.RetryAfter = o.RetryAfter
	case idemserve.NotReplicated:
		p = problem(http.StatusServiceUnavailable, TypeNotReplicated, "Outcome unknown",
			"the request's answer is stored on the primary database but has not yet reached its standbys, so a failover could still lose it; its outcome is unknown: retry after %s with the same %s and the same request, which returns that answer if it survived, or runs the request again if it did not", inSeconds(o.RetryAfter), HeaderIdempotencyKey)
		p.RetryAfter = o.RetryAfter
	default:
		m.fail(w, r, "transaction", err)
		return
	}
	p.ServeHTTP(w, r)
}

// Fail answers err, a failure of a handler behind the middleware that
// wrote no answer of its own, as the middleware answers its own failures:
// a *[Problem] as itself, any other error as a 500 Problem of type
// [TypeInternal] whose detail does not show it, logged to
// [Config.Logger]. It is for a router's adapter (idemgin, idemecho) whose
// handlers return errors instead of writing answers.
func (m *Middleware) Fail(w http.ResponseWriter, r *http.Request, err error) {
	m.fail(w, r, "handler", err)
}

// fail is Fail at stage: what the middleware was doing.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, stage string, err error) {
	if p, ok := errors.AsType[*Problem](err); ok {
		p.ServeHTTP(w, r)
		return
	}
	m.core.Logger().ErrorContext(r.Context(), "idemhttp: request failed", "stage", stage, "method", r.Method, "path", r.URL.Path, "err", err)
	problem(http.StatusInternalServerError, TypeInternal, "Internal error",
		"the request failed on the server and was rolled back; nothing was stored; retry with the same %s", HeaderIdempotencyKey).ServeHTTP(w, r)
}

func problem(status int, typ, title, detail string, args ...any) *Problem {
	return &Problem{Type: typ, Title: title, Status: status, Detail: fmt.Sprintf(detail, args...)}
}

// seconds is d in whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// inSeconds is d in whole seconds, rounded up, as a person reads it: "1
// second", "3 seconds".
func inSeconds(d time.Duration) string {
	if n := seconds(d); n != 1 {
		return strconv.FormatInt(n, 10) + " seconds"
	}
	return "1 second"
}
