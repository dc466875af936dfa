package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// A late retry within the key memory is a 410 that names what the first
// request created: its Location by default, or the member of its JSON
// body that Config.ReferenceField names, kept by the record after the
// purge dropped the response; sealed when the Store seals. A reference
// the serving Store cannot open is a 410 without it, logged.
func TestExpiredReference(t *testing.T) {
	sealer, err := idem.NewAESGCMSealer("k1", map[string][]byte{"k1": bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	for _, sealed := range []bool{false, true} {
		t.Run(map[bool]string{false: "clear", true: "sealed"}[sealed], func(t *testing.T) {
			db, cleanup := openDB()
			defer cleanup()
			var opts []idem.Option
			if sealed {
				opts = append(opts, idem.WithSealer(sealer))
			}
			st, err := idem.New(idem.SQLite, append(opts, idem.WithRetention(100*time.Millisecond), idem.WithKeyMemory(time.Hour))...)
			if err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			var runs atomic.Int64
			serve := func(st *idem.Store) *httptest.Server {
				mw, err := idemhttp.New(idemhttp.Config{Store: st, DB: db, Scope: caller, Required: true,
					Logger: slog.New(slog.NewTextHandler(&logged, nil)),
					ReferenceField: func(r *http.Request) string {
						if r.URL.Path == "/v1/orders" {
							return "/order/id"
						}
						return ""
					}})
				if err != nil {
					t.Fatal(err)
				}
				return httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					if r.URL.Path == "/v1/charges" {
						w.Header().Set("Location", "/v1/charges/ch_1")
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = w.Write([]byte(`{"order": {"id": 42}}`))
				})))
			}
			srv := serve(st)
			defer srv.Close()
			post := func(srv *httptest.Server, path string) (int, string, map[string]any) {
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
				defer resp.Body.Close()
				var problem map[string]any
				if resp.StatusCode == http.StatusGone {
					if err := json.NewDecoder(resp.Body).Decode(&problem); err != nil {
						t.Fatal(err)
					}
				}
				return resp.StatusCode, resp.Header.Get("Location"), problem
			}
			for _, path := range []string{"/v1/charges", "/v1/orders", "/v1/notes"} {
				if code, _, _ := post(srv, path); code != http.StatusCreated {
					t.Fatalf("POST %s: %d, want 201", path, code)
				}
			}
			time.Sleep(150 * time.Millisecond)
			if _, err := store().Purge(context.Background(), db, 10); err != nil { // a Store without key memory
				t.Fatal(err)
			}
			for path, want := range map[string]string{"/v1/charges": "/v1/charges/ch_1", "/v1/orders": "42", "/v1/notes": ""} {
				code, location, problem := post(srv, path)
				if code != http.StatusGone || location != want || problem["type"] != idemhttp.TypeExpired {
					t.Errorf("POST %s past retention: %d, Location %q, problem %v; want 410 of type key-expired, Location %q", path, code, location, problem, want)
				}
				if got, _ := problem["reference"].(string); got != want {
					t.Errorf("POST %s: the problem's reference is %q, want %q", path, got, want)
				}
			}
			if n := runs.Load(); n != 3 {
				t.Errorf("the handler ran %d times, want 3", n)
			}
			if !sealed {
				return
			}
			var stored []byte
			if err := db.QueryRow("SELECT result_ref FROM " + idem.DefaultTable + " WHERE idem_key = 'k-v1-charges'").Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(stored, []byte("ch_1")) {
				t.Errorf("the sealed reference is stored in the clear: %q", stored)
			}
			noSealer, err := idem.New(idem.SQLite, idem.WithRetention(100*time.Millisecond), idem.WithKeyMemory(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			other := serve(noSealer)
			defer other.Close()
			if code, location, problem := post(other, "/v1/charges"); code != http.StatusGone || location != "" || problem["reference"] != nil {
				t.Errorf("a reference the Store cannot open: %d, Location %q, problem %v; want 410 without it", code, location, problem)
			}
			if !strings.Contains(logged.String(), "cannot be opened") {
				t.Errorf("the unopenable reference was not logged: %q", logged.String())
			}
		})
	}
}

// A reference the record cannot keep is a 500 and nothing is stored,
// never a truncated or silently dropped one: a Location over
// idem.MaxReference bytes, a body that is not JSON where ReferenceField
// names a member, a member that is an object. A named member that is
// absent keeps none and the answer stands.
func TestReferenceRefused(t *testing.T) {
	db, cleanup := openDB()
	defer cleanup()
	mw, err := idemhttp.New(idemhttp.Config{Store: store(), DB: db, Scope: caller, Required: true,
		Logger: slog.New(slog.DiscardHandler),
		ReferenceField: func(r *http.Request) string {
			if r.URL.Path == "/long" {
				return ""
			}
			return "/id"
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/long":
			w.Header().Set("Location", "/"+strings.Repeat("a", idem.MaxReference))
			w.WriteHeader(http.StatusCreated)
		case "/text":
			_, _ = w.Write([]byte("created"))
		case "/object":
			_, _ = w.Write([]byte(`{"id": {"n": 1}}`))
		case "/absent":
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = w.Write([]byte(`{"error": "declined"}`))
		}
	})))
	defer srv.Close()
	for path, want := range map[string]int{"/long": 500, "/text": 500, "/object": 500, "/absent": 402} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("alice", "secret")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"ref`+strings.ReplaceAll(path, "/", "-")+`"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("POST %s: %d, want %d", path, resp.StatusCode, want)
		}
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM "+idem.DefaultTable+" WHERE idem_key = ?", "ref"+strings.ReplaceAll(path, "/", "-")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if stored := want != 500; (n == 1) != stored {
			t.Errorf("POST %s: %d records, want stored: %v", path, n, stored)
		}
	}
}
