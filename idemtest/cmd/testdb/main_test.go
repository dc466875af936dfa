package main

import (
	"os/exec"
	"testing"

	"github.com/idemkit/idem/idemtest/testdb"
)

// The line on stderr names each missing server once, grouped by the step
// that starts it, in testdb.Servers' order.
func TestSummary(t *testing.T) {
	got := summary([]*testdb.Server{testdb.TiDB, testdb.PgBouncer, testdb.PgBouncerSingle})
	want := "TiDB (run scripts/tidb.sh start), PgBouncer and PgBouncer with a pool of one server connection (run scripts/pgbouncer.sh start)"
	if got != want {
		t.Errorf("summary:\n%s\nwant\n%s", got, want)
	}
}

// A DSN is quoted for a POSIX shell, whatever it holds.
func TestQuote(t *testing.T) {
	for _, dsn := range []string{"postgres://u@h/db?sslmode=disable", "user:pa'ss$word@tcp(h)/db", `a"b\c`} {
		out, err := exec.Command("sh", "-c", "printf %s "+quote(dsn)).Output()
		if err != nil || string(out) != dsn {
			t.Errorf("%s quoted as %s reads back %q (%v)", dsn, quote(dsn), out, err)
		}
	}
}
