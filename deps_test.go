package idem

import (
	"os/exec"
	"strings"
	"testing"
)

// The root package must not import a SQLite driver: that would link SQLite
// into every program that uses idem and register the "sqlite" driver name
// there, which panics beside another driver of that name.
func TestNoSQLiteDriverImport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "modernc.org/") {
			t.Fatalf("package idem depends on %s", pkg)
		}
	}
}
