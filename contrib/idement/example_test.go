package idement_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idement"
	"github.com/idemkit/idem/contrib/idement/internal/ent" // your generated package
)

// setup opens ent and idem's Store on the same PostgreSQL database, as a
// service does at start.
func setup(table string) (*sql.DB, *ent.Client, *idem.Store, func()) {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("IDEM_TEST_POSTGRES_DSN")) // e.g. postgres://localhost/shop
	if err != nil {
		log.Fatal(err)
	}
	client := ent.NewClient(ent.Driver(entsql.OpenDB(dialect.Postgres, db)))
	if err := client.Schema.Create(ctx); err != nil {
		log.Fatal(err)
	}
	store, err := idem.New(idem.Postgres, idem.WithTable(table))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	return db, client, store, func() {
		db.ExecContext(ctx, "DROP TABLE idement_charges, "+table)
		db.Close()
	}
}

// request is a charge of amount to customer under the client's key.
func request(customer, key string, amount int64) idem.Request {
	return idem.Request{
		Scope:       customer,
		Key:         key,
		Operation:   "POST /v1/charges",
		Fingerprint: idem.Fingerprint(fmt.Append(nil, amount)),
	}
}

// An ent service charges a card at most once per idempotency key: Do runs
// inside ent's transaction, the *ent.Tx itself handed to it, which RunTx
// begins, commits and runs again when the database aborts a duplicate;
// the duplicate then replays the stored response instead of charging
// again.
func Example() {
	_, client, store, cleanup := setup("example_ent_keys")
	defer cleanup()
	ctx := context.Background()

	charge := func(customer, key string, amount int64) idem.Result {
		var res idem.Result
		err := idement.RunTx(ctx, client.BeginTx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, func(tx *ent.Tx) error {
			var err error
			res, err = store.Do(ctx, tx, request(customer, key, amount), func(ctx context.Context) (idem.Response, error) {
				c, err := tx.Charge.Create().SetRef(customer).SetAmount(amount).Save(ctx)
				if err != nil {
					return idem.Response{}, err // nothing is stored; the retry runs again
				}
				return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, c.ID)}, nil
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
	fmt.Println("charges:", client.Charge.Query().CountX(ctx))
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}

// Without this package: an ent client built on the *sql.Tx that idem.RunTx
// begins and retries, and that same *sql.Tx handed to Store.Do.
func Example_sqlTx() {
	db, client, store, cleanup := setup("example_ent_sql_keys")
	defer cleanup()
	ctx := context.Background()

	charge := func(customer, key string, amount int64) idem.Result {
		var res idem.Result
		err := idem.RunTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, func(tx *sql.Tx) error {
			client := ent.NewClient(ent.Driver(entsql.NewDriver(dialect.Postgres, entsql.Conn{ExecQuerier: tx})))
			var err error
			res, err = store.Do(ctx, tx, request(customer, key, amount), func(ctx context.Context) (idem.Response, error) {
				c, err := client.Charge.Create().SetRef(customer).SetAmount(amount).Save(ctx)
				if err != nil {
					return idem.Response{}, err
				}
				return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, `{"id":%d}`, c.ID)}, nil
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
	fmt.Println("charges:", client.Charge.Query().CountX(ctx))
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// charges: 1
}
