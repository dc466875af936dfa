// Package testdb finds the database servers that tests of idem run on,
// the same way for every package and module: idem's conformance suite
// and integration tests, the integrations under contrib/, and the tests
// of an adapter or ORM of anyone else's that runs package idemtest's
// checks.
//
// A server's DSN comes from its environment variable (IDEM_TEST_POSTGRES_DSN,
// ...). When that is unset, the server of a development machine
// (idem's DEVELOPERS.md) is tried at its usual address; when nothing
// answers there and the tests run under [Run] with a [Starter], it
// starts one (module idemtest/containers starts a Docker container, where
// the server has an image) and removes it when the tests end.
// Otherwise the tests that need the server are skipped with a message
// that says how to get one, or fail when IDEM_TEST_REQUIRE=1, as in CI.
// A DSN set in the environment that does not answer always fails: a
// mistyped DSN must not pass for a server that is not there.
//
// Package testdb imports database drivers only: the container fallback
// lives in a module of its own, idemtest/containers, so that a module
// whose tests use testdb (contrib's, an adapter's) puts neither
// dockertest nor Docker's client in its users' go.sum.
//
// The command idemtest/cmd/testdb resolves every server as the tests do,
// but for the containers, and prints the variables to export, so that a
// script finds each server once for all the test processes it runs.
package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the MySQL family's driver
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL's
)

// Server is a database server the tests reach.
type Server struct {
	// Name is how messages call it.
	Name string
	// Env is the variable that names its DSN.
	Env string
	// Local is its DSN on a development machine, tried when Env is unset.
	Local string
	// Driver is the database/sql driver that pings it.
	Driver string
	// Image is the Docker image a [Starter] starts when Env is unset and
	// nothing answers at Local; "" when it has none.
	Image string
	// How says how to get the server, for the message of a test that
	// skips for want of it, and Start, shorter, for a line that names
	// every missing server.
	How, Start string
	// Cluster reports a server of several nodes: its DSN is the DSN of
	// each node, comma-separated ([Nodes] splits it), and it answers when
	// every node does.
	Cluster bool

	once   sync.Once
	dsn    string
	reason string // why there is no DSN
}

// The servers of the suite. MySQL and MariaDB are one server on a
// development machine (MariaDB), set apart so that CI can point each at
// its own.
var (
	Postgres = &Server{Name: "PostgreSQL", Env: "IDEM_TEST_POSTGRES_DSN", Driver: "pgx",
		Local: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", Image: "postgres:16",
		How: "start PostgreSQL (DEVELOPERS.md)", Start: "start PostgreSQL as DEVELOPERS.md says"}
	MySQL = &Server{Name: "MySQL", Env: "IDEM_TEST_MYSQL_DSN", Driver: "mysql",
		Local: "root@tcp(127.0.0.1:3306)/test", Image: "mysql:8.4",
		How: "start MySQL or MariaDB (DEVELOPERS.md)", Start: "start MySQL or MariaDB as DEVELOPERS.md says"}
	MariaDB = &Server{Name: "MariaDB", Env: "IDEM_TEST_MARIADB_DSN", Driver: "mysql",
		Local: "root@tcp(127.0.0.1:3306)/test", Image: "mariadb:10.11",
		How: "start MariaDB (DEVELOPERS.md)", Start: "start MariaDB as DEVELOPERS.md says"}
	TiDB = &Server{Name: "TiDB", Env: "IDEM_TEST_TIDB_DSN", Driver: "mysql",
		Local: "root@tcp(127.0.0.1:4000)/test",
		How:   "run scripts/tidb.sh start (it builds TiDB once, about 12 minutes)", Start: "run scripts/tidb.sh start"}
	// PgBouncer is PostgreSQL behind PgBouncer in transaction pooling
	// mode, and PgBouncerSingle the same database through a pool of one
	// server connection, so that each transaction runs on the server
	// session the one before it used (scripts/pgbouncer.sh configures
	// both).
	PgBouncer = &Server{Name: "PgBouncer", Env: "IDEM_TEST_PGBOUNCER_DSN", Driver: "pgx",
		Local: "postgres://postgres@127.0.0.1:6432/test?sslmode=disable",
		How:   "run scripts/pgbouncer.sh start (PgBouncer in transaction mode in front of PostgreSQL; apt-get install pgbouncer first)",
		Start: "run scripts/pgbouncer.sh start"}
	PgBouncerSingle = &Server{Name: "PgBouncer with a pool of one server connection", Env: "IDEM_TEST_PGBOUNCER_SINGLE_DSN", Driver: "pgx",
		Local: "postgres://postgres@127.0.0.1:6432/test_single?sslmode=disable",
		How:   "run scripts/pgbouncer.sh start (its database test_single has pool_size=1)", Start: "run scripts/pgbouncer.sh start"}
)

// Galera is a MariaDB Galera cluster of three nodes (multi-primary),
// which scripts/galera.sh runs on loopback; its DSN lists the nodes'.
var Galera = &Server{Name: "Galera", Env: "IDEM_TEST_GALERA_DSNS", Driver: "mysql", Cluster: true,
	Local: "root@tcp(127.0.0.1:3311)/test,root@tcp(127.0.0.1:3312)/test,root@tcp(127.0.0.1:3313)/test",
	How:   "run scripts/galera.sh start (a three-node MariaDB Galera cluster on 127.0.0.1:3311-3313; apt-get install -y rsync galera-4 first)",
	Start: "run scripts/galera.sh start"}

// Servers are all the servers above, in the order a summary names them.
var Servers = []*Server{Postgres, MySQL, MariaDB, TiDB, PgBouncer, PgBouncerSingle, Galera}

// Nodes is the DSN of each node of a cluster's DSN (Cluster): the
// comma-separated DSNs, each trimmed of spaces. A server's DSN that is
// not a cluster's is its one node.
func Nodes(dsn string) []string {
	var nodes []string
	for _, n := range strings.Split(dsn, ",") {
		if n = strings.TrimSpace(n); n != "" {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// Required reports IDEM_TEST_REQUIRE=1: a missing server fails the tests
// that need it instead of skipping them.
var Required = os.Getenv("IDEM_TEST_REQUIRE") == "1"

// DSN returns the server's DSN, or ends t: skipped when there is no
// server, failed under IDEM_TEST_REQUIRE=1 or when the DSN set in Env
// does not answer.
func (s *Server) DSN(t testing.TB) string {
	t.Helper()
	dsn, why := s.Find()
	if dsn == "" {
		if Required {
			t.Fatalf("IDEM_TEST_REQUIRE=1 and %s", why)
		}
		t.Skip(why)
	}
	return dsn
}

// Find returns the server's DSN, or "" and why there is none, for a test
// that runs on each server it finds (and fails under IDEM_TEST_REQUIRE=1
// for one it does not).
func (s *Server) Find() (dsn, why string) {
	s.resolve()
	if s.dsn == "" {
		return "", s.reason
	}
	return s.dsn, ""
}

// FindRunning is Find without the container: the DSN set in Env, else
// Local if a server answers there, else "" and why not. It starts
// nothing, so it leaves nothing to stop (idemtest/cmd/testdb uses it).
func (s *Server) FindRunning() (dsn, why string) {
	if dsn := os.Getenv(s.Env); dsn != "" {
		return dsn, "" // whether it answers is the test's to find out
	}
	if err := s.ping(s.Local); err != nil {
		return "", fmt.Sprintf("there is no %s: %s is unset and nothing answers at %s (%v); %s, or set %s to its DSN", s.Name, s.Env, s.Local, err, s.How, s.Env)
	}
	return s.Local, ""
}

// resolve finds the DSN once per process: Env, else Local if it answers,
// else a server the process's Starter starts.
func (s *Server) resolve() {
	s.once.Do(func() {
		if s.dsn, s.reason = s.FindRunning(); s.dsn != "" || s.Image == "" || starter == nil {
			return
		}
		dsn, cerr := starter.Start(s)
		if cerr != nil {
			s.reason += fmt.Sprintf("; no container either: %v", cerr)
			return
		}
		s.dsn = dsn
	})
}

// ping reports whether the server answers at dsn: each of its nodes, for
// a cluster.
func (s *Server) ping(dsn string) error {
	if !s.Cluster {
		return ping(s.Driver, dsn)
	}
	for _, n := range Nodes(dsn) {
		if err := ping(s.Driver, n); err != nil {
			return err
		}
	}
	return nil
}

// A Starter starts a throwaway server for tests where none is set or
// running, and removes the servers it started when they end. Module
// idemtest/containers has one that starts Docker containers.
type Starter interface {
	// Start starts a server from s.Image and returns its DSN once it
	// answers.
	Start(s *Server) (dsn string, err error)
	// Stop removes every server Start started.
	Stop()
}

// starter is the Starter that Run was given, or nil.
var starter Starter

// ping reports whether a server answers at dsn, within a few seconds.
func ping(driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// Main runs a package's tests, from its TestMain, on the servers set in
// the environment or running at their usual addresses, and exits with
// their code; it starts no server. A package whose runnable examples need
// a server, and have no *testing.T to skip with, names it in needs: Main
// sets the server's variable (Env) to its DSN, for the examples to read,
// or, when there is none, runs nothing and says why (and fails under
// IDEM_TEST_REQUIRE=1).
func Main(m *testing.M, needs ...*Server) { os.Exit(Run(m, nil, needs...)) }

// Run is Main that returns the exit code instead of exiting, for a
// TestMain with work of its own to do after the tests; and where a server
// is neither set nor running, st (when not nil) starts one, which Run
// removes before it returns.
func Run(m *testing.M, st Starter, needs ...*Server) int {
	starter = st
	if st != nil {
		defer st.Stop()
	}
	for _, s := range needs {
		dsn, why := s.Find()
		if dsn == "" {
			fmt.Println("testdb: not running these tests:", why)
			if Required {
				return 1
			}
			return 0
		}
		_ = os.Setenv(s.Env, dsn)
	}
	return m.Run()
}
