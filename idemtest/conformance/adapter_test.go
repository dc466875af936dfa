package conformance_test

import (
	"testing"

	"github.com/idemkit/idem/idemtest/conformance"
)

// The whole suite passes on SQLite through an adapter written outside
// idem (example_test.go): what a third party's adapter runs. The tests of
// what database/sql alone has (sqlx, a *sql.Conn) skip, saying so: the
// suite reaches the adapter through its Runner only.
func TestThirdPartyAdapter(t *testing.T) {
	conformance.Exercise(t, adapterTarget(t.TempDir()))
}
