package idempgx_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
)

// A pgxpool service charges a card at most once per idempotency key: Do
// runs inside the pgx.Tx that writes the charge, and a retry of the same
// request replays the stored response instead of charging again.
func ExampleStore_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := idem.New(idem.Postgres, idem.WithTable("example_pgx_keys"))
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
	if _, err := pool.Exec(ctx, `CREATE TABLE example_pgx_charges (id bigserial PRIMARY KEY, customer text, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(ctx, `DROP TABLE example_pgx_charges, example_pgx_keys`)

	charge := func(customer, key string, amount int64) idem.Result {
		req := idem.Request{
			Scope:       customer,
			Key:         key,
			Operation:   "POST /v1/charges",
			Fingerprint: idem.Fingerprint(fmt.Append(nil, amount)),
		}
		var res idem.Result
		// RunTx retries serialization failures and deadlocks; a retried
		// duplicate replays.
		err := idempgx.RunTx(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			var err error
			res, err = keys.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
				var id int64
				err := tx.QueryRow(ctx, `INSERT INTO example_pgx_charges (customer, amount) VALUES ($1, $2) RETURNING id`,
					customer, amount).Scan(&id)
				if err != nil {
					return idem.Response{}, err // nothing is stored; the retry runs again
				}
				return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
			})
			return err
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
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM example_pgx_charges`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}
