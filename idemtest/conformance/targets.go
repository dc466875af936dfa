// Package conformance is idem's conformance suite. Every test runs
// against every target (a dialect through one driver on a real server),
// each on tables of its own. The targets are:
//
//   - postgres-libpq: PostgreSQL through lib/pq (database/sql);
//   - postgres-pgx: PostgreSQL through pgx's database/sql driver;
//   - postgres-pgxnative: PostgreSQL through pgx itself, with idem's calls
//     made through the Store's On methods on idempgx's adapters of a
//     *pgxpool.Pool and its pgx.Tx;
//   - mysql: idem.MySQL on MySQL or MariaDB, through go-sql-driver/mysql;
//   - mariadb: idem.MariaDB on MariaDB, through go-sql-driver/mysql;
//   - tidb: TiDB through go-sql-driver/mysql;
//   - galera, galera-mysql: idem.MariaDB and idem.MySQL on a three-node
//     MariaDB Galera cluster (multi-primary), through go-sql-driver/mysql,
//     each pool's connections spread over the nodes in turn, so that
//     duplicates meet on different nodes;
//   - sqlite: SQLite through modernc.org/sqlite, in a temporary file;
//   - pgbouncer-libpq, pgbouncer-pgx, pgbouncer-pgxnative: the three
//     PostgreSQL targets behind PgBouncer in transaction pooling mode, in
//     the driver settings that need no prepared-statement tracking.
//
// Targets find their servers through package testdb: the DSN in
// IDEM_TEST_POSTGRES_DSN, IDEM_TEST_MYSQL_DSN, IDEM_TEST_MARIADB_DSN (the
// same MariaDB server as the one before it, or another),
// IDEM_TEST_TIDB_DSN, IDEM_TEST_PGBOUNCER_DSN (and
// IDEM_TEST_PGBOUNCER_SINGLE_DSN, a pool of one server connection) or
// IDEM_TEST_GALERA_DSNS (the nodes' DSNs, comma-separated); when
// that is unset, the server of a development machine at its usual
// address; when nothing answers there, a container where Docker runs
// (TiDB, PgBouncer and Galera have none: scripts/tidb.sh,
// scripts/pgbouncer.sh and scripts/galera.sh start them). A target whose server is missing is skipped with a message, or
// fails under IDEM_TEST_REQUIRE=1; a DSN that is set but does not answer
// always fails. The SQLite target needs no server and always runs, on a
// database file in a temporary directory.
//
// [Run] is its one entry point: the module integration_test's package
// calls it, and every dialect and driver is a target it runs on.
package conformance

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest/testdb"
)

// target is one dialect through one driver, on the database its facts
// describe (facts.go).
type target struct {
	name    string
	dialect idem.Dialect
	driver  string         // database/sql driver name, unless native
	native  bool           // idem through idempgx's adapters of a *pgxpool.Pool, not database/sql
	server  *testdb.Server // nil for an embedded database, in a temporary directory
	params  string         // settings of the driver's, added to the server's DSN
	// cachesStatements reports a driver that, in its default settings,
	// prepares each statement under a name and caches it per connection
	// (pgx), which a pooler without prepared-statement tracking breaks.
	cachesStatements bool
	// measure is set on the targets that a measurement run on request
	// (TestUpgradeUnderLoad) measures through: one per server and driver
	// family, so lib/pq's target, beside pgx's, has it unset.
	measure bool
	*facts
}

// targets is every dialect and driver the suite runs against.
//
// A native target runs every test of forEach, and of forDialect for its
// dialect: each of idem's calls goes through an On method and idempgx's
// adapters (store.go), and each transaction of the test's, with its
// business rows, is a pgx.Tx of the target's pool (handles.go). What it
// does not run, and why:
//
//   - TestSqlxTx runs on forEachSQL's targets only: a *sqlx.Tx is a
//     database/sql transaction (the TestHTTP tests run everywhere, with
//     idemhttp's middleware on idempgx's Runner there: http_driver.go);
//   - TestOnlyTransactionsAccepted calls no Do or Complete on a pool or a
//     connection there: DoOn and CompleteOn take an idem.Tx, which
//     idempgx.Tx makes of a pgx.Tx only, so a pool does not compile;
//   - the tests of one database's own behaviour (TestPostgres*,
//     TestAbortedTxMessage, TestDailyPartitionsRunAKeyTwice, TestSQLite*,
//     TestInterruptInFn, TestTiDB*) run on its dialect's targets only
//     (forDialect).
//
// A new target is one more row; a new database is one more row and the
// facts value it points to (facts.go). No test asks which database it
// runs on: each reads the facts of its target.
var targets = []target{
	{name: "postgres-libpq", dialect: idem.Postgres, driver: "postgres", server: testdb.Postgres, facts: &postgresFacts},
	{name: "postgres-pgx", dialect: idem.Postgres, driver: "pgx", server: testdb.Postgres, measure: true, cachesStatements: true, facts: &postgresFacts},
	{name: "postgres-pgxnative", dialect: idem.Postgres, native: true, server: testdb.Postgres, measure: true, cachesStatements: true, facts: &postgresFacts},
	{name: "mysql", dialect: idem.MySQL, driver: "mysql", server: testdb.MySQL, measure: true, facts: &mysqlFacts},
	{name: "mariadb", dialect: idem.MariaDB, driver: "mysql", server: testdb.MariaDB, measure: true, facts: &mysqlFacts},
	{name: "tidb", dialect: idem.TiDB, driver: "mysql", server: testdb.TiDB, measure: true, facts: &tidbFacts},
	// A Galera cluster's pool opens each connection on the next node
	// (spread), so a test's transactions, and the duplicates of a storm,
	// run on all three nodes at once; each session with the settings
	// idem requires there (galeraParams).
	{name: "galera", dialect: idem.MariaDB, driver: "mysql", server: testdb.Galera, params: galeraParams, facts: &galeraFacts},
	{name: "galera-mysql", dialect: idem.MySQL, driver: "mysql", server: testdb.Galera, params: galeraParams, facts: &galeraFacts},
	{name: "sqlite", dialect: idem.SQLite, driver: "sqlite", measure: true, facts: &sqliteFacts},
	// Behind PgBouncer in transaction mode (scripts/pgbouncer.sh), in the
	// settings docs/operations.md gives for PgBouncer 1.18, which tracks
	// no prepared statement: pgx runs each statement as the unnamed
	// statement, parsed, bound and executed in one round trip
	// (default_query_exec_mode=exec: server-side parameters, as in pgx's
	// default mode, without a statement cache); lib/pq sends its
	// statements with arguments in one round trip too
	// (binary_parameters=yes), where it would otherwise parse in one and
	// execute in the next, which outside a transaction PgBouncer may hand
	// to another server session.
	{name: "pgbouncer-libpq", dialect: idem.Postgres, driver: "postgres", server: testdb.PgBouncer, params: "binary_parameters=yes", facts: &pgbouncerFacts},
	{name: "pgbouncer-pgx", dialect: idem.Postgres, driver: "pgx", server: testdb.PgBouncer, params: "default_query_exec_mode=exec", cachesStatements: true, facts: &pgbouncerFacts},
	{name: "pgbouncer-pgxnative", dialect: idem.Postgres, native: true, server: testdb.PgBouncer, params: "default_query_exec_mode=exec", cachesStatements: true, facts: &pgbouncerFacts},
}

// galeraParams give each session on a Galera node causal reads at the
// start of its transactions, which Begin requires there, and streaming
// replication of every statement, which Do and Apply require
// (docs/replication.md): a fragment a statement, where the default unit
// (bytes) would make one of every row of a bulk insert.
const galeraParams = "wsrep_sync_wait=1&wsrep_trx_fragment_unit=statements&wsrep_trx_fragment_size=1"

// sqliteParams are the DSN parameters the SQLite dialect documents: write
// lock at BEGIN, wait for it, readers beside the writer. The busy timeout
// is long because the suite's parallel tests share one database file, and
// some hold a transaction open on purpose.
const sqliteParams = "?_txlock=immediate&_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"

// tempDir holds the embedded databases; Run makes it and removes it.
var tempDir string

// dsn is the target's DSN, or ends t as testdb says when its server is
// missing.
func (tg target) dsn(t *testing.T) string {
	t.Helper()
	if tg.inProcess {
		return "file:" + filepath.Join(tempDir, tg.name+".db") + sqliteParams
	}
	dsn := tg.server.DSN(t)
	if !tg.server.Cluster {
		return withParams(dsn, tg.params)
	}
	nodes := testdb.Nodes(dsn)
	for i, n := range nodes {
		nodes[i] = withParams(n, tg.params)
	}
	return strings.Join(nodes, ",")
}

// withParams is dsn with the settings params (k=v, &-separated) added: to
// a URL's query or go-sql-driver/mysql's, or as k=v words to key=value
// settings.
func withParams(dsn, params string) string {
	switch {
	case params == "":
		return dsn
	case strings.Contains(dsn, "://") && strings.Contains(dsn, "?"):
		return dsn + "&" + params
	case strings.Contains(dsn, "://"):
		return dsn + "?" + params
	case strings.Contains(dsn, ")/") && strings.Contains(dsn, "?"): // go-sql-driver/mysql's
		return dsn + "&" + params
	case strings.Contains(dsn, ")/"):
		return dsn + "?" + params
	}
	return dsn + " " + strings.ReplaceAll(params, "&", " ")
}

// env is a target opened for one test.
type env struct {
	target
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

// targetPool is a target's connection pool, opened once per suite run,
// or why it could not be.
type targetPool struct {
	db  pool
	err error
}

var (
	poolsMu sync.Mutex
	pools   = map[string]targetPool{}
)

// open returns the target's shared pool, skipping or failing the test when
// its server is missing (package testdb). A DSN that does not answer fails
// the test: testdb found it answering, or the user set it.
func (tg target) open(t *testing.T) *env {
	t.Helper()
	dsn := tg.dsn(t)
	poolsMu.Lock()
	p, ok := pools[tg.name]
	if !ok {
		p.db, p.err = tg.connectShared(dsn, 40)
		if p.err != nil {
			p.err = fmt.Errorf("%s: cannot reach the database at %q: %w", tg.name, dsn, p.err)
		}
		pools[tg.name] = p
	}
	poolsMu.Unlock()
	if p.err != nil {
		t.Fatal(p.err)
	}
	return &env{target: tg, t: t, db: p.db, dsn: dsn}
}

// connect opens a pool of at most conns connections on dsn with the
// target's driver and checks that its server answers: a test's own small
// pool, outside postgresBudget, so that its timings wait on no other
// target.
func (tg target) connect(dsn string, conns int) (pool, error) { return tg.dial(dsn, conns, false) }

// connectShared is connect for the target's shared pool: on the direct
// PostgreSQL targets its connections count against postgresBudget, and
// it keeps few open unused (budget.go).
func (tg target) connectShared(dsn string, conns int) (pool, error) {
	return tg.dial(dsn, conns, tg.budgeted())
}

// dial is connect, within postgresBudget when budget is set.
func (tg target) dial(dsn string, conns int, budget bool) (pool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if tg.native {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(conns)
		if budget {
			cfg.ConnConfig.DialFunc = budgetDial
			cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = idleTime, idleTime
		}
		db, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if err := db.Ping(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return newPgxPool(db), nil
	}
	open, idle := tg.sqlOpen, conns
	if budget {
		open, idle = func(dsn string) (*sql.DB, error) { return openBudgeted(tg.driver, dsn) }, min(conns, idleConns)
	}
	db, err := open(dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(idle)
	if budget {
		db.SetConnMaxIdleTime(idleTime)
	}
	return newSQLPool(db, tg.driver), nil
}

// sqlOpen opens a *sql.DB on dsn with the target's driver: for a cluster
// (testdb.Server.Cluster), on each of its nodes in turn (spread).
func (tg target) sqlOpen(dsn string) (*sql.DB, error) {
	if tg.server == nil || !tg.server.Cluster {
		return sql.Open(tg.driver, dsn)
	}
	return spread(tg.driver, testdb.Nodes(dsn))
}

// spread is a *sql.DB whose every new connection goes to the next of
// the nodes' DSNs, round-robin, through driver.
func spread(driverName string, dsns []string) (*sql.DB, error) {
	probe, err := sql.Open(driverName, "")
	if err != nil {
		return nil, err
	}
	d, ok := probe.Driver().(driver.DriverContext)
	_ = probe.Close()
	if !ok {
		return nil, fmt.Errorf("driver %s cannot open a connector", driverName)
	}
	r := &roundRobin{}
	for _, dsn := range dsns {
		c, err := d.OpenConnector(dsn)
		if err != nil {
			return nil, err
		}
		r.nodes = append(r.nodes, c)
	}
	if len(r.nodes) == 0 {
		return nil, errors.New("a cluster's DSN names no node")
	}
	return sql.OpenDB(r), nil
}

// roundRobin is a driver.Connector that connects to each of its nodes in
// turn.
type roundRobin struct {
	nodes []driver.Connector
	next  atomic.Uint64
}

func (r *roundRobin) Connect(ctx context.Context) (driver.Conn, error) {
	return r.nodes[(r.next.Add(1)-1)%uint64(len(r.nodes))].Connect(ctx)
}

func (r *roundRobin) Driver() driver.Driver { return r.nodes[0].Driver() }

// embedded reports an in-process database (SQLite): there is no network
// connection to cut and no server session to kill.
func (e *env) embedded() bool { return e.inProcess }

// needServer skips a fault test on an embedded target, saying why: the
// fault it injects does not exist there. (A process that crashes with a
// SQLite transaction open leaves it in the journal, and SQLite rolls it
// back when the file is next opened.)
func (e *env) needServer(fault string) {
	e.t.Helper()
	if e.embedded() {
		e.t.Skipf("%s is an embedded database: no %s to inject", e.name, fault)
	}
}

// forEach runs body as a parallel subtest per target.
func forEach(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(target) bool { return true }, body)
}

// forEachSQL runs body as a parallel subtest per target that runs idem
// through database/sql, for what only database/sql has: sqlx.
// Such a test reaches the target's *sql.DB through e.sqlDB.
func forEachSQL(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(tg target) bool { return !tg.native }, body)
}

// forDialect runs body as a parallel subtest per target of dialect d, for
// behaviour only one database has.
func forDialect(t *testing.T, d idem.Dialect, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargets(t, func(tg target) bool { return tg.dialect == d }, body)
}

// forEachOnClusters is forEach for a test written for a cluster's nodes
// (cluster.go): it runs on every target, those whose facts keep the rest
// of the suite for a run on request (suiteOnRequest) included.
func forEachOnClusters(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, func(target) bool { return true }, true, body)
}

// forEachSQLOnClusters is forEachSQL for a test written for a cluster's
// nodes, as forEachOnClusters is forEach.
func forEachSQLOnClusters(t *testing.T, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, func(tg target) bool { return !tg.native }, true, body)
}

// clusterSuite is the variable that runs the whole suite on the targets
// whose facts keep it for a run on request (suiteOnRequest).
const clusterSuite = "IDEM_TEST_CLUSTER_SUITE"

// forTargets runs body as a parallel subtest per target that runs says
// to. On a target whose facts keep the suite for a run on request
// (suiteOnRequest), the subtest skips, saying why, unless clusterSuite is
// 1.
func forTargets(t *testing.T, runs func(target) bool, body func(t *testing.T, e *env)) {
	t.Helper()
	forTargetsOf(t, runs, false, body)
}

// forTargetsOf is forTargets, on the targets that keep the suite for a
// run on request too when always is set.
func forTargetsOf(t *testing.T, runs func(target) bool, always bool, body func(t *testing.T, e *env)) {
	t.Helper()
	for _, tg := range targets {
		if !runs(tg) {
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
			if !always && tg.suiteOnRequest != "" && os.Getenv(clusterSuite) != "1" {
				t.Skipf("%s runs the tests written for it (cluster.go) by default, and the whole suite with %s=1: %s", tg.name, clusterSuite, tg.suiteOnRequest)
			}
			t.Parallel()
			body(t, tg.open(t))
		})
	}
}

// sqlDB is the target's *sql.DB, for a test of what only database/sql
// has, which runs on forEachSQL's targets; on a native target it fails
// the test, which would otherwise not run what it says.
func (e *env) sqlDB() *sql.DB {
	e.t.Helper()
	p, ok := e.db.(*sqlPool)
	if !ok {
		e.t.Fatalf("%s runs idem through idempgx and has no *sql.DB: run this test with forEachSQL", e.name)
	}
	return p.db
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
	is, err := idem.New(e.dialect, append([]idem.Option{idem.WithTable(s.Table())}, opts...)...)
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
	is, err := idem.New(e.dialect, append([]idem.Option{idem.WithTable(table)}, opts...)...)
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
	e.exec(fmt.Sprintf("CREATE TABLE %s (id %s, k VARCHAR(255) NOT NULL, v VARCHAR(255) NOT NULL)", table, e.autoID))
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

// rebind turns ? placeholders into the database's (bindvar).
func (e *env) rebind(query string) string { return sqlx.Rebind(e.bindvar, query) }

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
	if why, refused := e.refusedLevels[l]; refused {
		e.t.Skip(why)
	}
}

func levelName(l sql.IsolationLevel) string {
	return strings.ReplaceAll(l.String(), " ", "")
}
