package idemhttp_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/idemhttp"
)

// logRecords is a slog.Handler that keeps the messages it gets.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, b.String())
	return nil
}

// A record sealed with a key this process lacks cannot be replayed: the
// answer is 501 of type TypeUnsealable, whose detail says a retry will
// not succeed until the key is deployed, and which idemclient does not
// retry; the handler does not run again; the server logs it once per key
// ID, with the fix.
func TestUnopenableRecord(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "unopenable.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store := func(current string, keys ...string) *idem.Store {
		m := map[string][]byte{}
		for _, id := range keys {
			m[id] = bytes.Repeat([]byte(id[1:]), 32)
		}
		sealer, err := idem.NewAESGCMSealer(current, m)
		if err != nil {
			t.Fatal(err)
		}
		s, err := idem.New(idem.SQLite, idem.WithSealer(sealer))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var runs atomic.Int64
	logs := &logRecords{}
	server := func(s *idem.Store) *httptest.Server {
		mw, err := idemhttp.New(idemhttp.Config{Store: s, DB: db, Scope: idemhttp.SingleTenant, Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		return httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(201)
		})))
	}
	old := store("k1", "k1")
	if err := old.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	counting := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		attempts.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})
	client := &http.Client{Transport: &idemclient.Transport{Base: counting, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
	post := func(url, key string) *http.Response {
		req, err := http.NewRequest("POST", url+"/v1/charges", strings.NewReader(`{"amount":100}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	before := server(old)
	for _, key := range []string{`"a"`, `"b"`} {
		if resp := post(before.URL, key); resp.StatusCode != 201 {
			t.Fatalf("first request %s: %d", key, resp.StatusCode)
		}
	}
	before.Close()

	after := server(store("k2", "k2")) // k1 was dropped too early
	defer after.Close()
	runs.Store(0)
	for _, key := range []string{`"a"`, `"b"`, `"a"`} {
		attempts.Store(0)
		resp := post(after.URL, key)
		var p idemhttp.Problem
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotImplemented || p.Type != idemhttp.TypeUnsealable || !strings.Contains(p.Detail, "will not succeed") ||
			strings.Contains(p.Detail, "retry with the same") || resp.Header.Get("Retry-After") != "" {
			t.Errorf("replay of %s sealed with a missing key: %d %+v; want 501 %s saying a retry will not succeed", key, resp.StatusCode, p, idemhttp.TypeUnsealable)
		}
		if n := attempts.Load(); n != 1 {
			t.Errorf("replay of %s: idemclient sent %d attempts, want 1", key, n)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times for keys already used", n)
	}
	var about []string
	for _, m := range logs.msgs {
		if strings.Contains(m, `"k1"`) || strings.Contains(m, "=k1") {
			about = append(about, m)
		}
	}
	if len(about) != 1 || !strings.Contains(about[0], "WithSealer") {
		t.Errorf("logged about key k1: %q; want one line, with the fix (every message: %q)", about, logs.msgs)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
