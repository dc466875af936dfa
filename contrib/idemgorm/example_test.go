package idemgorm_test

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

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idemgorm"
	"github.com/idemkit/idem/idemhttp"
)

// Charge is the example service's model.
type Charge struct {
	ID       uint
	Customer string
	Amount   int64
}

func (Charge) TableName() string { return "example_gorm_charges" }

// setup opens GORM and idem's Store on the same PostgreSQL database, as a
// service does at start.
func setup(table string) (*gorm.DB, *idem.Store, func()) {
	dsn := os.Getenv("IDEM_TEST_POSTGRES_DSN") // e.g. postgres://localhost/shop
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{PrepareStmt: true, Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Charge{}); err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres, idem.WithTable(table))
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(context.Background(), sqlDB); err != nil {
		log.Fatal(err)
	}
	return db, store, func() {
		db.Exec("DROP TABLE example_gorm_charges, " + table)
		sqlDB.Close()
	}
}

// A GORM service charges a card at most once per idempotency key: Do runs
// inside db.Transaction, on tx.Statement.ConnPool, and idem.Retry runs the
// transaction again when the database aborts a duplicate, which then
// replays the stored response instead of charging again.
func Example() {
	db, store, cleanup := setup("example_gorm_keys")
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
			return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				var err error
				res, err = store.Do(ctx, tx.Statement.ConnPool, req, func(ctx context.Context) (idem.Response, error) {
					c := Charge{Customer: customer, Amount: amount}
					if err := tx.Create(&c).Error; err != nil {
						return idem.Response{}, err // nothing is stored; the retry runs again
					}
					return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, c.ID)}, nil
				})
				return err
			}, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
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
	var n int64
	db.Model(&Charge{}).Count(&n)
	fmt.Println("charges:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}

// A GORM handler behind idemhttp's middleware writes through the request's
// transaction, which the middleware began and commits with idem's record:
// WithTx binds the service's *gorm.DB to it.
func ExampleWithTx() {
	db, store, cleanup := setup("example_gorm_http_keys")
	defer cleanup()
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(idemhttp.Config{Store: store, DB: sqlDB, Scope: idemhttp.SingleTenant, Required: true})
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
		tx := idemgorm.WithTx(r.Context(), db, idemhttp.TxFrom(r.Context()))
		if err := tx.Create(&c).Error; err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // a 5xx rolls back; a retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, c.ID)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, amount := range []string{"1999", "1999", "5"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"Customer": "customer-42", "Amount": `+amount+`}`))
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
		if resp.StatusCode != http.StatusCreated {
			body = []byte(resp.Header.Get("Content-Type")) // the other payload: a problem+json 422
		}
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderIdempotentReplayed), body)
	}
	var n int64
	db.Model(&Charge{}).Count(&n)
	fmt.Println("charges:", n)
	// Output:
	// 201 replayed="" {"id":1}
	// 201 replayed="true" {"id":1}
	// 422 replayed="" application/problem+json
	// charges: 1
}
