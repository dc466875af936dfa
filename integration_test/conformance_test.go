// Package integration_test runs idem's conformance suite
// (internal/conformance) against every dialect and driver, on real
// servers: see DEVELOPERS.md for the databases it needs.
package integration_test

import (
	"testing"

	"github.com/idemkit/idem/idemtest/containers"
	"github.com/idemkit/idem/integration_test/internal/conformance"
)

// TestMain starts a container for a server that is neither set nor
// running, where Docker runs, and removes it when the tests end.
func TestMain(m *testing.M) { containers.Main(m) }

// TestConformance is the whole suite: go test -run
// 'TestConformance/TestStormRunsOnce' ./integration_test runs one test.
func TestConformance(t *testing.T) { conformance.Run(t) }
