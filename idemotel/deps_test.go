package idemotel_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A program that imports idem or idemhttp, and not idemotel, must not link
// OpenTelemetry; and idemotel links its API only, so that the application
// chooses the SDK (and its version) and pays for no second one.
func TestDeps(t *testing.T) {
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{"github.com/idemkit/idem", []string{"go.opentelemetry.io/"}},
		{"github.com/idemkit/idem/idemhttp", []string{"go.opentelemetry.io/"}},
		{"github.com/idemkit/idem/idemotel", []string{"go.opentelemetry.io/otel/sdk"}},
	} {
		out, err := exec.Command("go", "list", "-deps", c.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c.pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) == 0 {
			t.Fatalf("go list -deps %s listed nothing", c.pkg)
		}
		for _, dep := range deps {
			for _, f := range c.forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("package %s depends on %s", c.pkg, dep)
				}
			}
		}
	}
}
