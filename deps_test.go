package idem

import (
	"os/exec"
	"strings"
	"testing"
)

// drivers are the module path prefixes of the database drivers idem
// supports.
var drivers = []string{"modernc.org/", "github.com/go-sql-driver/mysql", "github.com/lib/pq", "github.com/jackc/pgx"}

// deps is every package pkg links, as go list -deps reports them.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// The root package and idemhttp must link no database driver: an import
// would link it into every program that uses idem, and register its driver
// name ("mysql", "postgres", "pgx", "sqlite") there, which panics beside
// another driver, or a test's mock, that registers the same name. The
// dialects read driver errors by their methods or by reflection instead.
func TestNoDriverImport(t *testing.T) {
	for _, pkg := range []string{".", "./idemhttp"} {
		for _, dep := range deps(t, pkg) {
			for _, d := range drivers {
				if strings.HasPrefix(dep, d) {
					t.Errorf("package %s depends on %s", pkg, dep)
				}
			}
		}
	}
}

// Each package links only the layers below it: idempgx, pgx's adapter,
// links no layer that serves requests (idemhttp, idemgrpc,
// idemwatermill), so that a service on pgx without HTTP links none of
// them; the root package and the serving core idemserve, which every
// layer and driver share, link no pgx.
func TestLayers(t *testing.T) {
	for pkg, forbidden := range map[string][]string{
		"./idempgx":   {"github.com/idemkit/idem/idemhttp", "github.com/idemkit/idem/contrib/idemgrpc", "github.com/idemkit/idem/contrib/idemwatermill", "google.golang.org/grpc"},
		".":           {"github.com/jackc/pgx"},
		"./idemserve": {"github.com/jackc/pgx"},
	} {
		for _, dep := range deps(t, pkg) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("package %s depends on %s", pkg, dep)
				}
			}
		}
	}
}
