// Command testdb finds the database servers that the tests of idem's
// modules run on, as package testdb finds them, once for a script that
// runs many test processes (idem's scripts/test.sh):
//
//	eval "$(go run ./cmd/testdb)"
//
// For each server of testdb.Servers whose DSN is set in its variable, or
// that answers at its usual address on a development machine, it prints
// a line to export the variable, the DSN shell-quoted:
//
//	export IDEM_TEST_POSTGRES_DSN='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It looks at variables and addresses only: it starts no Docker
// container, so it leaves nothing running when it exits (a test process
// under idemtest/containers, as integration_test's are, still starts a
// container for a server that is missing here, and removes it when it
// ends). When some server is missing it
// prints one line on stderr that names each and how to start it:
//
//	testdb: skipped, no server: TiDB (run scripts/tidb.sh start)
//
// and exits 0, or 1 under IDEM_TEST_REQUIRE=1, where the tests that need
// a missing server fail.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/idemkit/idem/idemtest/testdb"
)

func main() {
	var missing []*testdb.Server
	for _, s := range testdb.Servers {
		dsn, _ := s.FindRunning()
		if dsn == "" {
			missing = append(missing, s)
			continue
		}
		fmt.Printf("export %s=%s\n", s.Env, quote(dsn))
	}
	if len(missing) == 0 {
		return
	}
	fmt.Fprintln(os.Stderr, "testdb: skipped, no server: "+summary(missing))
	if testdb.Required {
		os.Exit(1)
	}
}

// summary names the missing servers, each group that one step starts
// together followed by that step: "TiDB (run scripts/tidb.sh start),
// PgBouncer and ... (run scripts/pgbouncer.sh start)".
func summary(missing []*testdb.Server) string {
	var (
		starts []string
		names  = map[string][]string{}
	)
	for _, s := range missing {
		if !slices.Contains(starts, s.Start) {
			starts = append(starts, s.Start)
		}
		names[s.Start] = append(names[s.Start], s.Name)
	}
	parts := make([]string, len(starts))
	for i, start := range starts {
		parts[i] = strings.Join(names[start], " and ") + " (" + start + ")"
	}
	return strings.Join(parts, ", ")
}

// quote is s in single quotes, for a POSIX shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
