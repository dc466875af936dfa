package idembun_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

// TestMain points the runnable examples at the server the tests run on.
func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// charge is the tests' business row: one per charge, by the request's
// key.
type charge struct {
	bun.BaseModel `bun:"table:charges"`

	ID     int64 `bun:",pk,autoincrement"`
	Ref    string
	Amount int64
}

// stacks are the ways a bun service reaches its server: bun's pgdialect
// on its own pgdriver and on pgx's database/sql driver, and its
// mysqldialect on go-sql-driver/mysql.
var stacks = []struct {
	name string
	open func(t *testing.T) (*bun.DB, idemtest.Database)
}{
	{"pgdialect on pgdriver", func(t *testing.T) (*bun.DB, idemtest.Database) {
		d := idemtest.PostgresDatabase(t)
		return bun.NewDB(sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(d.DSN))), pgdialect.New()), d
	}},
	{"pgdialect on pgx", func(t *testing.T) (*bun.DB, idemtest.Database) {
		d := idemtest.PostgresDatabase(t)
		return bun.NewDB(openSQL(t, "pgx", d.DSN), pgdialect.New()), d
	}},
	{"mysqldialect on MariaDB", func(t *testing.T) (*bun.DB, idemtest.Database) {
		d := idemtest.MariaDBDatabase(t)
		return bun.NewDB(openSQL(t, "mysql", d.DSN), mysqldialect.New()), d
	}},
}

func openSQL(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// eachStack runs test on each of stacks, with the charges table and
// idem's made.
func eachStack(t *testing.T, test func(t *testing.T, db *bun.DB, store *idem.Store)) {
	for _, s := range stacks {
		t.Run(s.name, func(t *testing.T) {
			db, d := s.open(t)
			t.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(2 * idemtest.StormSize)
			ctx := t.Context()
			if _, err := db.NewCreateTable().Model((*charge)(nil)).Exec(ctx); err != nil {
				t.Fatalf("create table: %v", err)
			}
			store, err := idem.New(d.Dialect)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx, db.DB); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			test(t, db, store)
		})
	}
}

// A bun service's own transaction: db.RunInTx at the isolation level its
// options ask for, retried by idem.Retry, with its bun.Tx handed to Do
// as it is.
func TestRunInTx(t *testing.T) {
	eachStack(t, func(t *testing.T, db *bun.DB, store *idem.Store) {
		idemtest.RunStack(t, idemtest.Stack{
			Name:  "bun's db.RunInTx",
			Store: store,
			DB:    db.DB,
			Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
				var res idem.Result
				err := idem.Retry(ctx, func() error {
					return db.RunInTx(ctx, &sql.TxOptions{Isolation: iso}, func(ctx context.Context, tx bun.Tx) error {
						var err error
						res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
							c := charge{Ref: req.Key, Amount: 100}
							if _, err := tx.NewInsert().Model(&c).Exec(ctx); err != nil {
								return idem.Response{}, err
							}
							if err := then(); err != nil {
								return idem.Response{}, err
							}
							return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(c.ID)}, nil
						})
						return err
					})
				})
				return res, err
			},
			Rows: func(ctx context.Context, key string) (int, error) {
				n, err := db.NewSelect().Model((*charge)(nil)).Where("ref = ?", key).Count(ctx)
				return int(n), err
			},
		})
	})
}
