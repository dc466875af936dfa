package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem"
)

// invoice is what a billing job produces: any type that encoding/json
// round-trips.
type invoice struct {
	ID     int64  `json:"id"`
	Amount int64  `json:"amount"`
	Period string `json:"period"`
}

// A job runner runs each job once per key, whatever the scheduler's
// retries: Call runs the job inside the transaction that writes its rows,
// stores its typed result with the key, and a second run of the same job
// returns the stored invoice without billing again.
func ExampleCall() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithTable("job_keys"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer TEXT, amount INTEGER, period TEXT)`); err != nil {
		log.Fatal(err)
	}

	bill := func(customer, period string) (invoice, bool) {
		req := idem.Request{
			Scope:       "billing",
			Key:         customer + "/" + period, // one invoice per customer and period
			Operation:   "job: monthly invoice",
			Fingerprint: idem.Fingerprint([]byte(customer), []byte(period)),
		}
		var (
			inv      invoice
			replayed bool
		)
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			var err error
			inv, replayed, err = idem.Call(ctx, store, tx, req, func(ctx context.Context) (invoice, error) {
				r, err := tx.ExecContext(ctx, `INSERT INTO invoices (customer, amount, period) VALUES (?, ?, ?)`, customer, 4200, period)
				if err != nil {
					return invoice{}, err // nothing is stored; the next run bills
				}
				id, err := r.LastInsertId()
				return invoice{ID: id, Amount: 4200, Period: period}, err
			})
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		return inv, replayed
	}
	for range 2 { // the scheduler ran the job twice
		inv, replayed := bill("customer-42", "2026-11")
		fmt.Printf("%+v replayed: %v\n", inv, replayed)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", n)
	// Output:
	// {ID:1 Amount:4200 Period:2026-11} replayed: false
	// {ID:1 Amount:4200 Period:2026-11} replayed: true
	// invoices: 1
}

// A job records what it created (WithReference): past its retention,
// within the key memory, the scheduler's late rerun is refused, and the
// refusal names the invoice to look at instead of billing again.
func ExampleWithReference() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "jobs.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(idem.SQLite, idem.WithRetention(10*time.Millisecond), idem.WithKeyMemory(90*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	req := idem.Request{Scope: "billing", Key: "customer-42/2026-11", Operation: "job: monthly invoice",
		Fingerprint: idem.Fingerprint([]byte("customer-42"), []byte("2026-11"))}
	bill := func() error {
		return idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, _, err := idem.Call(ctx, store, tx, req, func(context.Context) (invoice, error) {
				return invoice{ID: 7, Amount: 4200, Period: "2026-11"}, nil
			}, idem.WithReference(func(inv invoice) string { return fmt.Sprintf("invoices/%d", inv.ID) }))
			return err
		})
	}
	if err := bill(); err != nil {
		log.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	var expired *idem.ExpiredError
	if err := bill(); errors.As(err, &expired) {
		fmt.Println("not billed again; see", expired.Reference)
	}
	// Output:
	// not billed again; see invoices/7
}
