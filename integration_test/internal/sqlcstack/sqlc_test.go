package sqlcstack_test

import (
	"context"
	"database/sql"
	"net/http"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/containers"
	"github.com/idemkit/idem/integration_test/internal/sqlcstack/mysqldb"
	"github.com/idemkit/idem/integration_test/internal/sqlcstack/pgdb"
	"github.com/idemkit/idem/integration_test/internal/sqlcstack/pgxdb"
)

// sqlc's DBTX interfaces are idem's: the database/sql one an idem.DBTX,
// the pgx one an idempgx.DBTX.
var (
	_ idem.DBTX    = pgdb.DBTX(nil)
	_ idem.DBTX    = mysqldb.DBTX(nil)
	_ idempgx.DBTX = pgxdb.DBTX(nil)
)

func TestMain(m *testing.M) { containers.Main(m) }

// openSQL opens d with driver and makes sqlc's table and idem's.
func openSQL(t *testing.T, d idemtest.Database, driver, schema string) (*sql.DB, *idem.Store) {
	t.Helper()
	db, err := sql.Open(driver, d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(2 * idemtest.StormSize)
	ddl, err := os.ReadFile(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), string(ddl)); err != nil {
		t.Fatalf("%s: %v", schema, err)
	}
	store, err := idem.New(d.Dialect)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context(), db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db, store
}

// sqlc's database/sql code for PostgreSQL, on pgx's database/sql driver
// and on lib/pq: queries.WithTx(tx) inside idem.RunTx, tx handed to Do.
func TestPostgresDatabaseSQL(t *testing.T) {
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			db, store := openSQL(t, idemtest.PostgresDatabase(t), driver, "schema/postgres.sql")
			queries := pgdb.New(db)
			idemtest.RunStack(t, idemtest.Stack{
				Name:  "sqlc's database/sql Queries (" + driver + ")",
				Store: store,
				DB:    db,
				Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
					var res idem.Result
					err := idem.RunTx(ctx, db, &sql.TxOptions{Isolation: iso}, func(tx *sql.Tx) error {
						q := queries.WithTx(tx)
						var err error
						res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
							id, err := q.InsertCharge(ctx, pgdb.InsertChargeParams{Ref: req.Key, Amount: 100})
							if err != nil {
								return idem.Response{}, err
							}
							if err := then(); err != nil {
								return idem.Response{}, err
							}
							return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(id)}, nil
						})
						return err
					})
					return res, err
				},
				Rows: func(ctx context.Context, key string) (int, error) {
					n, err := queries.CountCharges(ctx, key)
					return int(n), err
				},
			})
		})
	}
}

// sqlc's database/sql code for MySQL, on MariaDB.
func TestMariaDBDatabaseSQL(t *testing.T) {
	db, store := openSQL(t, idemtest.MariaDBDatabase(t), "mysql", "schema/mysql.sql")
	queries := mysqldb.New(db)
	idemtest.RunStack(t, idemtest.Stack{
		Name:  "sqlc's database/sql Queries (MySQL)",
		Store: store,
		DB:    db,
		Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
			var res idem.Result
			err := idem.RunTx(ctx, db, &sql.TxOptions{Isolation: iso}, func(tx *sql.Tx) error {
				q := queries.WithTx(tx)
				var err error
				res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
					id, err := q.InsertCharge(ctx, mysqldb.InsertChargeParams{Ref: req.Key, Amount: 100})
					if err != nil {
						return idem.Response{}, err
					}
					if err := then(); err != nil {
						return idem.Response{}, err
					}
					return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(id)}, nil
				})
				return err
			})
			return res, err
		},
		Rows: func(ctx context.Context, key string) (int, error) {
			n, err := queries.CountCharges(ctx, key)
			return int(n), err
		},
	})
}

// pgxLevels are pgx's names of the isolation levels RunStack asks for.
var pgxLevels = map[sql.IsolationLevel]pgx.TxIsoLevel{
	sql.LevelReadCommitted:  pgx.ReadCommitted,
	sql.LevelRepeatableRead: pgx.RepeatableRead,
}

// sqlc's pgx/v5 code on a *pgxpool.Pool: queries.WithTx(tx) inside
// idempgx.RunTx, the pgx.Tx handed to DoOn through idempgx.Tx.
func TestPgx(t *testing.T) {
	d := idemtest.PostgresDatabase(t)
	db, store := openSQL(t, d, "pgx", "schema/postgres.sql")
	pool, err := pgxpool.New(t.Context(), d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	queries := pgxdb.New(pool)
	idemtest.RunStack(t, idemtest.Stack{
		Name:  "sqlc's pgx Queries through idempgx.Tx",
		Store: store,
		DB:    db,
		Charge: func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error) {
			var res idem.Result
			err := idempgx.RunTx(ctx, pool, pgx.TxOptions{IsoLevel: pgxLevels[iso]}, func(tx pgx.Tx) error {
				q := queries.WithTx(tx)
				var err error
				res, err = store.DoOn(ctx, idempgx.Tx(tx), req, func(ctx context.Context) (idem.Response, error) {
					id, err := q.InsertCharge(ctx, pgxdb.InsertChargeParams{Ref: req.Key, Amount: 100})
					if err != nil {
						return idem.Response{}, err
					}
					if err := then(); err != nil {
						return idem.Response{}, err
					}
					return idem.Response{StatusCode: http.StatusCreated, Body: idemtest.ChargeBody(id)}, nil
				})
				return err
			})
			return res, err
		},
		Rows: func(ctx context.Context, key string) (int, error) {
			n, err := queries.CountCharges(ctx, key)
			return int(n), err
		},
	})
}
