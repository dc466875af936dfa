package idemchi_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// A chi route behind idemhttp, with no adapter: r.With(mw.Handler). The
// handler writes the order through idemhttp.TxFrom(r.Context()); a retry
// with the same key replays its answer.
func Example() {
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_chi_keys"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE example_chi_orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer db.Exec(`DROP TABLE example_chi_orders, example_chi_keys`)

	mw, err := idemhttp.New(idemhttp.Config{
		Store: store, DB: db, Required: true,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your authentication's caller
	})
	if err != nil {
		log.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.With(mw.Handler).Post("/v1/orders", func(w http.ResponseWriter, r *http.Request) {
		var order struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a 4xx is stored and replayed
			return
		}
		ctx := r.Context()
		var id int64
		if err := idemhttp.TxFrom(ctx).QueryRowContext(ctx, `INSERT INTO example_chi_orders (item) VALUES ($1) RETURNING id`, order.Item).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders", strings.NewReader(`{"item": "book"}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("X-Account", "acct-7")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"order-7"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), body)
	}
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
}
