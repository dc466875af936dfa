package idembun_test

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

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// Charge is the example service's model.
type Charge struct {
	bun.BaseModel `bun:"table:example_bun_charges"`

	ID       int64 `bun:",pk,autoincrement"`
	Customer string
	Amount   int64
}

// setup opens bun and idem's Store on the same PostgreSQL database, as a
// service does at start.
func setup(table string) (*bun.DB, *idem.Store, func()) {
	ctx := context.Background()
	dsn := os.Getenv("IDEM_TEST_POSTGRES_DSN") // e.g. postgres://localhost/shop
	db := bun.NewDB(sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(dsn))), pgdialect.New())
	if _, err := db.NewCreateTable().Model((*Charge)(nil)).Exec(ctx); err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres, idem.WithTable(table))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db.DB); err != nil {
		log.Fatal(err)
	}
	return db, store, func() {
		db.ExecContext(ctx, "DROP TABLE example_bun_charges, "+table)
		db.Close()
	}
}

// A bun service charges a card at most once per idempotency key: Do runs
// inside db.RunInTx, on its bun.Tx, and idem.Retry runs the transaction
// again when the database aborts a duplicate, which then replays the
// stored response instead of charging again.
func Example() {
	db, store, cleanup := setup("example_bun_keys")
	defer cleanup()
	ctx := context.Background()

	charge := func(customer, key string, amount int64) idem.Result {
		req := idem.Request{
			Scope:       customer,
			Key:         key,
			Operation:   "POST /v1/charges",
			Fingerprint: idem.Fingerprint(fmt.Append(nil, amount)),
		}
		var res idem.Result
		err := idem.Retry(ctx, func() error {
			return db.RunInTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, func(ctx context.Context, tx bun.Tx) error {
				var err error
				res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
					c := Charge{Customer: customer, Amount: amount}
					if _, err := tx.NewInsert().Model(&c).Exec(ctx); err != nil {
						return idem.Response{}, err // nothing is stored; the retry runs again
					}
					return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, c.ID)}, nil
				})
				return err
			})
		})
		if err != nil {
			log.Fatal(err)
		}
		return res
	}

	for range 2 {
		res := charge("customer-42", "9d1c0f6e-charge", 1999)
		fmt.Println(res.StatusCode, string(res.Body), "replayed:", res.Replayed)
	}
	n, err := db.NewSelect().Model((*Charge)(nil)).Count(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}

// A bun handler behind idemhttp's middleware runs its queries on the
// request's transaction, which the middleware began and commits with
// idem's record, through Conn.
func Example_idemhttp() {
	db, store, cleanup := setup("example_bun_http_keys")
	defer cleanup()
	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: db.DB, Scope: idemhttp.SingleTenant, Required: true})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c Charge
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a 4xx is stored and replayed
			return
		}
		if _, err := db.NewInsert().Conn(idemhttp.TxFrom(r.Context())).Model(&c).Exec(r.Context()); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, c.ID)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"customer": "customer-42", "amount": 1999}`))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderIdempotencyKey, `"9d1c0f6e-charge"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), body)
	}
	n, err := db.NewSelect().Model((*Charge)(nil)).Count(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// charges: 1
}
