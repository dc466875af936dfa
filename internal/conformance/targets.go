// Package conformance is idem's conformance suite. Every test runs
// against every target (a dialect through one driver on a real server),
// each on tables of its own. The targets are:
//
//   - postgres-libpq: PostgreSQL through lib/pq (database/sql);
//   - postgres-pgx: PostgreSQL through pgx's database/sql driver;
//   - postgres-pgxnative: PostgreSQL through pgx itself, with idem's calls
//     made through package idempgx on a *pgxpool.Pool and its pgx.Tx;
//   - mysql: idem.MySQL on MySQL or MariaDB, through go-sql-driver/mysql;
//   - mariadb: idem.MariaDB on MariaDB, through go-sql-driver/mysql;
//   - tidb: TiDB through go-sql-driver/mysql;
//   - sqlite: SQLite through modernc.org/sqlite, in a temporary file.
//
// Targets find their databases through IDEM_TEST_POSTGRES_DSN,
// IDEM_TEST_MYSQL_DSN, IDEM_TEST_MARIADB_DSN (the same MariaDB server as
// the one before it, or another) and IDEM_TEST_TIDB_DSN (scripts/tidb.sh
// starts a TiDB); the SQLite target needs no server and always runs, on
// a database file in a temporary directory. When a DSN is unset and a
// Docker daemon answers, the suite starts a container for it. Otherwise its
// targets are skipped with a message, unless IDEM_TEST_REQUIRE=1, which
// makes a missing database a failure. TiDB has no container here: its
// server is built and started by scripts/tidb.sh. A DSN that is set but does not
// answer is always a failure.
//
// [Run] is its one entry point: the module's integration_test package
// calls it, and every dialect and driver is a target it runs on.
package conformance

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
)

// target is one dialect through one driver.
type target struct {
	name    string
	dialect idem.Dialect
	driver  string // database/sql driver name, unless native
	native  bool   // idem through idempgx on a *pgxpool.Pool, not database/sql
	server  string // key into servers
}

// targets is every dialect and driver the suite runs against.
//
// A native target runs every test of forEach, and of forDialect for its
// dialect: each of idem's calls goes through idempgx (store.go), and each
// transaction of the test's, with its business rows, is a pgx.Tx of the
// target's pool (handles.go). What it does not run, and why:
//
//   - TestSqlxTx and the TestHTTP tests run on forEachSQL's targets only:
//     a *sqlx.Tx is a database/sql transaction, and idemhttp runs on
//     database/sql (its Config.DB is a *sql.DB, its TxFrom returns a
//     *sql.Tx);
//   - TestDoNeedsATransaction skips its refusal of a *sql.DB, *sql.Conn
//     and *sqlx.DB there: idempgx's Do takes a pgx.Tx, so a pool or a
//     connection does not compile; the rest of it runs;
//   - TestTableGrowth and TestIndexCost, measurements run on request,
//     measure a server once, through postgres-pgx;
//   - the tests of other dialects (TestSQLite*, TestInterruptInFn,
//     TestTiDB*) run on their dialect's targets only.
var targets = []target{
	{name: "postgres-libpq", dialect: idem.Postgres, driver: "postgres", server: "postgres"},
	{name: "postgres-pgx", dialect: idem.Postgres, driver: "pgx", server: "postgres"},
	{name: "postgres-pgxnative", dialect: idem.Postgres, native: true, server: "postgres"},
	{name: "mysql", dialect: idem.MySQL, driver: "mysql", server: "mysql"},
	{name: "mariadb", dialect: idem.MariaDB, driver: "mysql", server: "mariadb"},
	{name: "tidb", dialect: idem.TiDB, driver: "mysql", server: "tidb"},
	{name: "sqlite", dialect: idem.SQLite, driver: "sqlite", server: "sqlite"},
}

// server is how a test reaches one database server.
type server struct {
	env    string // the variable that names its DSN
	image  string // the Docker image started when env is unset
	how    string // how to get a server, where there is no image
	local  bool   // an embedded database in a temporary directory
	dsn    string
	reason string // why there is no DSN
	once   sync.Once
}

var servers = map[string]*server{
	"postgres": {env: "IDEM_TEST_POSTGRES_DSN", image: "postgres:16"},
	"mysql":    {env: "IDEM_TEST_MYSQL_DSN", image: "mysql:8.4"},
	"mariadb":  {env: "IDEM_TEST_MARIADB_DSN", image: "mariadb:10.11"},
	"tidb":     {env: "IDEM_TEST_TIDB_DSN", how: "run scripts/tidb.sh start and set IDEM_TEST_TIDB_DSN='root@tcp(127.0.0.1:4000)/test'"},
	"sqlite":   {local: true},
}

// sqliteParams are the DSN parameters the SQLite dialect documents: write
// lock at BEGIN, wait for it, readers beside the writer. The busy timeout
// is long because the suite's parallel tests share one database file, and
// some hold a transaction open on purpose.
const sqliteParams = "?_txlock=immediate&_pragma=busy_timeout(30000)&_pragma=journal_mode(WAL)"

// tempDir holds the embedded databases; Run makes it and removes it.
var tempDir string

var require = os.Getenv("IDEM_TEST_REQUIRE") == "1"

// resolve finds the server's DSN: the environment, else a container.
func (s *server) resolve(name string) {
	s.once.Do(func() {
		if s.local {
			s.dsn = "file:" + filepath.Join(tempDir, name+".db") + sqliteParams
			return
		}
		if s.dsn = os.Getenv(s.env); s.dsn != "" {
			return
		}
		if s.image == "" {
			s.reason = fmt.Sprintf("%s is unset; %s", s.env, s.how)
			return
		}
		dsn, err := startContainer(name, s.image)
		if err != nil {
			s.reason = fmt.Sprintf("%s is unset and no container could be started (%v); set %s to a DSN to run these tests", s.env, err, s.env)
			return
		}
		s.dsn = dsn
	})
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
// its server is missing. A DSN that is set but does not answer fails the
// test whatever IDEM_TEST_REQUIRE says: a mistyped DSN must not pass for a
// server that is not there.
func (tg target) open(t *testing.T) *env {
	t.Helper()
	s := servers[tg.server]
	s.resolve(tg.server)
	if s.dsn == "" {
		if require {
			t.Fatalf("IDEM_TEST_REQUIRE=1 and %s has no database: %s", tg.name, s.reason)
		}
		t.Skipf("%s: %s", tg.name, s.reason)
	}
	poolsMu.Lock()
	p, ok := pools[tg.name]
	if !ok {
		p.db, p.err = tg.connect(s.dsn, 40)
		if p.err != nil {
			p.err = fmt.Errorf("%s: cannot reach the database at %s=%q: %w", tg.name, s.env, s.dsn, p.err)
		}
		pools[tg.name] = p
	}
	poolsMu.Unlock()
	if p.err != nil {
		t.Fatal(p.err)
	}
	return &env{target: tg, t: t, db: p.db, dsn: s.dsn}
}

// connect opens a pool of at most conns connections on dsn with the
// target's driver and checks that its server answers.
func (tg target) connect(dsn string, conns int) (pool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if tg.native {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(conns)
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
	db, err := sql.Open(tg.driver, dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return newSQLPool(db, tg.driver), nil
}

// mysqlFamily reports a target that speaks MySQL's SQL: MySQL, MariaDB
// and TiDB.
func (e *env) mysqlFamily() bool {
	return e.dialect == idem.MySQL || e.dialect == idem.MariaDB || e.dialect == idem.TiDB
}

// readsToken reports a dialect whose INSERT cannot return the claim's
// token, so that Do reads it right after: MySQL and TiDB.
func (e *env) readsToken() bool { return e.dialect == idem.MySQL || e.dialect == idem.TiDB }

// settingsCheck is the number of statements Do and Begin run before the
// claim to check the transaction's settings: TiDB's one.
func (e *env) settingsCheck() int64 {
	if e.dialect == idem.TiDB {
		return 1
	}
	return 0
}

// embedded reports an in-process database (SQLite): there is no network
// connection to cut and no server session to kill.
func (e *env) embedded() bool { return servers[e.server].local }

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
// through database/sql, for what only database/sql has: idemhttp, sqlx.
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

// forTargets runs body as a parallel subtest per target that runs says
// to.
func forTargets(t *testing.T, runs func(target) bool, body func(t *testing.T, e *env)) {
	t.Helper()
	for _, tg := range targets {
		if !runs(tg) {
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
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
	e.exec(fmt.Sprintf("CREATE TABLE %s (id %s, k VARCHAR(255) NOT NULL, v VARCHAR(255) NOT NULL)", table, e.autoID()))
	e.dropLater(table)
	return table
}

func (e *env) autoID() string {
	switch e.dialect {
	case idem.MySQL, idem.MariaDB, idem.TiDB:
		return "BIGINT AUTO_INCREMENT PRIMARY KEY"
	case idem.SQLite:
		return "INTEGER PRIMARY KEY"
	}
	return "BIGSERIAL PRIMARY KEY"
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

// rebind turns ? placeholders into $n for Postgres.
func (e *env) rebind(query string) string {
	if e.dialect != idem.Postgres {
		return query
	}
	return sqlx.Rebind(sqlx.DOLLAR, query)
}

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
	if e.dialect == idem.TiDB && l == sql.LevelSerializable {
		e.t.Skip("TiDB refuses SERIALIZABLE at BEGIN (error 8048), and where tidb_skip_isolation_level_check lets it through (as snapshot isolation) idem refuses the transaction: TestTiDBRefusesSerializable")
	}
}

func levelName(l sql.IsolationLevel) string {
	return strings.ReplaceAll(l.String(), " ", "")
}
