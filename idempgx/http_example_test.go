package idempgx_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
)

// A pgxpool service puts idemhttp's middleware in front of its handler
// with idempgx.Middleware; the handler writes its rows through the pgx.Tx
// of idempgx.TxFrom, in which the middleware stores the answer with the
// key, and a retry with the same key replays it.
func ExampleMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_pgxhttp_keys"))
	if err != nil {
		log.Fatal(err)
	}
	keys, err := idempgx.New(store)
	if err != nil {
		log.Fatal(err)
	}
	if err := keys.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE example_pgxhttp_orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP TABLE example_pgxhttp_orders, example_pgxhttp_keys`)

	mw, err := idempgx.Middleware(pool, pgx.TxOptions{}, idemhttp.Config{
		Store: store, Required: true,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil }, // your authentication's caller
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var order struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a 4xx is stored and replayed
			return
		}
		tx := idempgx.TxFrom(r.Context()) // write your rows here; never Commit or Rollback it
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO example_pgxhttp_orders (item) VALUES ($1) RETURNING id`, order.Item).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	srv := httptest.NewServer(mux)
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
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_pgxhttp_orders`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// orders: 1
}
