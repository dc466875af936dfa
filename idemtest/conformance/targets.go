package conformance

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
)

// suiteTargets are the targets of Exercise's run.
var suiteTargets []Target

// env is a target opened for one test.
type env struct {
	Target
	t   *testing.T
	db  pool
	dsn string
}

// in is e for a subtest t: its helpers then fail and clean up in t, never
// in the parent test from the subtest's goroutine.
func (e *env) in(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// targetPool is a target's shared connection pool, opened once per suite
// run, or why it could not be.
type targetPool struct {
	db  pool
	err error
}

var (
	poolsMu sync.Mutex
	pools   = map[string]targetPool{}
)

// open returns the target's shared pool, skipping or failing the test when
// its database is missing (Target.DSN). A DSN that does not answer fails
// the test: the target found it answering, or the user set it.
func (tg Target) open(t *testing.T) *env {
	t.Helper()
	dsn := tg.DSN(t)
	poolsMu.Lock()
	p, ok := pools[tg.Name]
	if !ok {
		p.db, p.err = tg.dial(dsn, Options{Conns: 40, Shared: true})
		if p.err != nil {
			p.err = fmt.Errorf("%s: cannot reach the database at %q: %w", tg.Name, dsn, p.err)
		}
		pools[tg.Name] = p
	}
	poolsMu.Unlock()
	if p.err != nil {
		t.Fatal(p.err)
	}
	return &env{Target: tg, t: t, db: p.db, dsn: dsn}
}

// connect opens a pool of at most conns connections on dsn through the
// target's driver and checks that its database answers: a test's own
// small pool, apart from the shared one, so that its timings wait on no
// other test.
func (tg Target) connect(dsn string, conns int) (pool, error) {
	return tg.dial(dsn, Options{Conns: conns})
}

// dial opens a pool on dsn through the target's Open.
func (tg Target) dial(dsn string, o Options) (pool, error) {
	db, err := tg.Open(dsn, o)
	if err != nil {
		return nil, err
	}
	return poolOf(db), nil
}

// embedded reports an in-process database (SQLite): there is no network
// connection to cut and no server session to kill.
func (e *env) embedded() bool { return e.InProcess }

// needServer skips a fault test on an embedded target, saying why: the
// fault it injects does not exist there. (A process that crashes with a
// SQLite transaction open leaves it in the journal, and SQLite rolls it
// back when the file is next opened.)
func (e *env) needServer(fault string) {
	e.t.Helper()
	if e.embedded() {
		e.t.Skipf("%s is an embedded database: no %s to inject", e.Name, fault)
	}
}

// needFact skips the test where the target's facts lack the one named,
// saying so: set reports whether they have it.
func (e *env) needFact(name string, set bool) {
	e.t.Helper()
	if !set {
		e.t.Skipf("%s's facts have no %s (Facts.%s), which this test needs", e.Name, name, name)
	}
}

// forEach runs body as a parallel subtest per target.
func forEach(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(Target) bool { return true }, body)
}

// forEachSQL runs body as a parallel subtest per target, for what only
// database/sql has (sqlx): on a target whose DB is not database/sql's
// (SQL), the subtest skips, saying so. Such a test reaches the target's
// *sql.DB through e.sqlDB.
func forEachSQL(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forEach(t, func(t *testing.T, e *env) {
		e.sqlDB()
		body(t, e)
	})
}

// forDialect runs body as a parallel subtest per target of dialect d, for
// behaviour only one database has.
func forDialect(t *testing.T, d idem.Dialect, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(tg Target) bool { return tg.Dialect == d }, body)
}

// forEachOnClusters is forEach for a test written for a cluster's nodes
// (cluster.go): it runs on every target, those whose Facts keep the rest
// of the suite for a run on request (SuiteOnRequest) included.
func forEachOnClusters(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, func(Target) bool { return true }, true, body)
}

// forEachSQLOnClusters is forEachSQL for a test written for a cluster's
// nodes, as forEachOnClusters is forEach.
func forEachSQLOnClusters(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, func(Target) bool { return true }, true, func(t *testing.T, e *env) {
		e.sqlDB()
		body(t, e)
	})
}

// clusterSuite is the variable that runs the whole suite on the targets
// whose Facts keep it for a run on request (SuiteOnRequest).
const clusterSuite = "IDEM_TEST_CLUSTER_SUITE"

// forTargets runs body as a parallel subtest per target that runs says
// to. On a target whose Facts keep the suite for a run on request
// (SuiteOnRequest), the subtest skips, saying why, unless clusterSuite is
// 1.
func forTargets(t *testing.T, runs func(Target) bool, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, runs, false, body)
}

// forTargetsOf is forTargets, on the targets that keep the suite for a
// run on request too when always is set.
func forTargetsOf(t *testing.T, runs func(Target) bool, always bool, body func(t *testing.T, e *env)) {
	t.Helper()
	for _, tg := range suiteTargets {
		if !runs(tg) {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			if !always && tg.SuiteOnRequest != "" && os.Getenv(clusterSuite) != "1" {
				t.Skipf("%s runs the tests written for it (cluster.go) by default, and the whole suite with %s=1: %s", tg.Name, clusterSuite, tg.SuiteOnRequest)
			}
			t.Parallel()
			body(t, tg.open(t))
		})
	}
}

// sqlDB is the target's *sql.DB, for a test of what only database/sql
// has; on a target whose DB is not database/sql's (SQL) it skips the
// test, saying so.
func (e *env) sqlDB() *sql.DB {
	e.t.Helper()
	p, ok := e.db.(*sqlPool)
	if !ok {
		e.t.Skipf("%s runs idem through its Runner, not database/sql: this test is of database/sql's handles", e.Name)
	}
	return p.db
}

// sqlDriver is the name of the target's database/sql driver (SQL), for
// sqlx; on another target it skips the test, as sqlDB does.
func (e *env) sqlDriver() string {
	e.t.Helper()
	e.sqlDB()
	return e.db.(*sqlPool).driver
}

// randName is a fresh identifier, so every test has tables of its own.
func randName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// elsewhere returns a Store on s's table, as another process would have:
// one that has seen none of s's work. opts are its options beside the
// table's name.
func (e *env) elsewhere(s *store, opts ...idem.Option) *store {
	e.t.Helper()
	is, err := idem.New(e.Dialect, append([]idem.Option{idem.WithTable(s.Table())}, opts...)...)
	if err != nil {
		e.t.Fatalf("new: %v", err)
	}
	return e.onDriver(is)
}

// store makes a migrated Store on a table of the test's own, dropped when
// the test ends.
func (e *env) store(opts ...idem.Option) *store {
	e.t.Helper()
	table := randName("idem")
	is, err := idem.New(e.Dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
	if err != nil {
		e.t.Fatalf("new: %v", err)
	}
	s := e.onDriver(is)
	if err := s.Migrate(context.Background(), e.db); err != nil {
		e.t.Fatalf("migrate: %v", err)
	}
	e.dropLater(table)
	return s
}

// business makes a table of business rows, (k, v), dropped when the test
// ends, and returns its name.
func (e *env) business() string {
	e.t.Helper()
	table := randName("biz")
	e.exec(fmt.Sprintf("CREATE TABLE %s (id %s, k VARCHAR(255) NOT NULL, v VARCHAR(255) NOT NULL)", table, e.AutoID))
	e.dropLater(table)
	return table
}

func (e *env) dropLater(table string) {
	e.t.Cleanup(func() {
		if _, err := e.db.Exec("DROP TABLE IF EXISTS " + table); err != nil {
			e.t.Errorf("drop %s: %v", table, err)
		}
	})
}

func (e *env) exec(query string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Exec(e.rebind(query), args...); err != nil {
		e.t.Fatalf("%s: %v", query, err)
	}
}

// rebind turns ? placeholders into the database's (Bindvar).
func (e *env) rebind(query string) string { return sqlx.Rebind(e.Bindvar, query) }

// count returns the number of rows in table where k = key.
func (e *env) count(table, key string) int {
	e.t.Helper()
	return int(e.int64("SELECT COUNT(*) FROM "+table+" WHERE k = ?", key))
}

// isolationLevels are the levels every dialect promises to hold under. The
// SQLite driver accepts each of them and runs every transaction as
// SERIALIZABLE (SQLite's only level), so on SQLite they are three runs of
// the same case, kept to show that asking for a weaker level is harmless.
var isolationLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// skipLevel skips the test at an isolation level the target refuses to
// begin, saying why.
func (e *env) skipLevel(l sql.IsolationLevel) {
	e.t.Helper()
	if why, refused := e.RefusedLevels[l]; refused {
		e.t.Skip(why)
	}
}

func levelName(l sql.IsolationLevel) string {
	return strings.ReplaceAll(l.String(), " ", "")
}
