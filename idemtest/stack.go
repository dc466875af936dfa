package idemtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/testdb"
)

// Stack is a stack a service keeps its transactions in (GORM, bun, ent,
// sqlc's generated queries, or the same under idemhttp), as the tests of
// its integration drive it: one request at a time, through the stack's
// own transaction, written the way its users write it.
type Stack struct {
	// Name names the stack in messages.
	Name string
	// Store is the Store that Charge runs, and DB a database/sql handle on
	// the same database, through which RunStack reads idem's records.
	Store *idem.Store
	DB    *sql.DB
	// Charge runs req as a service on the stack would: in a transaction
	// of the stack's own, begun at isolation level iso through the stack's
	// transaction options and retried with idem.Retry (or a RunTx) as its
	// users would, it calls Do with an fn that writes one business row for
	// req.Key through the stack and then calls then. When then returns an
	// error, fn returns it (wrapped or not), after its row was written;
	// otherwise fn answers 201 with a body naming the row it wrote (its
	// id), so that no two executions answer alike. Charge returns Do's
	// result, or the error that ended the transaction.
	Charge func(ctx context.Context, iso sql.IsolationLevel, req idem.Request, then func() error) (idem.Result, error)
	// Rows counts the committed business rows for key.
	Rows func(ctx context.Context, key string) (int, error)
}

// StormSize is how many duplicates of one request RunStack's storm
// sends at once.
const StormSize = 16

// StormLevels are the isolation levels RunStack's storm runs at: READ
// COMMITTED, where a duplicate waits for the first and replays it, and
// REPEATABLE READ, where PostgreSQL aborts it instead (40001) and the
// retry replays.
var StormLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead}

// RunStack runs the checks every stack passes, each as a subtest of t:
//
//   - a storm of StormSize duplicates, at each of StormLevels, runs fn
//     once, commits one business row, and gives every caller the same
//     response;
//   - fn's error rolls back the record and the row, and the key then runs
//     again;
//   - a retry replays the stored response without running fn;
//   - the key reused with another payload is idem.ErrMismatch (HTTP's
//     422), and runs nothing.
func RunStack(t *testing.T, o Stack) {
	t.Helper()
	for _, iso := range StormLevels {
		t.Run("Storm/"+strings.ReplaceAll(iso.String(), " ", ""), func(t *testing.T) { checkStorm(t, o, iso) })
	}
	t.Run("FnErrorRollsBack", func(t *testing.T) { checkFnError(t, o) })
	t.Run("Replay", func(t *testing.T) { checkReplay(t, o) })
	t.Run("Mismatch", func(t *testing.T) { checkMismatch(t, o) })
}

// ChargeRequest is a request to charge amount under key, with a key that no
// other run of the test uses.
func ChargeRequest(key, amount string) idem.Request {
	return idem.Request{
		Scope:       "tenant-1",
		Key:         key + "-" + rand.Text()[:8],
		Operation:   "POST /v1/charges",
		Fingerprint: idem.Fingerprint([]byte("amount=" + amount)),
	}
}

func checkStorm(t *testing.T, o Stack, iso sql.IsolationLevel) {
	ctx := t.Context()
	req := ChargeRequest("storm", "100")
	var (
		runs    atomic.Int64
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []idem.Result
		errs    []error
	)
	start := make(chan struct{})
	for range StormSize {
		wg.Go(func() {
			<-start
			res, err := o.Charge(ctx, iso, req, func() error {
				runs.Add(1)
				time.Sleep(50 * time.Millisecond) // the duplicates arrive while it runs
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			results = append(results, res)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("%s: a duplicate failed: %v", o.Name, err)
	}
	rowsAre(t, o, req.Key, 1)
	if n := runs.Load(); n != 1 {
		t.Errorf("%s: fn ran %d times for %d duplicates, want once", o.Name, n, StormSize)
	}
	executed := 0
	for _, r := range results {
		if !r.Replayed {
			executed++
		}
		if r.StatusCode != 201 || !bytes.Equal(r.Body, results[0].Body) {
			t.Errorf("%s: a duplicate got %d %q, the first %d %q; want all the same 201", o.Name, r.StatusCode, r.Body, results[0].StatusCode, results[0].Body)
		}
	}
	if executed != 1 && len(errs) == 0 {
		t.Errorf("%s: %d of %d results not replayed, want 1", o.Name, executed, len(results))
	}
}

// errDeclined is the error the fn of checkFnError fails with.
var errDeclined = errors.New("idemtest: the card was declined after the row was written")

func checkFnError(t *testing.T, o Stack) {
	ctx := t.Context()
	req := ChargeRequest("fn-error", "100")
	_, err := o.Charge(ctx, sql.LevelDefault, req, func() error { return errDeclined })
	if !errors.Is(err, errDeclined) {
		t.Fatalf("%s: Charge whose fn failed: err = %v, want fn's error", o.Name, err)
	}
	rowsAre(t, o, req.Key, 0)
	if rec, err := o.Store.Inspect(ctx, o.DB, req.Scope, req.Key); err != nil || rec != nil {
		t.Fatalf("%s: after fn's error, record %+v (%v), want none", o.Name, rec, err)
	}
	runs := 0
	res, err := o.Charge(ctx, sql.LevelDefault, req, func() error { runs++; return nil })
	if err != nil || res.Replayed || res.StatusCode != 201 || runs != 1 {
		t.Fatalf("%s: the retry after fn's error: %+v, %v, fn ran %d times; want it run once, 201", o.Name, res, err, runs)
	}
	rowsAre(t, o, req.Key, 1)
}

func checkReplay(t *testing.T, o Stack) {
	ctx := t.Context()
	req := ChargeRequest("replay", "100")
	runs := 0
	then := func() error { runs++; return nil }
	first, err := o.Charge(ctx, sql.LevelDefault, req, then)
	if err != nil || first.Replayed || first.StatusCode != 201 {
		t.Fatalf("%s: first Charge: %+v, %v; want it run, 201", o.Name, first, err)
	}
	again, err := o.Charge(ctx, sql.LevelDefault, req, then)
	if err != nil || !again.Replayed || again.StatusCode != first.StatusCode || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("%s: the retry: %+v, %v; want the first's %d %q, replayed", o.Name, again, err, first.StatusCode, first.Body)
	}
	if runs != 1 {
		t.Errorf("%s: fn ran %d times, want once", o.Name, runs)
	}
	rowsAre(t, o, req.Key, 1)
}

func checkMismatch(t *testing.T, o Stack) {
	ctx := t.Context()
	req := ChargeRequest("mismatch", "100")
	runs := 0
	then := func() error { runs++; return nil }
	if _, err := o.Charge(ctx, sql.LevelDefault, req, then); err != nil {
		t.Fatalf("%s: first Charge: %v", o.Name, err)
	}
	other := req
	other.Fingerprint = idem.Fingerprint([]byte("amount=999"))
	if _, err := o.Charge(ctx, sql.LevelDefault, other, then); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("%s: the key with another payload: err = %v, want idem.ErrMismatch (422)", o.Name, err)
	}
	if runs != 1 {
		t.Errorf("%s: fn ran %d times, want once", o.Name, runs)
	}
	rowsAre(t, o, req.Key, 1)
}

func rowsAre(t *testing.T, o Stack, key string, want int) {
	t.Helper()
	n, err := o.Rows(t.Context(), key)
	if err != nil {
		t.Fatalf("%s: counting the rows of %q: %v", o.Name, key, err)
	}
	if n != want {
		t.Fatalf("%s: %d business rows for %q, want %d", o.Name, n, key, want)
	}
}

// Database is a database of one test's own on a real server: a schema
// on PostgreSQL, a database on MariaDB, dropped when the test ends, so
// that the fixed table names of an ORM's models, of sqlc's queries or of
// a service meet no other test's.
type Database struct {
	// Server is the server's name ("PostgreSQL", "MariaDB", ...), and
	// Dialect idem's for it.
	Server  string
	Dialect idem.Dialect
	// Name is the schema's or database's name.
	Name string
	// DSN reaches it in the Go drivers' format: a PostgreSQL DSN whose
	// search_path is the schema (pgx, lib/pq and, from a URL, bun's
	// pgdriver take it), or a go-sql-driver/mysql DSN whose database it
	// is.
	DSN string
}

// PostgresDatabase is a schema of the test's own on the PostgreSQL server
// package testdb finds (skipping the test when there is none).
func PostgresDatabase(t *testing.T) Database {
	return ServerDatabase(t, testdb.Postgres, idem.Postgres)
}

// MariaDBDatabase is a database of the test's own on the MariaDB server
// package testdb finds (skipping the test when there is none).
func MariaDBDatabase(t *testing.T) Database { return ServerDatabase(t, testdb.MariaDB, idem.MariaDB) }

// ServerDatabase is a database of the test's own on server, for dialect d:
// a schema on a PostgreSQL server (PgBouncer's included), a database on
// one of the MySQL family (TiDB's included). It skips the test when
// package testdb finds no such server.
func ServerDatabase(t *testing.T, server *testdb.Server, d idem.Dialect) Database {
	t.Helper()
	dsn := server.DSN(t)
	name := freshName()
	db := Database{Server: server.Name, Dialect: d, Name: name}
	if server.Driver != "mysql" {
		createDatabase(t, server.Driver, dsn, "CREATE SCHEMA "+name, "DROP SCHEMA "+name+" CASCADE")
		sep := "?" // a URL's first parameter
		switch {
		case !strings.Contains(dsn, "://"):
			sep = " " // a key=value DSN
		case strings.Contains(dsn, "?"):
			sep = "&"
		}
		db.DSN = dsn + sep + "search_path=" + name
		return db
	}
	createDatabase(t, "mysql", dsn, "CREATE DATABASE "+name, "DROP DATABASE "+name)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("the %s DSN %q: %v", server.Name, dsn, err)
	}
	cfg.DBName = name
	db.DSN = cfg.FormatDSN()
	return db
}

// freshName is a fresh schema or database name.
func freshName() string { return "idemtest_" + strings.ToLower(rand.Text()[:10]) }

// createDatabase runs create on the server at dsn, and drop when the test
// ends, after the test's own cleanups (which close its pools).
func createDatabase(t *testing.T, driver, dsn, create, drop string) {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), create); err != nil {
		_ = db.Close()
		t.Fatalf("%s: %v", create, err)
	}
	t.Cleanup(func() {
		defer db.Close()
		if _, err := db.ExecContext(context.Background(), drop); err != nil {
			t.Errorf("%s: %v", drop, err)
		}
	})
}

// ChargeBody is the body a stack's fn answers for the business row it
// wrote: {"id":N}.
func ChargeBody(id int64) []byte { return fmt.Appendf(nil, `{"id":%d}`, id) }
