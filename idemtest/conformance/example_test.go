package conformance_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/conformance"
)

// adapter is a third party's adapter of a *sql.DB to idem's Runner,
// written outside idem (idem's own is idem.NewSQLRunner): its statements
// run on the pool, and the transactions it begins are *sql.Tx. Its
// errors are the driver's own, which the dialects read.
type adapter struct {
	db   *sql.DB
	opts *sql.TxOptions
}

func (a adapter) Exec(ctx context.Context, q idem.Query) (int64, error) { return execOn(ctx, a.db, q) }

func (a adapter) QueryRow(ctx context.Context, q idem.Query, dest ...any) error {
	return a.db.QueryRowContext(ctx, q.SQL, q.Args...).Scan(dest...)
}

func (a adapter) QueryRows(ctx context.Context, q idem.Query, each func(scan func(dest ...any) error) error) error {
	return rowsOn(ctx, a.db, q, each)
}

// BeginTx begins a transaction with the adapter's options, or at iso for
// one of idem's own.
func (a adapter) BeginTx(ctx context.Context, iso sql.IsolationLevel) (idem.Tx, error) {
	opts := a.opts
	if iso != sql.LevelDefault {
		opts = &sql.TxOptions{Isolation: iso}
	}
	tx, err := a.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return adapterTx{tx}, nil
}

// adapterTx is a transaction the adapter began.
type adapterTx struct{ tx *sql.Tx }

func (t adapterTx) Exec(ctx context.Context, q idem.Query) (int64, error) {
	return execOn(ctx, t.tx, q)
}

func (t adapterTx) QueryRow(ctx context.Context, q idem.Query, dest ...any) error {
	return t.tx.QueryRowContext(ctx, q.SQL, q.Args...).Scan(dest...)
}

func (t adapterTx) QueryRows(ctx context.Context, q idem.Query, each func(scan func(dest ...any) error) error) error {
	return rowsOn(ctx, t.tx, q, each)
}

func (t adapterTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t adapterTx) Rollback(context.Context) error { return t.tx.Rollback() }

// handle is a *sql.DB or a *sql.Tx.
type handle interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func execOn(ctx context.Context, h handle, q idem.Query) (int64, error) {
	res, err := h.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func rowsOn(ctx context.Context, h handle, q idem.Query, each func(scan func(dest ...any) error) error) error {
	rows, err := h.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// adapterDB is the adapter's pool as the suite opens it: Runner is all
// the suite needs; Waits (conformance.WaitCounter) lets it check that
// duplicates wait in memory, not for a connection.
type adapterDB struct{ db *sql.DB }

func (d adapterDB) Runner(opts *sql.TxOptions) idem.Runner { return adapter{d.db, opts} }

func (d adapterDB) Close() { _ = d.db.Close() }

func (d adapterDB) Waits() int64 { return d.db.Stats().WaitCount }

// adapterTarget is SQLite through the adapter, on a database file in
// dir, opened with the DSN settings docs/dialects.md asks for.
func adapterTarget(dir string) conformance.Target {
	return conformance.Target{
		Name:    "sqlite-adapter",
		Dialect: idem.SQLite,
		DSN: func(testing.TB) string {
			return "file:" + filepath.Join(dir, "adapter.db") + "?_txlock=immediate&_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"
		},
		Open: func(dsn string, o conformance.Options) (conformance.DB, error) {
			db, err := sql.Open("sqlite", dsn)
			if err != nil {
				return nil, err
			}
			if err := db.Ping(); err != nil {
				_ = db.Close()
				return nil, err
			}
			db.SetMaxOpenConns(o.Conns)
			return adapterDB{db}, nil
		},
		Facts: conformance.SQLiteFacts(),
	}
}

// A third party's adapter proves itself with one call, in a test of its
// own:
//
//	func TestConformance(t *testing.T) {
//		conformance.Exercise(t, adapterTarget(t.TempDir()))
//	}
//
// which is this package's TestThirdPartyAdapter. The target is data: the
// adapter's pool, opened on the target's DSN, and the facts of its
// database, here SQLite's.
func ExampleExercise() {
	dir, err := os.MkdirTemp("", "adapter-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	tg := adapterTarget(dir)
	db, err := tg.Open(tg.DSN(nil), conformance.Options{Conns: 1})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	var n int
	if err := db.Runner(nil).QueryRow(context.Background(), idem.Query{SQL: "SELECT 1"}, &n); err != nil {
		panic(err)
	}
	fmt.Printf("%s answers %d through its Runner\n", tg.Name, n)
	// Output: sqlite-adapter answers 1 through its Runner
}
