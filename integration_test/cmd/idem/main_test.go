// Package idem_test runs the idem command on every database: SQLite and
// each server package testdb finds, through the binary built from
// cmd/idem, as its users run it. The command's tests that need no server
// are in cmd/idem.
package idem_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
	"github.com/idemkit/idem/integration_test/internal/cmdtest"
)

func TestMain(m *testing.M) { cmdtest.Main(m) }

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func idemCmd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cmdtest.Binary(t, "github.com/idemkit/idem/cmd/idem"), args...)
	cmd.Env = append(os.Environ(), "IDEM_DSN=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("idem %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// database is one database the tests run on.
type database struct {
	name      string
	dsn       string // in the command's form
	driver    string // the Go driver of the test's own statements, on driverDSN
	dialect   idem.Dialect
	driverDSN string
}

// databases are every database the tests run on: SQLite always, and each
// server package testdb finds (a missing one fails the test under
// IDEM_TEST_REQUIRE=1).
func databases(t *testing.T) []database {
	file := filepath.Join(t.TempDir(), "idem.db")
	dbs := []database{{name: "sqlite", dsn: "sqlite:" + file, driver: "sqlite", dialect: idem.SQLite,
		driverDSN: "file:" + file + "?_txlock=immediate&_pragma=busy_timeout(30000)"}}
	for _, s := range []struct {
		name    string
		server  *testdb.Server
		dialect idem.Dialect
	}{
		{"postgres", testdb.Postgres, idem.Postgres},
		{"mysql", testdb.MySQL, idem.MySQL},
		{"mariadb", testdb.MariaDB, idem.MariaDB},
		{"tidb", testdb.TiDB, idem.TiDB},
	} {
		dsn, why := s.server.Find()
		switch {
		case dsn != "":
			dbs = append(dbs, database{name: s.name, dsn: cmdtest.DSN(t, s.name, s.server, dsn), driver: s.server.Driver, dialect: s.dialect, driverDSN: dsn})
		case testdb.Required:
			t.Errorf("IDEM_TEST_REQUIRE=1 and %s", why)
		default:
			t.Logf("not running on %s: %s", s.server.Name, why)
		}
	}
	return dbs
}

// open connects to d with its Go driver; the pool is closed when the test
// ends.
func (d database) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open(d.driver, d.driverDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The demo on every server holds as on SQLite (cmd/idem's TestDemo checks
// its output there): its closing table has a row per scenario, each with
// one charge with idem and IDEM OK yes.
func TestDemo(t *testing.T) {
	want := len(scenarioRows(t, idemCmd(t, "demo").stdout))
	for _, d := range databases(t)[1:] {
		t.Run(d.name, func(t *testing.T) {
			r := idemCmd(t, "demo", "--dsn", d.dsn)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit code %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
			}
			rows := scenarioRows(t, r.stdout)
			if len(rows) != want {
				t.Errorf("%d rows in the table, %d on SQLite:\n%s", len(rows), want, r.stdout)
			}
			for _, row := range rows {
				if !strings.HasSuffix(row, " yes") || !strings.Contains(row, "1 charge") {
					t.Errorf("row %q: want one charge with idem and IDEM OK yes", row)
				}
			}
		})
	}
}

// scenarioRows are the rows of the demo's closing table.
func scenarioRows(t *testing.T, out string) []string {
	t.Helper()
	_, table, ok := strings.Cut(out, "\nSCENARIO ")
	if !ok {
		t.Fatalf("no closing table in the demo's output:\n%s", out)
	}
	_, table, _ = strings.Cut(table, "\n")
	rows, _, _ := strings.Cut(table, "\n\n")
	return strings.Split(rows, "\n")
}

// migrate, inspect, stats and purge, in text and JSON, on every database.
func TestOperate(t *testing.T) {
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			name, dsn := d.name, d.dsn
			table := fmt.Sprintf("idem_cmd_%d", time.Now().UnixNano())
			r := idemCmd(t, "migrate", "--dsn", dsn, "--table", table)
			if r.code != 0 || !strings.Contains(r.stdout, table) {
				t.Fatalf("migrate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			db := d.open(t)
			defer db.Exec("DROP TABLE IF EXISTS " + table)

			s, err := idem.New(d.dialect, idem.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			req := idem.Request{Scope: "tenant 1", Key: "order-42", Operation: "POST /v1/orders", Fingerprint: "f00d"}
			_, err = s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"order":42}`)}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "order-42")
			for _, want := range []string{"completed", "POST /v1/orders", "f00d", "201 Created, 12 bytes", "Content-Type: application/json", `{"order":42}`, "age "} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("inspect output lacks %q:\n%s", want, r.stdout)
				}
			}
			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "order-42", "--json")
			var rec record
			if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil {
				t.Fatalf("inspect --json: %v\n%s", err, r.stdout)
			}
			if rec.Status != "completed" || rec.Token == 0 || rec.Response == nil || rec.Response.Status != 201 ||
				rec.Response.Body == nil || *rec.Response.Body != `{"order":42}` || rec.AgeSeconds < 0 || rec.AgeSeconds > 60 {
				t.Errorf("inspect --json: %s", r.stdout)
			}
			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "ORDER-42")
			if r.code != 1 || !strings.Contains(r.stderr, "no record") {
				t.Errorf("inspect of a missing key (keys are case-sensitive): exit %d, stderr %q", r.code, r.stderr)
			}
			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "order 42")
			if r.code != 2 || !strings.Contains(r.stderr, "invalid idempotency key") {
				t.Errorf("inspect of an invalid key: exit %d, stderr %q; want 2 and the reason", r.code, r.stderr)
			}

			claimed := req
			claimed.Key = "order-43"
			c, _, err := s.Begin(ctx, db, claimed)
			if err != nil {
				t.Fatal(err)
			}
			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "order-43", "--json")
			var claim record
			if err := json.Unmarshal([]byte(r.stdout), &claim); err != nil {
				t.Fatalf("inspect --json of a claim: %v\n%s", err, r.stdout)
			}
			if left := claim.LeaseUntil.Sub(claim.Now); claim.Status != "processing" || claim.Token != c.Token() || claim.Response != nil ||
				left < 25*time.Second || left > 30*time.Second {
				t.Errorf("inspect --json of a claim with token %d: %s", c.Token(), r.stdout)
			}
			r = idemCmd(t, "inspect", "--dsn", dsn, "--table", table, "--scope", "tenant 1", "--key", "order-43")
			if !strings.Contains(r.stdout, "processing") || !strings.Contains(r.stdout, "left)") {
				t.Errorf("inspect of a claim:\n%s", r.stdout)
			}
			if err := c.Release(ctx, db); err != nil {
				t.Fatal(err)
			}

			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table)
			for _, want := range []string{"records 2", "completed 1", "released 1", "past expiry 0 (by each record's own expiry;", "table size"} {
				if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), want) {
					t.Errorf("stats output lacks %q:\n%s", want, r.stdout)
				}
			}
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json")
			var st stats
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
				t.Fatalf("stats --json: %v\n%s", err, r.stdout)
			}
			if st.Total != 2 || st.ByStatus["completed"] != 1 || st.ByStatus["released"] != 1 || st.Oldest == nil || st.PastExpiry != 0 {
				t.Errorf("stats --json: %s", r.stdout)
			}
			if n, ok := st.ByStatus["processing"]; !ok || n != 0 {
				t.Errorf("stats --json: want every status, processing at 0: %s", r.stdout)
			}
			if name != "mysql" && name != "mariadb" && name != "tidb" && (st.TableBytes == nil || *st.TableBytes <= 0) { // InnoDB's and TiDB's figures lag
				t.Errorf("stats --json: no table size: %s", r.stdout)
			}

			// Each record expires when its own retention says (24h here);
			// --retention is the expiry of the records of a release before
			// per-request retention, which have none: made so, the two
			// are past 10ms. On MySQL and MariaDB every record has its
			// expiry (schema version 4 clusters on it): there the two are
			// made past theirs. Their forget times (each at its expiry:
			// no key memory) go with their expiries.
			past := "UPDATE " + table + " SET expires_at = NULL, forget_at = NULL"
			if name == "mysql" || name == "mariadb" {
				past = "UPDATE " + table + " SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, forget_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
			}
			if _, err := db.Exec(past); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json", "--retention", "10ms")
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.PastExpiry != 2 {
				t.Errorf("stats --retention 10ms: want 2 past expiry: %s", r.stdout)
			}
			r = idemCmd(t, "purge", "--dsn", dsn, "--table", table, "--retention", "10ms", "--batch", "1", "--workers", "2")
			if r.code != 0 || !strings.Contains(r.stdout, "batch 2: 1 deleted, 0 tombstones (2 deleted, 0 tombstones so far)") ||
				!strings.Contains(r.stdout, "purged 2 records past their expiry from "+table) || !strings.Contains(r.stdout, ": 2 deleted, 0 tombstones\n") {
				t.Errorf("purge: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json")
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Total != 0 {
				t.Errorf("stats after purge: %s", r.stdout)
			}
		})
	}
}

// A record written with key memory (the Store's, or the request's) is
// never run again by a retry before its forget time, whoever purges:
// here the command, without flags, past the records' expiry. It makes
// tombstones of them and says so, and a retry through a Store without
// key memory is refused (ErrExpired) without running its fn. A record
// past its forget time as well goes. Before the records kept their
// forget time, the command deleted all three and the retries ran. The
// tombstone keeps the record's reference (Response.Reference), which
// the retry's ExpiredError and inspect show.
func TestPurgeKeepsTheRecordsKeyMemory(t *testing.T) {
	ctx := context.Background()
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			table := migrated(t, d)
			db := d.open(t)
			remembering, err := idem.New(d.dialect, idem.WithTable(table), idem.WithKeyMemory(24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			plain, err := idem.New(d.dialect, idem.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			req := func(key string) idem.Request {
				return idem.Request{Scope: "tenant", Key: key, Operation: "POST /charges", Fingerprint: idem.Fingerprint([]byte(key))}
			}
			byRequest := req("by-request")
			byRequest.KeyMemory = 24 * time.Hour
			runs := 0
			do := func(s *idem.Store, r idem.Request) error {
				return idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
					_, err := s.Do(ctx, tx, r, func(context.Context) (idem.Response, error) {
						runs++
						return idem.Response{StatusCode: 201, Reference: "/charges/" + r.Key}, nil
					})
					return err
				})
			}
			for _, c := range []struct {
				s *idem.Store
				r idem.Request
			}{{remembering, req("by-store")}, {plain, byRequest}, {remembering, req("forgotten")}} {
				if err := do(c.s, c.r); err != nil {
					t.Fatal(err)
				}
			}
			// Past their expiry, within their forget time; "forgotten"
			// past both.
			now, ago := "UTC_TIMESTAMP(6)", func(expr, d string) string { return expr + " - INTERVAL " + d + " SECOND" }
			switch d.name {
			case "postgres":
				now, ago = "statement_timestamp()", func(expr, d string) string { return expr + " - interval '" + d + " second'" }
			case "sqlite":
				now, ago = idemtest.SQLiteNow, func(expr, d string) string { return expr + " - " + d + "000000" }
			}
			for key, forget := range map[string]string{"by-store": "-3600", "by-request": "-3600", "forgotten": "60"} {
				if _, err := db.Exec("UPDATE " + table + " SET expires_at = " + ago(now, "1") + ", forget_at = " + ago(now, forget) +
					" WHERE idem_key = '" + key + "'"); err != nil {
					t.Fatal(err)
				}
			}
			r := idemCmd(t, "purge", "--dsn", d.dsn, "--table", table)
			if r.code != 0 || !strings.Contains(r.stdout, "purged 3 records past their expiry from "+table) || !strings.Contains(r.stdout, ": 1 deleted, 2 tombstones\n") {
				t.Fatalf("purge without flags: exit %d, stdout %q, stderr %q; want 1 deleted, 2 tombstones", r.code, r.stdout, r.stderr)
			}
			for _, key := range []string{"by-store", "by-request"} {
				err := do(plain, req(key))
				if expired, ok := errors.AsType[*idem.ExpiredError](err); !ok || expired.Reference != "/charges/"+key {
					t.Errorf("a retry of %s after the purge, through a Store without key memory: %v, want ErrExpired with the reference", key, err)
				}
			}
			r = idemCmd(t, "inspect", "--dsn", d.dsn, "--table", table, "--scope", "tenant", "--key", "by-store")
			if r.code != 0 || !strings.Contains(r.stdout, "reference") || !strings.Contains(r.stdout, "/charges/by-store") {
				t.Errorf("inspect of the tombstone: exit %d, stdout %q, stderr %q; want its reference shown", r.code, r.stdout, r.stderr)
			}
			r = idemCmd(t, "inspect", "--dsn", d.dsn, "--table", table, "--scope", "tenant", "--key", "by-store", "--json")
			if r.code != 0 || !strings.Contains(r.stdout, `"reference":"/charges/by-store"`) && !strings.Contains(r.stdout, `"reference": "/charges/by-store"`) {
				t.Errorf("inspect --json of the tombstone: exit %d, stdout %q; want its reference", r.code, r.stdout)
			}
			if runs != 3 {
				t.Errorf("fn ran %d times, want 3: a retry ran again", runs)
			}
			if err := do(plain, req("forgotten")); err != nil || runs != 4 {
				t.Errorf("past its forget time: %v, fn ran %d times; want the key forgotten and a fresh run", err, runs)
			}
			r = idemCmd(t, "purge", "--dsn", d.dsn, "--table", table, "--key-memory", "1h")
			if r.code != 0 || !strings.Contains(r.stderr, "--key-memory 1h applies only to the completed records of a release before per-record forget times") {
				t.Errorf("purge --key-memory: exit %d, stderr %q; want it to say what the flag still does", r.code, r.stderr)
			}
		})
	}
}

// migrated makes a table of idem on d with the command, writes records
// into it with Do, one per (scope, key), and returns the table; it is
// dropped when the test ends.
func migrated(t *testing.T, d database, records ...idem.Request) string {
	t.Helper()
	ctx := context.Background()
	table := fmt.Sprintf("idem_cmd_%d", time.Now().UnixNano())
	if r := idemCmd(t, "migrate", "--dsn", d.dsn, "--table", table); r.code != 0 {
		t.Fatalf("migrate: exit %d, stderr %q", r.code, r.stderr)
	}
	db := d.open(t)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + table) })
	s, err := idem.New(d.dialect, idem.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range records {
		err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
			_, err := s.Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				return idem.Response{StatusCode: 201, Body: []byte(req.Scope)}, nil
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return table
}

// A response sealed at rest: inspect shows which key sealed it, and with
// the keys file the response itself; after a rotation reseal rewrites the
// records of the old key under the new one, and a Store that holds only
// the new key replays them. A keys file that is not one is exit code 2,
// and the message shows no key.
func TestSealAndReseal(t *testing.T) {
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			k1, k2 := strings.Repeat("11", 32), strings.Repeat("22", 32)
			writeKeys := func(name, text string) string {
				path := filepath.Join(dir, name)
				if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
				return path
			}
			old := writeKeys("old", "# the application's keys\nk1 "+k1+"\n")
			rotated := writeKeys("rotated", "k1 "+k1+"\nk2 "+k2+"\n")
			table := migrated(t, d)
			db := d.open(t)
			keys := func(current string, ids ...string) idem.Sealer {
				m := map[string][]byte{}
				for _, id := range ids {
					m[id] = bytes.Repeat([]byte{map[string]byte{"k1": 0x11, "k2": 0x22}[id]}, 32)
				}
				sealer, err := idem.NewAESGCMSealer(current, m)
				if err != nil {
					t.Fatal(err)
				}
				return sealer
			}
			sealedBy := func(sealer idem.Sealer) *idem.Store {
				s, err := idem.New(d.dialect, idem.WithTable(table), idem.WithSealer(sealer))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			req := idem.Request{Scope: "tenant 1", Key: "card-4242", Operation: "POST /v1/charges", Fingerprint: "f00d"}
			err := idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				_, err := sealedBy(keys("k1", "k1")).Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
					return idem.Response{StatusCode: 201, Body: []byte(`{"last4":"4242"}`)}, nil
				})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			// A record past its expiry no longer replays: reseal skips it.
			gone := idem.Request{Scope: "tenant 1", Key: "card-past", Operation: "POST /v1/charges", Fingerprint: "f00d", Retention: time.Millisecond}
			err = idem.RunTx(ctx, db, nil, func(tx *sql.Tx) error {
				_, err := sealedBy(keys("k1", "k1")).Do(ctx, tx, gone, func(context.Context) (idem.Response, error) {
					return idem.Response{StatusCode: 201}, nil
				})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)

			r := idemCmd(t, "inspect", "--dsn", d.dsn, "--table", table, "--scope", "tenant 1", "--key", "card-4242")
			if r.code != 0 || !strings.Contains(r.stdout, "sealed (key k1)") || strings.Contains(r.stdout, "last4") {
				t.Errorf("inspect of a sealed record without keys: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			r = idemCmd(t, "inspect", "--dsn", d.dsn, "--table", table, "--scope", "tenant 1", "--key", "card-4242", "--keys-file", old)
			if r.code != 0 || !strings.Contains(r.stdout, `{"last4":"4242"}`) {
				t.Errorf("inspect of a sealed record with its key: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
			}

			r = idemCmd(t, "reseal", "--dsn", d.dsn, "--table", table, "--keys-file", rotated)
			if r.code != 0 || !strings.Contains(r.stdout, "resealed 1 record ") {
				t.Fatalf("reseal: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			if rec, err := sealedBy(keys("k2", "k1", "k2")).Inspect(ctx, db, gone.Scope, gone.Key); err != nil || rec == nil || rec.SealedKey != "k1" {
				t.Errorf("the record past its expiry after reseal: %+v, %v; want it left sealed with k1", rec, err)
			}
			r = idemCmd(t, "inspect", "--dsn", d.dsn, "--table", table, "--scope", "tenant 1", "--key", "card-4242", "--json")
			var rec record
			if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || rec.SealedKey != "k2" || rec.Response != nil {
				t.Errorf("inspect --json after reseal: want it sealed with k2 and no response: %v\n%s", err, r.stdout)
			}
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			res, err := sealedBy(keys("k2", "k2")).Do(ctx, tx, req, func(context.Context) (idem.Response, error) {
				t.Error("a resealed record ran fn")
				return idem.Response{}, nil
			})
			if err != nil || !res.Replayed || string(res.Body) != `{"last4":"4242"}` {
				t.Errorf("a replay by a Store holding only k2: %+v, %v", res, err)
			}

			bad := writeKeys("bad", "k1 "+k1+" extra\n")
			r = idemCmd(t, "reseal", "--dsn", d.dsn, "--table", table, "--keys-file", bad)
			if r.code != 2 || !strings.Contains(r.stderr, "line 1") || strings.Contains(r.stderr, k1) {
				t.Errorf("reseal with a bad keys file: exit %d, stderr %q; want 2, the line, and no key", r.code, r.stderr)
			}
			r = idemCmd(t, "reseal", "--dsn", d.dsn, "--table", table)
			if r.code != 2 || !strings.Contains(r.stderr, "--keys-file is required") {
				t.Errorf("reseal without keys: exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
}

// Without --scope, inspect scans every scope for the key and says so; the
// key may be given as the client sent it, "K" or K.
func TestInspectAcrossScopes(t *testing.T) {
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			dsn := d.dsn
			req := func(scope, key string) idem.Request {
				return idem.Request{Scope: scope, Key: key, Operation: "POST /v1/orders", Fingerprint: "f00d"}
			}
			table := migrated(t, d, req("tenant 2", "order-42"), req("tenant 1", "order-42"), req("tenant 1", "order-43"))
			inspect := func(args ...string) result {
				return idemCmd(t, append([]string{"inspect", "--dsn", dsn, "--table", table}, args...)...)
			}
			for _, key := range []string{"order-42", `"order-42"`, ` "order-42" `} {
				r := inspect("--key", key)
				head := fmt.Sprintf("no --scope: scanned every scope of %s for key \"order-42\": 2 records\n", table)
				one, two := strings.Index(r.stdout, `"tenant 1"`), strings.Index(r.stdout, `"tenant 2"`)
				if r.code != 0 || !strings.HasPrefix(r.stdout, head) || one < 0 || two < one || strings.Count(r.stdout, "status") != 2 {
					t.Errorf("inspect --key %s: exit %d, stderr %q; want %q, then tenant 1's record and tenant 2's:\n%s", key, r.code, r.stderr, head, r.stdout)
				}
			}
			if r := inspect("--key", "order-42", "--limit", "1"); r.code != 0 || !strings.Contains(r.stdout, ": 1 record\nmore scopes hold it than --limit 1 shows") ||
				strings.Contains(r.stdout, `"tenant 2"`) {
				t.Errorf("inspect --limit 1: exit %d, stderr %q:\n%s", r.code, r.stderr, r.stdout)
			}
			for limit, want := range map[string]scan{"100": {Key: "order-42", ScannedEveryScope: true}, "1": {Key: "order-42", ScannedEveryScope: true, More: true}} {
				r := inspect("--key", `"order-42"`, "--json", "--limit", limit)
				var got scan
				if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
					t.Fatalf("inspect --json: %v\n%s", err, r.stdout)
				}
				scopes := map[string]string{"100": "tenant 1|tenant 2", "1": "tenant 1"}[limit]
				var gotScopes []string
				for _, rec := range got.Records {
					gotScopes = append(gotScopes, rec.Scope)
				}
				if got.Key != want.Key || got.ScannedEveryScope != want.ScannedEveryScope || got.More != want.More || strings.Join(gotScopes, "|") != scopes {
					t.Errorf("inspect --json --limit %s:\n%s", limit, r.stdout)
				}
			}
			if r := inspect("--key", `"order-42"`, "--scope", "tenant 2"); r.code != 0 || !strings.Contains(r.stdout, `"tenant 2"`) || strings.Contains(r.stdout, "scanned") {
				t.Errorf("inspect --scope 'tenant 2' --key '\"order-42\"': exit %d, stderr %q:\n%s", r.code, r.stderr, r.stdout)
			}
			for args, want := range map[string]string{
				"--scope||--key|order-42":  `no record for key "order-42" in scope "" of ` + table,
				"--key|nothere":            `no record for key "nothere" in any scope of ` + table + ` (no --scope: scanned every scope)`,
				`--key|"nothere"`:          `no record for key "nothere" (read from the sf-string "\"nothere\"") nor "\"nothere\"" (as typed) in any scope`,
				`--scope|tenant 1|--key|x`: `no record for key "x" in scope "tenant 1"`,
			} {
				if r := inspect(strings.Split(args, "|")...); r.code != 1 || !strings.Contains(r.stderr, want) {
					t.Errorf("inspect %s: exit %d, stderr %q; want exit 1 and %q", args, r.code, r.stderr, want)
				}
			}
		})
	}
}

// A table that does not exist, one that is not idem's and one in a schema
// that does not exist: each command says which, and what to do, on every
// database.
func TestTableFaults(t *testing.T) {
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			n, dsn := time.Now().UnixNano(), d.dsn
			if d.name == "sqlite" {
				if r := idemCmd(t, "migrate", "--dsn", dsn); r.code != 0 { // the file
					t.Fatalf("migrate: %q", r.stderr)
				}
			}
			db := d.open(t)
			charges := fmt.Sprintf("charges_%d", n)
			if _, err := db.Exec("CREATE TABLE " + charges + " (id VARCHAR(40) NOT NULL, created_at VARCHAR(40) NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + charges) })
			missing, nowhere := fmt.Sprintf("missing_%d", n), fmt.Sprintf("nosuchschema_%d.keys", n)
			for _, c := range []struct {
				args []string
				want []string
			}{
				{[]string{"purge", "--table", missing}, []string{"table " + missing + " does not exist", "idem migrate --table " + missing}},
				{[]string{"stats", "--table", missing}, []string{"table " + missing + " does not exist", "idem migrate --table " + missing}},
				{[]string{"inspect", "--table", missing, "--key", "k"}, []string{"table " + missing + " does not exist", "idem migrate --table " + missing}},
				{[]string{"purge", "--table", charges}, []string{"table " + charges + " is not idem's", "will not help"}},
				{[]string{"inspect", "--table", charges, "--key", "k", "--scope", "s"}, []string{"table " + charges + " is not idem's"}},
				{[]string{"migrate", "--table", charges}, []string{"table " + charges + " is not idem's", "Migrate changed nothing"}},
				{[]string{"migrate", "--table", nowhere}, []string{"the schema of table " + nowhere + " does not exist", "create it first"}},
			} {
				r := idemCmd(t, append(c.args, "--dsn", dsn)...)
				if r.code != 1 || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("%s: exit %d, stderr %q; want exit 1 and one line", strings.Join(c.args, " "), r.code, r.stderr)
				}
				for _, w := range c.want {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("%s: stderr %q does not say %q", strings.Join(c.args, " "), r.stderr, w)
					}
				}
				for _, bad := range []string{"run it again", "may create and alter", "after deleting"} {
					if strings.Contains(r.stderr, bad) {
						t.Errorf("%s: stderr %q says %q", strings.Join(c.args, " "), r.stderr, bad)
					}
				}
			}
		})
	}
}

// idem bench runs every path, the floors and both storms on every
// database, briefly.
func TestBench(t *testing.T) {
	for _, d := range databases(t) {
		t.Run(d.name, func(t *testing.T) {
			r := idemCmd(t, "bench", "--dsn", d.dsn, "--rounds", "1", "--duration", "30ms", "--concurrency", "2", "--hot", "2", "--storms", "1")
			if r.code != 0 {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			for _, want := range []string{"bare ", "floor ", "fresh ", "read ", "replay ", "claim ", "hot ", "ratio to floor", "tx ", "claim, poll 20ms ", "Each ratio is the median over 1 round of the ratio of paired runs"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("output lacks %q:\n%s", want, r.stdout)
				}
			}
		})
	}
}

// A wrong password is one line on stderr and exit code 2, and the line
// does not show it.
func TestWrongPassword(t *testing.T) {
	cfg, err := mysql.ParseDSN(testdb.MySQL.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	r := idemCmd(t, "stats", "--dsn", fmt.Sprintf("mysql://%s:wrong-password@%s/%s", cfg.User, cfg.Addr, cfg.DBName))
	if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); r.code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "idem: ") {
		t.Errorf("exit %d, stderr %q; want exit 2 and one line", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "wrong-password") {
		t.Errorf("stderr shows the password: %q", r.stderr)
	}
}

// record is what the tests read of inspect --json's record.
type record struct {
	Scope      string    `json:"scope"`
	Status     string    `json:"status"`
	Token      int64     `json:"token"`
	LeaseUntil time.Time `json:"lease_until"`
	Now        time.Time `json:"now"`
	AgeSeconds float64   `json:"age_seconds"`
	SealedKey  string    `json:"sealed_key"`
	Response   *struct {
		Status int     `json:"status"`
		Body   *string `json:"body"`
	} `json:"response"`
}

// scan is what the tests read of inspect --json without --scope.
type scan struct {
	Key               string   `json:"key"`
	ScannedEveryScope bool     `json:"scanned_every_scope"`
	More              bool     `json:"more"`
	Records           []record `json:"records"`
}

// stats is what the tests read of stats --json.
type stats struct {
	Total      int64            `json:"total"`
	ByStatus   map[string]int64 `json:"by_status"`
	Oldest     *time.Time       `json:"oldest"`
	PastExpiry int64            `json:"past_expiry"`
	TableBytes *int64           `json:"table_bytes"`
}
