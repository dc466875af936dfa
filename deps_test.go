package idem

import (
	"os/exec"
	"strings"
	"testing"
)

// drivers are the module path prefixes of the database drivers idem
// supports.
var drivers = []string{"modernc.org/", "github.com/go-sql-driver/mysql", "github.com/lib/pq", "github.com/jackc/pgx"}

// The root package and idemhttp must link no database driver: an import
// would link it into every program that uses idem, and register its driver
// name ("mysql", "postgres", "pgx", "sqlite") there, which panics beside
// another driver, or a test's mock, that registers the same name. The
// dialects read driver errors by their methods or by reflection instead.
func TestNoDriverImport(t *testing.T) {
	for _, pkg := range []string{".", "./idemhttp"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, d := range drivers {
				if strings.HasPrefix(dep, d) {
					t.Errorf("package %s depends on %s", pkg, dep)
				}
			}
		}
	}
}
