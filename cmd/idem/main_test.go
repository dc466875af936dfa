package main

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
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dburl"
	"github.com/idemkit/idem/internal/testdb"
)

// bin is the idem binary, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "idem")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func idemCmd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
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

// databases are the DSNs, in the command's own format, of every database
// the tests run on: SQLite always, and each server package testdb finds
// (a missing one fails the test under IDEM_TEST_REQUIRE=1).
func databases(t *testing.T) map[string]string {
	dbs := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
	for name, s := range map[string]*testdb.Server{"postgres": testdb.Postgres, "mysql": testdb.MySQL, "mariadb": testdb.MariaDB, "tidb": testdb.TiDB} {
		dsn, why := s.Find()
		switch {
		case dsn != "" && s.Driver == "mysql":
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				t.Fatalf("%s: %v", s.Env, err)
			}
			dbs[name] = fmt.Sprintf("%s://%s:%s@%s/%s", name, cfg.User, cfg.Passwd, cfg.Addr, cfg.DBName)
		case dsn != "":
			dbs[name] = dsn
		case testdb.Required:
			t.Errorf("IDEM_TEST_REQUIRE=1 and %s", why)
		default:
			t.Logf("not running on %s: %s", s.Name, why)
		}
	}
	return dbs
}

// scenarioRows are the rows of the demo's closing table.
func scenarioRows(t *testing.T, out string) []string {
	t.Helper()
	_, table, ok := strings.Cut(out, "\nSCENARIO ")
	if !ok {
		t.Fatalf("no closing table in the demo's output:\n%s", out)
	}
	header, table, _ := strings.Cut(table, "\n")
	for _, col := range []string{"WITH IDEM", "NAIVE CACHE", "IDEM OK"} {
		if !strings.Contains(header, col) {
			t.Errorf("table header %q lacks %q", header, col)
		}
	}
	rows, _, _ := strings.Cut(table, "\n\n")
	return strings.Split(rows, "\n")
}

// naiveCharges reads the naive column of a row of the demo's table.
var naiveCharges = regexp.MustCompile(` (\d+) charges +yes$`)

// The newcomer's first command: exit code 0, and a table that shows one
// charge with idem and more without, for every scenario; each scenario
// says what in idem held; every line fits 80 columns.
func TestDemo(t *testing.T) {
	for name, dsn := range databases(t) {
		t.Run(name, func(t *testing.T) {
			args := []string{"demo"}
			if name != "sqlite" {
				args = append(args, "--dsn", dsn)
			}
			testDemo(t, idemCmd(t, args...), 16)
		})
	}
	t.Run("burst 2", func(t *testing.T) { testDemo(t, idemCmd(t, "demo", "--burst", "2"), 2) })
}

// testDemo checks the output of a demo of burst concurrent retries.
func testDemo(t *testing.T, r result, burst int) {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit code %d, stderr %q; stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	rows := scenarioRows(t, r.stdout)
	if len(rows) != len((&demo{}).scenarios()) {
		t.Fatalf("%d rows in the table, want one per scenario:\n%s", len(rows), r.stdout)
	}
	for _, row := range rows {
		if !strings.HasSuffix(row, " yes") || strings.Count(row, "1 charge") < 1 {
			t.Errorf("row %q: want one charge with idem and IDEM OK yes", row)
		}
		// The naive column is measured: expect duplicates (or the
		// wrong receipt), not an exact number.
		if m := naiveCharges.FindStringSubmatch(row); m != nil {
			if n, _ := strconv.Atoi(m[1]); n < 2 {
				t.Errorf("row %q: the naive cache charged %d times", row, n)
			}
		} else if !strings.Contains(row, "wrong receipt") {
			t.Errorf("row %q: no naive outcome", row)
		}
	}
	if want := fmt.Sprintf("1 charge, %s ", plural(burst-1, "replay")); !strings.HasPrefix(rows[0], fmt.Sprintf("burst: %d concurrent retries", burst)) || !strings.Contains(rows[0], want) {
		t.Errorf("burst row %q: want %q", rows[0], want)
	}
	lines := strings.Split(r.stdout, "\n")
	progress := 0
	for i, line := range lines {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns wide, more than 80: %q", i+1, n, line)
		}
		if strings.Contains(line, "] ") {
			progress++
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "      held by ") {
				t.Errorf("progress line %q is not followed by what held", line)
			}
		}
		if regexp.MustCompile(`\b1 [a-z]+s\b`).MatchString(line) {
			t.Errorf("line %q: a plural after 1", line)
		}
	}
	if progress != len(rows) {
		t.Errorf("want one progress line per scenario:\n%s", r.stdout)
	}
}

// migrate, inspect, stats and purge, in text and JSON, on every database.
func TestOperate(t *testing.T) {
	for name, dsn := range databases(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tgt, err := parseDSN(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			table := fmt.Sprintf("idem_cmd_%d", time.Now().UnixNano())
			r := idemCmd(t, "migrate", "--dsn", dsn, "--table", table)
			if r.code != 0 || !strings.Contains(r.stdout, table) {
				t.Fatalf("migrate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			db, err := connect(ctx, tgt)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			defer db.Exec("DROP TABLE IF EXISTS " + table)

			s, err := idem.New(tgt.Dialect, idem.WithTable(table))
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
			var rec recordJSON
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
			var claim recordJSON
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
			for _, want := range []string{"records 2", "completed 1", "released 1", "expired 0 (past retention 24h,", "table size"} {
				if !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), want) {
					t.Errorf("stats output lacks %q:\n%s", want, r.stdout)
				}
			}
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json")
			var st statsJSON
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
				t.Fatalf("stats --json: %v\n%s", err, r.stdout)
			}
			if st.Total != 2 || st.ByStatus["completed"] != 1 || st.ByStatus["released"] != 1 || st.Oldest == nil || st.Expired != 0 {
				t.Errorf("stats --json: %s", r.stdout)
			}
			if n, ok := st.ByStatus["processing"]; !ok || n != 0 {
				t.Errorf("stats --json: want every status, processing at 0: %s", r.stdout)
			}
			if name != "mysql" && name != "mariadb" && name != "tidb" && (st.TableBytes == nil || *st.TableBytes <= 0) { // InnoDB's and TiDB's figures lag
				t.Errorf("stats --json: no table size: %s", r.stdout)
			}

			time.Sleep(20 * time.Millisecond)
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json", "--retention", "10ms")
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Expired != 2 {
				t.Errorf("stats --retention 10ms: want 2 expired: %s", r.stdout)
			}
			r = idemCmd(t, "purge", "--dsn", dsn, "--table", table, "--retention", "10ms", "--batch", "1", "--workers", "2")
			if r.code != 0 || !strings.Contains(r.stdout, "batch 2: deleted 1 (2 so far)") || !strings.Contains(r.stdout, "purged 2 records") {
				t.Errorf("purge: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
			r = idemCmd(t, "stats", "--dsn", dsn, "--table", table, "--json")
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Total != 0 {
				t.Errorf("stats after purge: %s", r.stdout)
			}
		})
	}
}

// migrated makes a table of idem on dsn with the command, writes records
// into it with Do, one per (scope, key), and returns the table; it is
// dropped when the test ends.
func migrated(t *testing.T, dsn string, records ...idem.Request) string {
	t.Helper()
	ctx := context.Background()
	table := fmt.Sprintf("idem_cmd_%d", time.Now().UnixNano())
	if r := idemCmd(t, "migrate", "--dsn", dsn, "--table", table); r.code != 0 {
		t.Fatalf("migrate: exit %d, stderr %q", r.code, r.stderr)
	}
	db, tgt := open(t, dsn)
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS " + table) })
	s, err := idem.New(tgt.Dialect, idem.WithTable(table))
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

// open connects to dsn as the command does; the pool is closed when the
// test ends.
func open(t *testing.T, dsn string) (*sql.DB, dburl.Target) {
	t.Helper()
	tgt, err := parseDSN(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := connect(context.Background(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, tgt
}

// Without --scope, inspect scans every scope for the key and says so; the
// key may be given as the client sent it, "K" or K.
func TestInspectAcrossScopes(t *testing.T) {
	for name, dsn := range databases(t) {
		t.Run(name, func(t *testing.T) {
			req := func(scope, key string) idem.Request {
				return idem.Request{Scope: scope, Key: key, Operation: "POST /v1/orders", Fingerprint: "f00d"}
			}
			table := migrated(t, dsn, req("tenant 2", "order-42"), req("tenant 1", "order-42"), req("tenant 1", "order-43"))
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
			for limit, want := range map[string]scanJSON{"100": {Key: "order-42", ScannedEveryScope: true}, "1": {Key: "order-42", ScannedEveryScope: true, More: true}} {
				r := inspect("--key", `"order-42"`, "--json", "--limit", limit)
				var got scanJSON
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
	for name, dsn := range databases(t) {
		t.Run(name, func(t *testing.T) {
			n := time.Now().UnixNano()
			db, _ := open(t, dsn)
			if name == "sqlite" {
				if r := idemCmd(t, "migrate", "--dsn", dsn); r.code != 0 { // the file
					t.Fatalf("migrate: %q", r.stderr)
				}
			}
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

// Bad input is one line on stderr and exit code 2, never a stack trace.
func TestBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.db")
	cases := map[string][]string{
		"unknown scheme":      {"stats", "--dsn", "oracle://scott@tiger/db"},
		"no scheme":           {"stats", "--dsn", "host=127.0.0.1 user=postgres password=wrong-password"},
		"no dsn":              {"stats"},
		"unreachable server":  {"stats", "--dsn", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"},
		"unreachable mysql":   {"stats", "--dsn", "mysql://root@127.0.0.1:1/test"},
		"missing sqlite":      {"inspect", "--dsn", "sqlite:" + missing, "--key", "k"},
		"in-memory sqlite":    {"migrate", "--dsn", "sqlite::memory:"},
		"bad table":           {"migrate", "--dsn", "sqlite:" + missing, "--table", "x; DROP TABLE y"},
		"unknown command":     {"frobnicate"},
		"bad batch":           {"purge", "--dsn", "sqlite:" + missing, "--batch", "0"},
		"bad workers":         {"purge", "--dsn", "sqlite:" + missing, "--workers", "0"},
		"inspect without key": {"inspect", "--dsn", "sqlite:" + missing},
		"stray argument":      {"stats", "extra"},
	}
	if dsn, _ := testdb.MySQL.Find(); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cases["wrong password"] = []string{"stats", "--dsn", fmt.Sprintf("mysql://%s:wrong-password@%s/%s", cfg.User, cfg.Addr, cfg.DBName)}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			r := idemCmd(t, args...)
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if r.code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "idem: ") || strings.Contains(r.stderr, "goroutine") {
				t.Errorf("exit %d, stderr %q; want exit 2 and one line", r.code, r.stderr)
			}
			if strings.Contains(r.stderr, "wrong-password") {
				t.Errorf("stderr shows the password: %q", r.stderr)
			}
		})
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("a failed command left %s behind", missing)
	}
}

// Every subcommand answers --help with its usage and exit code 0.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		r := idemCmd(t, c.name, "--help")
		if r.code != 0 || !strings.Contains(r.stderr, "Usage: idem "+c.name) {
			t.Errorf("%s --help: exit %d, stderr %q", c.name, r.code, r.stderr)
		}
	}
	r := idemCmd(t, "help")
	for _, c := range commands {
		if r.code != 0 || !strings.Contains(r.stdout, c.name) {
			t.Errorf("help: exit %d, lacks %s:\n%s", r.code, c.name, r.stdout)
		}
	}
}
