package idement_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/contrib/idement"
	"github.com/idemkit/idem/contrib/idement/internal/ent"
	"github.com/idemkit/idem/contrib/idement/internal/ent/charge"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

// TestMain points the runnable examples at the server the tests run on.
func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// servers are the databases every test runs on: a schema or database of
// the test's own on each server, with ent's name for its dialect.
var servers = []struct {
	name, driver, dialect string
	open                  func(t *testing.T) idemtest.Database
}{
	{"PostgreSQL", "pgx", dialect.Postgres, idemtest.PostgresDatabase},
	{"MariaDB", "mysql", dialect.MySQL, idemtest.MariaDBDatabase},
}

// eachDB runs test on each server, with an ent client opened there as a
// service opens it, its schema created, and idem's table.
func eachDB(t *testing.T, test func(t *testing.T, db *sql.DB, client *ent.Client, entDialect string, store *idem.Store)) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			ctx := t.Context()
			d := srv.open(t)
			db, err := sql.Open(srv.driver, d.DSN)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(2 * idemtest.StormSize)
			client := ent.NewClient(ent.Driver(entsql.OpenDB(srv.dialect, db)))
			if err := client.Schema.Create(ctx); err != nil {
				t.Fatalf("ent's schema: %v", err)
			}
			store, err := idem.New(d.Dialect)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx, db); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			test(t, db, client, srv.dialect, store)
		})
	}
}

// rows counts the committed charges of key.
func rows(client *ent.Client) func(ctx context.Context, key string) (int, error) {
	return func(ctx context.Context, key string) (int, error) {
		return client.Charge.Query().Where(charge.Ref(key)).Count(ctx)
	}
}

// create writes the business row through client (a transaction's) and
// answers for it.
func create(ctx context.Context, client *ent.Client, req idem.Request, then func() error) (idem.Response, error) {
	c, err := client.Charge.Create().SetRef(req.Key).SetAmount(100).Save(ctx)
	if err != nil {
		return idem.Response{}, err
	}
	if err := then(); err != nil {
		return idem.Response{}, err
	}
	return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(int64(c.ID))}, nil
}

// ent's own transaction, client.BeginTx at the isolation level its
// options ask for, run and retried by idement.RunTx, with the *ent.Tx
// handed to Store.Do as it is.
func TestEntTx(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, _ string, store *idem.Store) {
		idemtest.RunStack(t, idemtest.Stack{
			Name:  "ent's *Tx in idement.RunTx",
			Store: store,
			DB:    db,
			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
				var res idem.Result
				err := idement.RunTx(ctx, client.BeginTx, &sql.TxOptions{Isolation: iso}, func(tx *ent.Tx) error {
					var err error
					res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
						return create(ctx, tx.Client(), req, then)
					})
					return err
				})
				return res, err
			},
			Rows: rows(client),
		})
	})
}

// An ent client built on the *sql.Tx of idem.RunTx, which is handed to
// Store.Do as it is: the pattern ent documents for a transaction begun
// outside it.
func TestClientOnSQLTx(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB, client *ent.Client, entDialect string, store *idem.Store) {
		idemtest.RunStack(t, idemtest.Stack{
			Name:  "an ent client on idem.RunTx's *sql.Tx",
			Store: store,
			DB:    db,
			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
				var res idem.Result
				err := idem.RunTx(ctx, db, &sql.TxOptions{Isolation: iso}, func(tx *sql.Tx) error {
					client := ent.NewClient(ent.Driver(entsql.NewDriver(entDialect, entsql.Conn{ExecQuerier: tx})))
					var err error
					res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
						return create(ctx, client, req, then)
					})
					return err
				})
				return res, err
			},
			Rows: rows(client),
		})
	})
}
