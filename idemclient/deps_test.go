package idemclient

import (
	"os/exec"
	"strings"
	"testing"
)

// A client must not link database code: neither database/sql, nor a
// driver, nor package idem itself (which imports database/sql).
func TestNoDatabaseImport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "database/sql" || pkg == "github.com/idemkit/idem" || strings.Contains(pkg, "sqlite") ||
			strings.HasPrefix(pkg, "database/sql/") || strings.HasPrefix(pkg, "github.com/lib/pq") ||
			strings.HasPrefix(pkg, "github.com/jackc/pgx") || strings.HasPrefix(pkg, "github.com/go-sql-driver/mysql") {
			t.Fatalf("package idemclient depends on %s", pkg)
		}
	}
}
