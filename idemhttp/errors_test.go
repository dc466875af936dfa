package idemhttp

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/idemkit/idem"
)

// Every error of a transaction maps to its status, problem type and
// Retry-After (Config.RetryAfter, 2 s here, or the lease left when that is
// less); only unexpected ones are logged.
func TestAnswerError(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		typ        string
		retryAfter string
		logged     bool
	}{
		{fmt.Errorf("wrapped: %w", idem.ErrMismatch), 422, TypeMismatch, "", false},
		{fmt.Errorf("wrapped: %w", idem.ErrExpired), 410, TypeExpired, "", false},
		{&idem.InFlightError{RetryAfter: 3 * time.Second}, 409, TypeInFlight, "2", false},
		{&idem.InFlightError{RetryAfter: time.Second}, 409, TypeInFlight, "1", false},
		{fmt.Errorf("%w: key taken over", idem.ErrLeaseLost), 409, TypeInFlight, "2", false},
		{fmt.Errorf("idem: giving up after 10 attempts: %w", &pq.Error{Code: "40001"}), 503, TypeContention, "2", false},
		{fmt.Errorf("%w: empty", idem.ErrInvalidKey), 400, TypeInvalidKey, "", false},
		{fmt.Errorf("%w: Scope holds a NUL byte", idem.ErrInvalidRequest), 500, TypeInternal, "", true},
		{errors.New("connection refused"), 500, TypeInternal, "", true},
		{&Problem{Type: "about:blank", Title: "Unauthorized", Status: 401, Detail: "log in"}, 401, "about:blank", "", false},
	}
	for _, c := range cases {
		var logs bytes.Buffer
		m := testMiddleware(t, slog.New(slog.NewTextHandler(&logs, nil)), 1500*time.Millisecond)
		w := httptest.NewRecorder()
		m.answerError(w, httptest.NewRequest("POST", "/v1/charges", nil), c.err)
		var p Problem
		if jerr := json.Unmarshal(w.Body.Bytes(), &p); jerr != nil {
			t.Fatalf("%v: body %q: %v", c.err, w.Body, jerr)
		}
		if w.Code != c.status || p.Status != c.status || p.Type != c.typ || w.Header().Get("Retry-After") != c.retryAfter {
			t.Errorf("%v: %d %+v Retry-After %q; want %d %s %q", c.err, w.Code, p, w.Header().Get("Retry-After"), c.status, c.typ, c.retryAfter)
		}
		if w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%v: Content-Type %q", c.err, w.Header().Get("Content-Type"))
		}
		if logged := strings.Contains(logs.String(), "request failed"); logged != c.logged {
			t.Errorf("%v: logged=%v, want %v (%s)", c.err, logged, c.logged, logs.String())
		}
		if c.logged && strings.Contains(p.Detail, c.err.Error()) {
			t.Errorf("%v: the detail shows the internal error: %q", c.err, p.Detail)
		}
	}
}

// testMiddleware is a middleware that logs to l and tells clients to
// retry after retryAfter, on a pool it never uses.
func testMiddleware(t *testing.T, l *slog.Logger, retryAfter time.Duration) *Middleware {
	t.Helper()
	store, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Store: store, DB: &sql.DB{}, Scope: SingleTenant, Logger: l, RetryAfter: retryAfter})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Fail, for a router's adapter, answers a handler's failure as the
// middleware answers its own: a Problem as itself, any other error as a
// 500 whose detail hides it, logged to Config.Logger.
func TestFail(t *testing.T) {
	var logs bytes.Buffer
	m := testMiddleware(t, slog.New(slog.NewTextHandler(&logs, nil)), time.Second)
	w := httptest.NewRecorder()
	m.Fail(w, httptest.NewRequest("POST", "/v1/charges", nil), errors.New("the ledger is down"))
	if w.Code != 500 || !strings.Contains(w.Body.String(), TypeInternal) || strings.Contains(w.Body.String(), "ledger") {
		t.Errorf("Fail answered %d %s", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "the ledger is down") || !strings.Contains(logs.String(), "stage=handler") {
		t.Errorf("Fail logged %q", logs.String())
	}
	w = httptest.NewRecorder()
	m.Fail(w, httptest.NewRequest("POST", "/v1/charges", nil), &Problem{Type: "about:blank", Title: "Unauthorized", Status: 401})
	if w.Code != 401 {
		t.Errorf("Fail of a Problem answered %d", w.Code)
	}
}

// A body of exactly MaxBody bytes is read whole, with or without a
// Content-Length; one byte more is a 413.
func TestReadBodyLimit(t *testing.T) {
	store, err := idem.New(idem.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Store: store, DB: &sql.DB{}, Scope: SingleTenant, MaxBody: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 64, 65, 1000} {
		for _, chunked := range []bool{false, true} {
			body := strings.Repeat("x", n)
			r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
			if chunked {
				r.ContentLength = -1
			}
			got, p := m.readBody(r)
			switch {
			case n <= 64 && (p != nil || string(got) != body):
				t.Errorf("%d bytes (chunked %v): read %d bytes, problem %v; want all of them", n, chunked, len(got), p)
			case n > 64 && (p == nil || p.Status != 413 || p.Type != TypeBodyTooLarge):
				t.Errorf("%d bytes (chunked %v): problem %v, want a 413", n, chunked, p)
			}
		}
	}
}

// The requests the middleware refuses before the Store sees them are
// counted with the Store's Observer, as invalid, beside Do's outcomes.
func TestRefusalsReported(t *testing.T) {
	var events []idem.Event
	store, err := idem.New(idem.Postgres, idem.WithObserver(idem.ObserverFunc(func(_ context.Context, ev idem.Event) {
		events = append(events, ev)
	})))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Store: store, DB: &sql.DB{}, Scope: SingleTenant, MaxBody: 8, Required: true})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
	for _, c := range []struct {
		key, body string
		status    int
		typ       string
	}{
		{"", "{}", 400, TypeMissingKey},
		{`"k"`, "a body of more than 8 bytes", 413, TypeBodyTooLarge},
		{"\"k\x01\"", "{}", 400, TypeInvalidKey},
	} {
		events = nil
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(c.body))
		if c.key != "" {
			r.Header.Set(HeaderIdempotencyKey, c.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != c.status || p.Type != c.typ {
			t.Errorf("key %q: %d %s, want %d %s", c.key, w.Code, w.Body, c.status, c.typ)
		}
		if len(events) != 1 || events[0].Kind != idem.EventInvalid || events[0].Table != store.Table() {
			t.Errorf("key %q: events %+v, want one invalid on the Store's table", c.key, events)
			continue
		}
		if p, ok := errors.AsType[*Problem](events[0].Err); !ok || p.Type != c.typ {
			t.Errorf("key %q: the event's Err is %v, want the problem answered", c.key, events[0].Err)
		}
	}
}

// The in-flight detail counts its seconds as a person does.
func TestInFlightDetailCountsSeconds(t *testing.T) {
	for wait, want := range map[time.Duration]string{time.Second: "retry after 1 second to", 3 * time.Second: "retry after 3 seconds to"} {
		m := testMiddleware(t, slog.Default(), 10*time.Second)
		w := httptest.NewRecorder()
		m.answerError(w, httptest.NewRequest("POST", "/v1/charges", nil), &idem.InFlightError{RetryAfter: wait})
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("%v: %s does not say %q", wait, w.Body, want)
		}
	}
}
