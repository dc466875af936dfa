package bench

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// server is a database server the package's tests run on. Its DSN comes
// from its variable only: make test (scripts/test.sh) finds each server
// (with idemtest/cmd/testdb) and exports the variables of those it found.
type server struct{ name, env string }

var (
	postgresServer = &server{"PostgreSQL", "IDEM_TEST_POSTGRES_DSN"}
	mysqlServer    = &server{"MySQL", "IDEM_TEST_MYSQL_DSN"}
	mariadbServer  = &server{"MariaDB", "IDEM_TEST_MARIADB_DSN"}
	tidbServer     = &server{"TiDB", "IDEM_TEST_TIDB_DSN"}
)

// DSN returns the server's DSN, or ends tb: skipped when its variable is
// unset, failed under IDEM_TEST_REQUIRE=1 (as in CI).
func (s *server) DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(s.env)
	if dsn == "" {
		why := fmt.Sprintf("%s is unset: run make test, which finds the %s server and sets it, or set it to the server's DSN", s.env, s.name)
		if os.Getenv("IDEM_TEST_REQUIRE") == "1" {
			tb.Fatal("IDEM_TEST_REQUIRE=1 and " + why)
		}
		tb.Skip(why)
	}
	return dsn
}

// digits returns a FROM list of tables of the digits 0..9 and a sum over
// them that counts from 0 to at least n-1, for a set-based INSERT on the
// MySQL family, which has no generate_series.
func digits(n int) (from, sum string) {
	var tables, terms []string
	for place := 1; len(tables) == 0 || place < n; place *= 10 {
		d := fmt.Sprintf("d%d", len(tables))
		tables = append(tables, "(SELECT 0 AS v UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) "+d)
		terms = append(terms, fmt.Sprintf("%d*%s.v", place, d))
	}
	return strings.Join(tables, ", "), strings.Join(terms, " + ")
}
