// Package idemhttp_test runs idemhttp's payments checks (idemtest.RunHTTP)
// under net/http's ServeMux, on the servers package testdb finds.
package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/containers"
)

// TestMain stops any database container the tests started.
func TestMain(m *testing.M) { containers.Main(m) }

// The payments checks under net/http's ServeMux, which needs no adapter:
// mw.Handler wraps the route's handler, which takes its transaction from
// idemhttp.TxFrom(r.Context()).
func TestServeMux(t *testing.T) { idemtest.RunHTTP(t, muxPayments) }

// muxPayments is the payments service on a ServeMux.
func muxPayments(app *idemtest.PaymentsApp) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", app.Middleware.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	})))
	return mux
}

// Behind the standard mux, a request whose transaction the database
// aborts runs its handler again, and both charges get their 201.
func TestServeMuxRerunsHandler(t *testing.T) {
	if got := idemtest.RunHTTPRetry(t, muxPayments); !slices.Equal(got, []int{201, 201}) {
		t.Fatalf("answers %v, want [201 201]", got)
	}
}
