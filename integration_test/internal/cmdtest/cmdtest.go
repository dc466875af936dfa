// Package cmdtest runs the repository's commands on the database servers,
// as their users do: a binary built from the root module, given a DSN in
// the form of package dburl (the idem command's).
package cmdtest

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/idemtest/containers"
	"github.com/idemkit/idem/idemtest/testdb"
)

var (
	dir    string
	builds sync.Map // import path -> func() (string, error)
)

// Main runs a package's tests, from its TestMain, then removes the
// binaries they built and the containers they started.
func Main(m *testing.M) {
	d, err := os.MkdirTemp("", "idem-cmdtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir = d
	code := containers.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// Binary returns the command of the root module at import path pkg, built
// once per test binary with the root module's go.mod (as go install
// builds it).
func Binary(t *testing.T, pkg string) string {
	t.Helper()
	build, _ := builds.LoadOrStore(pkg, sync.OnceValues(func() (string, error) {
		bin := filepath.Join(dir, path.Base(pkg))
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Dir = root()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		return bin, nil
	}))
	bin, err := build.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// root is the root module's directory: the parent of integration_test,
// which holds the package whose tests run.
func root() string {
	wd, err := os.Getwd()
	if err != nil {
		return ".."
	}
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if filepath.Base(d) == "integration_test" {
			return filepath.Dir(d)
		}
	}
	return ".."
}

// DSN is dsn, a DSN of server's in its Go driver's format, in the form
// the commands take: a PostgreSQL URL as it is, a go-sql-driver/mysql
// DSN as scheme://user:password@host:port/database, scheme being mysql,
// mariadb or tidb (the dialect the command then runs).
func DSN(t *testing.T, scheme string, server *testdb.Server, dsn string) string {
	t.Helper()
	if server.Driver != "mysql" {
		return dsn
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("%s: %v", server.Env, err)
	}
	return scheme + "://" + url.UserPassword(cfg.User, cfg.Passwd).String() + "@" + cfg.Addr + "/" + cfg.DBName
}
