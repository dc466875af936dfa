package idemchi_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// payments is the payments service on chi: the charge handler, a plain
// http.HandlerFunc, behind mw.Handler with r.With.
func payments(app *idemtest.PaymentsApp) http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.With(app.Middleware.Handler).Post("/v1/charges", func(w http.ResponseWriter, r *http.Request) {
		var in idemtest.ChargeInput
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		ref, err := app.Provider(ctx) // the slow call, before the transaction
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		charge, err := app.Record(ctx, idemhttp.TxFrom(ctx), in.Amount, ref)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/charges/"+charge.ID)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(charge)
	})
	return r
}

func TestPayments(t *testing.T) { idemtest.RunHTTP(t, payments) }

// When the database aborts a request's commit, idemhttp runs the handler
// again, and both charges get their 201.
func TestRerun(t *testing.T) {
	if got := idemtest.RunHTTPRetry(t, payments); !slices.Equal(got, []int{201, 201}) {
		t.Fatalf("answers %v, want [201 201]", got)
	}
}

// Behind the middleware in a chi Group, the handler reads its URL
// parameters; the key is bound to the concrete path, so the same key on
// another account's path is a 422, not that account's replay.
func TestURLParams(t *testing.T) {
	db, err := sql.Open("pgx", testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("idemchi_"+strings.ToLower(rand.Text()[:10])))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	defer db.ExecContext(ctx, "DROP TABLE "+store.Table())
	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db, Scope: idemhttp.SingleTenant})
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(mw.Handler)
		r.Post("/v1/accounts/{account}/charges", func(w http.ResponseWriter, r *http.Request) {
			if idemhttp.TxFrom(r.Context()) == nil {
				http.Error(w, "no transaction", http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, chi.URLParam(r, "account"))
		})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	post := func(account string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/accounts/"+account+"/charges", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderIdempotencyKey, "params-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if status, body := post("acct-1"); status != 201 || body != "acct-1" {
		t.Fatalf("acct-1: %d %q, want 201 with the URL parameter", status, body)
	}
	if status, body := post("acct-1"); status != 201 || body != "acct-1" {
		t.Fatalf("acct-1 again: %d %q, want its replay", status, body)
	}
	if status, body := post("acct-2"); status != http.StatusUnprocessableEntity || !strings.Contains(body, idemhttp.TypeMismatch) {
		t.Fatalf("acct-2 with acct-1's key: %d %q, want a 422", status, body)
	}
}
