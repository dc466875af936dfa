// Package integration_test runs idem's conformance suite (package
// idemtest/conformance) on every dialect and driver, on real servers:
// its targets are in targets_test.go; see DEVELOPERS.md for the
// databases it needs.
package integration_test

import (
	"testing"

	"github.com/idemkit/idem/idemtest/conformance"
	"github.com/idemkit/idem/idemtest/containers"
)

// TestMain starts a container for a server that is neither set nor
// running, where Docker runs, and removes it when the tests end.
func TestMain(m *testing.M) { containers.Main(m) }

// TestConformance is the whole suite on every target: go test -run
// 'TestConformance/TestStormRunsOnce' . runs one test, and
// 'TestConformance/.*/sqlite' every test on one target.
func TestConformance(t *testing.T) {
	sqliteDir = t.TempDir()
	conformance.Exercise(t, targets...)
}
