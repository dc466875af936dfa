package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// A route's key memory (Config.KeyMemory) is kept by its records: past
// the route's retention a retry is 410 and the handler does not run,
// though the Store keeps no key memory and purged the record meanwhile;
// a route without one forgets the key.
func TestKeyMemoryPerRoute(t *testing.T) {
	db, cleanup := openDB()
	defer cleanup()
	const retention = 100 * time.Millisecond
	mw, err := idemhttp.New(idemhttp.Config{Store: store(), DB: db, Scope: caller, Required: true,
		Retention: func(*http.Request) time.Duration { return retention },
		KeyMemory: func(r *http.Request) time.Duration {
			if r.URL.Path == "/v1/charges" {
				return time.Hour
			}
			return 0
		}})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	post := func(path string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("alice", "secret")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"k`+strings.ReplaceAll(path, "/", "-")+`"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/v1/charges", "/v1/notes"} {
		if code := post(path); code != http.StatusCreated {
			t.Fatalf("POST %s: %d, want 201", path, code)
		}
	}
	time.Sleep(retention + 50*time.Millisecond)
	if _, err := store().Purge(context.Background(), db, 10); err != nil {
		t.Fatal(err)
	}
	if code := post("/v1/charges"); code != http.StatusGone {
		t.Errorf("a retry past the retention of a route with key memory: %d, want 410", code)
	}
	if code := post("/v1/notes"); code != http.StatusCreated {
		t.Errorf("a retry past the retention of a route without key memory: %d, want 201 (the key forgotten)", code)
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("the handler ran %d times, want 3", n)
	}
	var tombstones int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + idem.DefaultTable + " WHERE status = 'expired'").Scan(&tombstones); err != nil || tombstones != 1 {
		t.Errorf("tombstones after the purge: %d, %v; want 1", tombstones, err)
	}
}
