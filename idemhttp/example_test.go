package idemhttp_test

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
	"path/filepath"
	"strings"
	"sync"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
)

// store is idem's Store for the examples' SQLite database.
func store() *idem.Store {
	s, err := idem.New(idem.SQLite)
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// openDB opens a SQLite database in a fresh directory, with idem's table
// and an orders table. A real service would open PostgreSQL or MySQL.
func openDB() (db *sql.DB, cleanup func()) {
	dir, err := os.MkdirTemp("", "idemhttp-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	if err := store().Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, ref TEXT)"); err != nil {
		log.Fatal(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// caller is the examples' Config.Scope: who is calling. A real service
// returns the principal its authentication put in the request's context;
// here it is the user of HTTP Basic auth, unchecked.
func caller(r *http.Request) (string, error) {
	user, _, ok := r.BasicAuth()
	if !ok {
		return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: "log in"}
	}
	return "user:" + user, nil
}

// post sends the same order twice with one key, as a client retrying
// after a lost answer would, and prints the answers.
func post(url string) {
	for range 2 {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item": "book"}`))
		if err != nil {
			log.Fatal(err)
		}
		req.SetBasicAuth("alice", "secret")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"order-7"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), strings.TrimSpace(string(body)))
	}
}

// A handler behind the middleware writes its rows through idemhttp.TxFrom;
// the middleware stores its answer with the caller's key in the same
// transaction, and replays it for the caller's retry without running the
// handler again.
func Example() {
	db, cleanup := openDB()
	defer cleanup()
	mw, err := idemhttp.New(idemhttp.Config{Store: store(), DB: db, Scope: caller, Required: true})
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
		res, err := idemhttp.TxFrom(r.Context()).ExecContext(r.Context(), "INSERT INTO orders (item) VALUES (?)", order.Item)
		if err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post(srv.URL + "/v1/orders")
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// orders: 1
}

// In ModeClaim the handler calls a slow provider with no transaction open,
// passing the claim's RelayKey as the provider's own idempotency key, then
// writes its rows through idemhttp.TxFrom, which begins the transaction in which
// the middleware completes the claim.
func ExampleClaimFrom() {
	db, cleanup := openDB()
	defer cleanup()
	mw, err := idemhttp.New(idemhttp.Config{Store: store(), DB: db, Scope: caller, Mode: idemserve.ModeClaim, Required: true})
	if err != nil {
		log.Fatal(err)
	}
	// A payment provider's API, idempotent by its own key.
	var (
		mu      sync.Mutex
		calls   int
		charges = map[string]string{}
	)
	charge := func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		return charges[key]
	}

	mux := http.NewServeMux()
	mux.Handle("POST /v1/orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ref := charge(idemhttp.ClaimFrom(r.Context()).RelayKey())
		tx := idemhttp.TxFrom(r.Context()) // begins the transaction now
		if tx == nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (item, ref) VALUES ('book', ?)", ref); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ref":%q}`, ref)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post(srv.URL + "/v1/orders")
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("provider calls:", calls)
	// Output:
	// 201 replayed="" {"ref":"ch_1"}
	// 201 replayed="true" {"ref":"ch_1"}
	// provider calls: 1
}
