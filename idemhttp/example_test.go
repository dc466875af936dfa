package idemhttp_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"net/http"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// A handler behind the middleware writes its rows through idemhttp.Tx; the
// middleware stores its answer with the key in the same transaction.
func Example() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store := idem.New(idem.Postgres)
	if err := store.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(idemhttp.Config{
		Store:    store,
		DB:       db,
		Required: true,
		// Keys are per account: the one an authentication middleware
		// in front of this one put in the context.
		Scope: func(r *http.Request) (string, error) {
			account, ok := r.Context().Value(accountKey{}).(string)
			if !ok {
				return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "log in first"}
			}
			return account, nil
		},
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
		var id int64
		err := idemhttp.Tx(r.Context()).QueryRowContext(r.Context(),
			"INSERT INTO orders (item) VALUES ($1) RETURNING id", order.Item).Scan(&id)
		if err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

type accountKey struct{}
