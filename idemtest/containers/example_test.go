package containers_test

import (
	"os"
	"testing"

	"github.com/idemkit/idem/idemtest/containers"
	"github.com/idemkit/idem/idemtest/testdb"
)

// A package's TestMain that needs PostgreSQL for its runnable examples
// (Main sets IDEM_TEST_POSTGRES_DSN for them) and removes files of its own
// after the tests: Run starts a container where no server is set or
// running and Docker answers, and removes it before it returns.
func ExampleRun() {
	testMain := func(m *testing.M) {
		dir, err := os.MkdirTemp("", "mytests-")
		if err != nil {
			os.Exit(1)
		}
		code := containers.Run(m, testdb.Postgres)
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}
	_ = testMain
}
