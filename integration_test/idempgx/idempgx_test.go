// Package idempgx_test checks what is package idempgx's own, on
// PostgreSQL: RunTx's retries and refusals, the adapters Tx, Conn and
// New, and TxFrom behind idemhttp's middleware. The conformance suite
// runs every operation of idem through its adapters (its native targets).
package idempgx_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/idemserve"
	"github.com/idemkit/idem/idemtest/containers"
	"github.com/idemkit/idem/idemtest/testdb"
)

func TestMain(m *testing.M) { containers.Main(m) }

// env is a pool on PostgreSQL, a Store on a table of the test's own and a
// business table (k), dropped when the test ends.
type env struct {
	pool  *pgxpool.Pool
	store *idem.Store
	rows  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	suffix := strings.ToLower(rand.Text()[:10])
	store, err := idem.New(idem.Postgres, idem.WithTable("idempgx_"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.MigrateOn(ctx, idempgx.Conn(pool)); err != nil {
		t.Fatal(err)
	}
	e := &env{pool: pool, store: store, rows: "idempgx_rows_" + suffix}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+e.rows+" (k text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+e.rows+", "+store.Table()) })
	return e
}

// insert writes a business row k through tx.
func (e *env) insert(ctx context.Context, tx pgx.Tx, k string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+e.rows+" VALUES ($1)", k)
	return err
}

// count is the number of committed business rows k.
func (e *env) count(t *testing.T, k string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.rows+" WHERE k = $1", k).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// serialization is PostgreSQL's serialization failure, which
// idem.IsRetryable reports.
var serialization = &pgconn.PgError{Code: "40001", Message: "could not serialize access"}

// RunTx begins with its options, commits what fn wrote, rolls back an
// attempt that failed with a retryable error and runs it again, returns
// fn's other errors after one attempt, gives up after ten, and passes a
// panic on after rolling back.
func TestRunTx(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	attempts := 0
	err := idempgx.RunTx(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		attempts++
		var iso string
		if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "serializable" {
			return fmt.Errorf("the transaction is %q (%v), want serializable", iso, err)
		}
		if err := e.insert(ctx, tx, "retried"); err != nil {
			return err
		}
		if attempts == 1 {
			return serialization
		}
		return nil
	})
	if err != nil || attempts != 2 {
		t.Fatalf("RunTx whose first attempt failed with 40001: %v after %d attempts, want success after 2", err, attempts)
	}
	if n := e.count(t, "retried"); n != 1 {
		t.Errorf("%d rows after a retried transaction, want 1: the failed attempt's rolled back", n)
	}

	errFn := errors.New("fn failed")
	attempts = 0
	err = idempgx.RunTx(ctx, e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		attempts++
		_ = e.insert(ctx, tx, "failed")
		return errFn
	})
	if !errors.Is(err, errFn) || attempts != 1 {
		t.Errorf("RunTx whose fn fails: %v after %d attempts, want fn's error after 1", err, attempts)
	}

	attempts = 0
	err = idempgx.RunTx(ctx, e.pool, pgx.TxOptions{}, func(pgx.Tx) error { attempts++; return serialization })
	if !errors.Is(err, serialization) || attempts != 10 || !strings.Contains(err.Error(), "gave up after 10 attempts") {
		t.Errorf("RunTx that always fails with 40001: %v after %d attempts, want it to give up after 10, wrapping the error", err, attempts)
	}

	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic passed on", p)
			}
		}()
		_ = idempgx.RunTx(ctx, e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			_ = e.insert(ctx, tx, "panicked")
			panic("boom")
		})
	}()
	for _, k := range []string{"failed", "panicked"} {
		if n := e.count(t, k); n != 0 {
			t.Errorf("%d rows %q, want 0: its transaction rolled back", n, k)
		}
	}
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired after RunTx returned, want 0", n)
	}

	if err := idempgx.RunTx(ctx, nil, pgx.TxOptions{}, func(pgx.Tx) error { return nil }); err == nil {
		t.Error("RunTx without a pool: no error")
	}
	if err := idempgx.RunTx(ctx, e.pool, pgx.TxOptions{}, nil); err == nil {
		t.Error("RunTx without a function: no error")
	}
}

// New's Runner begins the caller's transactions (sql.LevelDefault) with
// its options and idem's own at the level asked, and unwraps only its
// own; Tx and Conn adapt nil to nil, which every On method refuses.
func TestAdapters(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	r := idempgx.New(e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	for iso, want := range map[sql.IsolationLevel]string{sql.LevelDefault: "repeatable read", sql.LevelReadCommitted: "read committed"} {
		tx, err := r.BeginTx(ctx, iso)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if err := tx.QueryRow(ctx, idem.Query{SQL: "SELECT current_setting('transaction_isolation')"}, &got); err != nil || got != want {
			t.Errorf("BeginTx(%v): the transaction is %q (%v), want %q", iso, got, err, want)
		}
		if r.Unwrap(tx) == nil {
			t.Errorf("Unwrap of a transaction of the Runner's: nil")
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("pgx", testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	other, err := idem.NewSQLRunner(db, nil).BeginTx(ctx, sql.LevelDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if tx := r.Unwrap(other); tx != nil {
		t.Errorf("Unwrap of database/sql's transaction: %v, want nil", tx)
	}

	if idempgx.Tx(nil) != nil || idempgx.Conn(nil) != nil {
		t.Fatal("Tx(nil) or Conn(nil) is not nil")
	}
	req := idem.Request{Scope: "s", Key: "k", Operation: "POST /x", Fingerprint: "f"}
	ok := func(context.Context) (idem.Response, error) { return idem.Response{StatusCode: 200}, nil }
	claim, _, err := e.store.BeginOn(ctx, r, req)
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"DoOn":       func() error { _, err := e.store.DoOn(ctx, idempgx.Tx(nil), req, ok); return err }(),
		"MigrateOn":  e.store.MigrateOn(ctx, idempgx.Conn(nil)),
		"InspectOn":  func() error { _, err := e.store.InspectOn(ctx, idempgx.Conn(nil), "s", "k"); return err }(),
		"StatsOn":    func() error { _, err := e.store.StatsOn(ctx, idempgx.Conn(nil)); return err }(),
		"CompleteOn": claim.CompleteOn(ctx, idempgx.Tx(nil), idem.Response{StatusCode: 200}),
		"ExtendOn":   claim.ExtendOn(ctx, idempgx.Conn(nil), idem.DefaultLease),
		"ReleaseOn":  claim.ReleaseOn(ctx, idempgx.Conn(nil)),
	} {
		if err == nil {
			t.Errorf("%s with nil: no error", name)
		}
	}
	if err := claim.ReleaseOn(ctx, idempgx.Conn(e.pool)); err != nil {
		t.Fatalf("ReleaseOn the pool: %v", err)
	}
}

// Behind idemhttp's middleware on idempgx's Runner the handler gets its
// pgx.Tx (begun with the Runner's options) from idempgx.TxFrom, nothing
// from idemhttp.TxFrom, and its claim from idemhttp.ClaimFrom; behind a
// middleware on database/sql, idempgx.TxFrom is nil. The rows commit once
// with the key: the second request replays.
func TestTxFrom(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	db, err := sql.Open("pgx", testdb.Postgres.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, mode := range []idemserve.Mode{idemserve.ModeTransaction, idemserve.ModeClaim} {
		claimed := mode == idemserve.ModeClaim
		mw, err := idemhttp.New(idemhttp.Config{Store: e.store, Runner: idempgx.New(e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}), Scope: idemhttp.SingleTenant, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("pgx-%d", mode)
		postTwice(t, mw, key, func(ctx context.Context) error {
			if idemhttp.TxFrom(ctx) != nil {
				return errors.New("idemhttp.TxFrom returned a *sql.Tx behind a middleware on pgx")
			}
			if (idemhttp.ClaimFrom(ctx) != nil) != claimed {
				return fmt.Errorf("ClaimFrom %v in mode %d", idemhttp.ClaimFrom(ctx), mode)
			}
			tx := idempgx.TxFrom(ctx)
			if tx == nil {
				return errors.New("idempgx.TxFrom returned nil behind a middleware on pgx")
			}
			var iso string
			if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil || iso != "repeatable read" {
				return fmt.Errorf("the handler's transaction is %q (%v), want repeatable read", iso, err)
			}
			return e.insert(ctx, tx, key)
		})

		mw, err = idemhttp.New(idemhttp.Config{Store: e.store, DB: db, Scope: idemhttp.SingleTenant, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		key = fmt.Sprintf("sql-%d", mode)
		postTwice(t, mw, key, func(ctx context.Context) error {
			if idempgx.TxFrom(ctx) != nil {
				return errors.New("idempgx.TxFrom returned a pgx.Tx behind a middleware on database/sql")
			}
			if (idemhttp.ClaimFrom(ctx) != nil) != claimed {
				return fmt.Errorf("idemhttp.ClaimFrom %v in mode %d", idemhttp.ClaimFrom(ctx), mode)
			}
			_, err := idemhttp.TxFrom(ctx).ExecContext(ctx, "INSERT INTO "+e.rows+" VALUES ($1)", key)
			return err
		})
	}
	if idempgx.TxFrom(ctx) != nil {
		t.Error("TxFrom outside the middleware returned a transaction")
	}
	for _, k := range []string{"pgx-0", "pgx-1", "sql-0", "sql-1"} {
		if n := e.count(t, k); n != 1 {
			t.Errorf("%s: %d rows, want 1", k, n)
		}
	}
}

// postTwice sends two POSTs with key through mw to a handler that runs
// work and answers 201, or 500 with work's error, and wants a 201 and
// its replay.
func postTwice(t *testing.T, mw *idemhttp.Middleware, key string, work func(ctx context.Context) error) {
	t.Helper()
	var (
		mu   sync.Mutex
		errs []error
	)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := work(r.Context()); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	for i := range 2 {
		req, err := http.NewRequest(http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderIdempotencyKey, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		err = errors.Join(errs...)
		mu.Unlock()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if replayed := resp.Header.Get(idemhttp.HeaderIdempotentReplayed) == "true"; resp.StatusCode != http.StatusCreated || replayed != (i == 1) {
			t.Fatalf("%s, request %d: %d replayed=%v; want 201, then its replay", key, i+1, resp.StatusCode, replayed)
		}
	}
}
