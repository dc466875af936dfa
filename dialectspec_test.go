package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	_ "modernc.org/sqlite"
)

// outsideSQLite is SQLite as a caller outside idem builds it: SQLite's
// statements read back through StatementsOf, one of them changed, and the
// driver's errors read by the caller's own functions.
func outsideSQLite(noWait string) idem.DialectSpec {
	return idem.DialectSpec{
		Name: "sqlite-outside",
		Statements: func(table []string) idem.Statements {
			st, err := idem.StatementsOf(idem.SQLite, table)
			if err != nil {
				panic(err) // idem gives only valid names
			}
			st.NoReplicationWait = noWait
			return st
		},
		Inserted:  func(n int64, err error) (bool, error) { return n == 1, err },
		Retryable: idem.IsRetryable,
		Applied: func(err error) bool {
			return strings.Contains(err.Error(), "duplicate column name")
		},
		SchemaFault: func(err error) idem.SchemaFault {
			switch msg := err.Error(); {
			case strings.Contains(msg, "no such table: "):
				return idem.NoTable
			case strings.Contains(msg, "no such column: "), strings.Contains(msg, " has no column named "):
				for _, c := range []string{"expires_at", "sealed_key", "forget_at", "result_ref"} {
					if strings.Contains(msg, c) {
						return idem.OlderTable
					}
				}
				return idem.NotIdemTable
			case strings.Contains(msg, "unknown database "):
				return idem.NoSchema
			}
			return idem.NoSchemaFault
		},
	}
}

// TestNewDialectFromOutside runs a dialect built from outside through
// Do, Begin, Complete and Purge on SQLite, under a storm of duplicates,
// and counts the business rows.
func TestNewDialectFromOutside(t *testing.T) {
	ctx := t.Context()
	d, err := idem.NewDialect(outsideSQLite("this one waits for no one"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name() != "sqlite-outside" {
		t.Fatalf("Name %q", d.Name())
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "outside.db")+"?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(d, idem.WithTable("main.outside_keys"), idem.WithLease(time.Second), idem.WithRetention(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CheckWaitReplicated(); err == nil || !strings.Contains(err.Error(), "this one waits for no one") {
		t.Fatalf("CheckWaitReplicated: %v, want the changed statements' NoReplicationWait", err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, db); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if _, err := db.Exec(`CREATE TABLE outside_charges (id INTEGER PRIMARY KEY, idem_key TEXT)`); err != nil {
		t.Fatal(err)
	}

	// Do: 4 keys, 8 duplicates of each at once.
	const keys, dups = 4, 8
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		bodies = map[string]map[string]bool{}
		played int
	)
	for k := range keys {
		key := fmt.Sprintf("do-%d", k)
		bodies[key] = map[string]bool{}
		for range dups {
			wg.Go(func() {
				req := idem.Request{Scope: "s", Key: key, Operation: "charge", Fingerprint: idem.Fingerprint([]byte(key))}
				var res idem.Result
				err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
					var err error
					res, err = store.Do(ctx, tx, req, func(ctx context.Context) (idem.Response, error) {
						r, err := tx.ExecContext(ctx, `INSERT INTO outside_charges (idem_key) VALUES (?)`, key)
						if err != nil {
							return idem.Response{}, err
						}
						id, _ := r.LastInsertId()
						return idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, "%d", id)}, nil
					})
					return err
				})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				bodies[key][string(res.Body)] = true
				if res.Replayed {
					played++
				}
			})
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("Do: %d errors, the first %v", len(errs), errs[0])
	}
	if n := count(t, db, `SELECT COUNT(*) FROM outside_charges`); n != keys {
		t.Fatalf("%d charges for %d keys", n, keys)
	}
	for key, bs := range bodies {
		if len(bs) != 1 {
			t.Errorf("key %s answered %v, want one body", key, bs)
		}
	}
	if played != keys*(dups-1) {
		t.Errorf("%d replays, want %d", played, keys*(dups-1))
	}

	// Begin: 8 duplicates at once; one claims, the others are refused
	// in flight; once completed, a duplicate replays.
	req := idem.Request{Scope: "s", Key: "begin", Operation: "charge", Fingerprint: idem.Fingerprint([]byte("begin"))}
	var claims []*idem.Claim
	inflight := 0
	for range dups {
		wg.Go(func() {
			claim, _, err := store.Begin(ctx, db, req)
			mu.Lock()
			defer mu.Unlock()
			var busy *idem.InFlightError
			switch {
			case errors.As(err, &busy):
				inflight++
			case err != nil:
				errs = append(errs, err)
			default:
				claims = append(claims, claim)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 || len(claims) != 1 || inflight != dups-1 {
		t.Fatalf("Begin: %d claims, %d in flight, errors %v; want 1, %d, none", len(claims), inflight, errs, dups-1)
	}
	if err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outside_charges (idem_key) VALUES ('begin')`); err != nil {
			return err
		}
		return claims[0].Complete(ctx, tx, idem.Response{StatusCode: 201, Body: []byte("begun")})
	}); err != nil {
		t.Fatal(err)
	}
	claim, replay, err := store.Begin(ctx, db, req)
	if err != nil || claim != nil || replay == nil || string(replay.Body) != "begun" {
		t.Fatalf("Begin after Complete: claim %v, replay %v, err %v; want the replay", claim, replay, err)
	}
	if n := count(t, db, `SELECT COUNT(*) FROM outside_charges`); n != keys+1 {
		t.Fatalf("%d charges for %d keys", n, keys+1)
	}

	// Purge: every record is past its lease and retention.
	time.Sleep(2200 * time.Millisecond)
	n, err := store.Purge(ctx, db, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n != keys+1 || count(t, db, `SELECT COUNT(*) FROM outside_keys`) != 0 {
		t.Fatalf("Purge: %d records, want %d and an empty table", n, keys+1)
	}
}

// TestNewDialectRetryable checks that an error of the Store's statement
// that a dialect built outside reads as retryable is retryable to
// IsRetryable, and so to RunTx, which does not know the dialect.
func TestNewDialectRetryable(t *testing.T) {
	spec := outsideSQLite("")
	spec.Retryable = func(err error) bool { return strings.Contains(err.Error(), "no such table") }
	d, err := idem.NewDialect(spec)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "retry.db")+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := idem.New(d)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	req := idem.Request{Scope: "s", Key: "k", Operation: "op", Fingerprint: idem.Fingerprint(nil)}
	_, err = store.Do(t.Context(), tx, req, func(context.Context) (idem.Response, error) { return idem.Response{}, nil })
	if err == nil || !idem.IsRetryable(err) {
		t.Fatalf("Do on a missing table, which the dialect reads as retryable: %v, retryable %v", err, idem.IsRetryable(err))
	}
	if idem.IsRetryable(errors.Unwrap(err)) {
		t.Fatalf("the driver's error alone is retryable: %v", errors.Unwrap(err))
	}
}

func count(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNewDialectRefuses checks that NewDialect names what a spec lacks.
func TestNewDialectRefuses(t *testing.T) {
	change := func(f func(*idem.Statements)) func(*idem.DialectSpec) {
		return func(s *idem.DialectSpec) {
			pub := s.Statements
			s.Statements = func(table []string) idem.Statements {
				st := pub(table)
				f(&st)
				return st
			}
		}
	}
	for _, c := range []struct {
		name   string
		change func(*idem.DialectSpec)
		want   string
	}{
		{"no name", func(s *idem.DialectSpec) { s.Name = "" }, "empty name"},
		{"no statements", func(s *idem.DialectSpec) { s.Statements = nil }, "no Statements"},
		{"no inserted", func(s *idem.DialectSpec) { s.Inserted = nil }, "no Inserted"},
		{"no retryable", func(s *idem.DialectSpec) { s.Retryable = nil }, "no Retryable"},
		{"no table", change(func(st *idem.Statements) { st.Quoted = "" }), "no Quoted"},
		{"no migrations", change(func(st *idem.Statements) { st.Migrations = nil }), "no Migrations"},
		{"no insert", change(func(st *idem.Statements) { st.Insert = idem.Statement{} }), "no Insert"},
		{"no purge", change(func(st *idem.Statements) { st.Purge.SQL = " " }), "no Purge"},
		{"unknown arg", change(func(st *idem.Statements) {
			st.Extend.Args = append(st.Extend.Args[:len(st.Extend.Args):len(st.Extend.Args)], idem.Arg(200))
		}), "Extend takes Arg 200"},
		{"no claimed", change(func(st *idem.Statements) { st.TakeoverReturns = idem.Returning{Token: true} }), "no Claimed"},
	} {
		spec := outsideSQLite("")
		c.change(&spec)
		d, err := idem.NewDialect(spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: NewDialect = %v, %v; want an error naming %q", c.name, d, err, c.want)
		}
	}
	if _, err := idem.StatementsOf(idem.SQLite, []string{"a", "b", "c"}); err == nil {
		t.Error("StatementsOf of a table of three parts: no error")
	}
	if _, err := idem.StatementsOf(nil, []string{"keys"}); err == nil {
		t.Error("StatementsOf of a nil Dialect: no error")
	}
}
