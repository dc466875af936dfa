package idemhttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest/testdb"
)

// A handler behind the middleware that writes through sqlx (docs/orm.md,
// sqlx behind the middleware): it wraps the request's *sql.Tx in a
// *sqlx.Tx with the *sqlx.DB's mapper and rebinds its queries with the
// *sqlx.DB, whose driver it knows (the wrapper's Rebind does not). Its
// named insert and its struct scan run in the middleware's transaction:
// eight concurrent requests with one key write one row, and every one
// gets its answer.
func TestSqlxBehindTheMiddleware(t *testing.T) {
	for _, s := range []struct {
		server  *testdb.Server
		dialect idem.Dialect
	}{{testdb.Postgres, idem.Postgres}, {testdb.MariaDB, idem.MariaDB}} {
		t.Run(s.server.Name, func(t *testing.T) {
			ctx := context.Background()
			sqldb, err := sql.Open(s.server.Driver, s.server.DSN(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sqldb.Close() })
			db := sqlx.NewDb(sqldb, s.server.Driver)
			table := fmt.Sprintf("idem_sqlx_%d", time.Now().UnixNano())
			store, err := idem.New(s.dialect, idem.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx, sqldb); err != nil {
				t.Fatal(err)
			}
			orders := table + "_orders"
			if _, err := db.Exec("CREATE TABLE " + orders + " (k VARCHAR(255) NOT NULL, amount BIGINT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sqldb.Exec("DROP TABLE " + orders); sqldb.Exec("DROP TABLE " + table) })

			mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: sqldb, Scope: idemhttp.SingleTenant})
			if err != nil {
				t.Fatal(err)
			}
			type order struct {
				Key    string `db:"k"`
				Amount int64  `db:"amount"`
			}
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx := &sqlx.Tx{Tx: idemhttp.TxFrom(r.Context()), Mapper: db.Mapper}
				in := order{Key: r.Header.Get("Idempotency-Key"), Amount: 4200}
				q, args, err := db.BindNamed("INSERT INTO "+orders+" (k, amount) VALUES (:k, :amount)", in)
				if err == nil {
					_, err = tx.ExecContext(r.Context(), q, args...)
				}
				var got order
				if err == nil {
					err = tx.GetContext(r.Context(), &got, db.Rebind("SELECT k, amount FROM "+orders+" WHERE k = ?"), in.Key)
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "%s %d", got.Key, got.Amount)
			}))

			var wg sync.WaitGroup
			answers := make([]*httptest.ResponseRecorder, 8)
			for i := range answers {
				wg.Go(func() {
					req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{}`))
					req.Header.Set("Idempotency-Key", "order-1")
					answers[i] = httptest.NewRecorder()
					h.ServeHTTP(answers[i], req)
				})
			}
			wg.Wait()
			for i, a := range answers {
				if a.Code != http.StatusCreated || a.Body.String() != "order-1 4200" {
					t.Errorf("request %d: %d %q, want 201 \"order-1 4200\"", i, a.Code, a.Body.String())
				}
			}
			var n int
			if err := db.Get(&n, db.Rebind("SELECT COUNT(*) FROM "+orders+" WHERE k = ?"), "order-1"); err != nil || n != 1 {
				t.Fatalf("%d order rows, %v; want 1", n, err)
			}
		})
	}
}
