package integration_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "modernc.org/sqlite"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
	"github.com/idemkit/idem/idemtest/conformance"
	"github.com/idemkit/idem/idemtest/testdb"
)

// targets are every dialect and driver the suite runs on: a row each,
// built by sqlTarget (database/sql) or pgxTarget (pgx itself, with idem's
// calls made through the Store's On methods on idempgx's Runner of a
// *pgxpool.Pool and the pgx.Tx it begins). The facts are the database's
// (package conformance), with what a row's setup changes set on them.
// The targets are:
//
//   - postgres-libpq: PostgreSQL through lib/pq (database/sql);
//   - postgres-pgx: PostgreSQL through pgx's database/sql driver;
//   - postgres-pgxnative: PostgreSQL through pgx itself;
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
var targets = []conformance.Target{
	sqlTarget("postgres-libpq", idem.Postgres, "postgres", testdb.Postgres, "", conformance.PostgresFacts()),
	measured(cachesStatements(sqlTarget("postgres-pgx", idem.Postgres, "pgx", testdb.Postgres, "", conformance.PostgresFacts()))),
	measured(pgxTarget("postgres-pgxnative", testdb.Postgres, "", conformance.PostgresFacts())),
	measured(sqlTarget("mysql", idem.MySQL, "mysql", testdb.MySQL, "", conformance.MySQLFacts())),
	measured(sqlTarget("mariadb", idem.MariaDB, "mysql", testdb.MariaDB, "", conformance.MySQLFacts())),
	measured(sqlTarget("tidb", idem.TiDB, "mysql", testdb.TiDB, "", conformance.TiDBFacts())),
	// A Galera cluster's pool opens each connection on the next node
	// (spread), so a test's transactions, and the duplicates of a storm,
	// run on all three nodes at once; each session with the settings
	// idem requires there (galeraParams).
	sqlTarget("galera", idem.MariaDB, "mysql", testdb.Galera, galeraParams, conformance.GaleraFacts()),
	sqlTarget("galera-mysql", idem.MySQL, "mysql", testdb.Galera, galeraParams, conformance.GaleraFacts()),
	measured(sqliteTarget()),
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
	sqlTarget("pgbouncer-libpq", idem.Postgres, "postgres", testdb.PgBouncer, "binary_parameters=yes", pooled()),
	cachesStatements(sqlTarget("pgbouncer-pgx", idem.Postgres, "pgx", testdb.PgBouncer, "default_query_exec_mode=exec", pooled())),
	pgxTarget("pgbouncer-pgxnative", testdb.PgBouncer, "default_query_exec_mode=exec", pooled()),
}

// pooled are PostgreSQL's facts behind PgBouncer in transaction pooling
// mode.
func pooled() conformance.Facts {
	f := conformance.PostgresFacts()
	f.Pooled = true
	return f
}

// measured is tg with Measure set: one target per server and driver
// family is measured by TestUpgradeUnderLoad (lib/pq's, beside pgx's, is
// not).
func measured(tg conformance.Target) conformance.Target {
	tg.Measure = true
	return tg
}

// cachesStatements is tg with CachesStatements set: pgx's targets.
func cachesStatements(tg conformance.Target) conformance.Target {
	tg.CachesStatements = true
	return tg
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

// sqliteDir holds the SQLite target's database file: TestConformance
// makes it, and removes it when it ends.
var sqliteDir string

// sqlTarget is a target through the database/sql driver driverName on
// server, with the driver settings params added to its DSN.
func sqlTarget(name string, dialect idem.Dialect, driverName string, server *testdb.Server, params string, facts conformance.Facts) conformance.Target {
	return conformance.Target{
		Name:    name,
		Dialect: dialect,
		DSN:     func(t testing.TB) string { return serverDSN(t, server, params) },
		Open: func(dsn string, o conformance.Options) (conformance.DB, error) {
			return openSQL(driverName, server, dsn, o)
		},
		Cluster:   server.Cluster,
		PoolOfOne: poolOfOne(server, params),
		Facts:     facts,
	}
}

// sqliteTarget is SQLite through modernc.org/sqlite, on a file in
// sqliteDir.
func sqliteTarget() conformance.Target {
	return conformance.Target{
		Name:    "sqlite",
		Dialect: idem.SQLite,
		DSN: func(testing.TB) string {
			return "file:" + filepath.Join(sqliteDir, "sqlite.db") + sqliteParams
		},
		Open:  func(dsn string, o conformance.Options) (conformance.DB, error) { return openSQL("sqlite", nil, dsn, o) },
		Facts: conformance.SQLiteFacts(),
	}
}

// pgxTarget is PostgreSQL on server through pgx itself: idempgx's Runner
// of a *pgxpool.Pool.
func pgxTarget(name string, server *testdb.Server, params string, facts conformance.Facts) conformance.Target {
	return conformance.Target{
		Name:             name,
		Dialect:          idem.Postgres,
		DSN:              func(t testing.TB) string { return serverDSN(t, server, params) },
		Open:             func(dsn string, o conformance.Options) (conformance.DB, error) { return openPgx(server, dsn, o) },
		PoolOfOne:        poolOfOne(server, params),
		CachesStatements: true,
		Facts:            facts,
	}
}

// serverDSN is server's DSN with params added (to each node's, on a
// cluster), or ends t as testdb says when the server is missing.
func serverDSN(t testing.TB, server *testdb.Server, params string) string {
	t.Helper()
	dsn := server.DSN(t)
	if !server.Cluster {
		return withParams(dsn, params)
	}
	nodes := testdb.Nodes(dsn)
	for i, n := range nodes {
		nodes[i] = withParams(n, params)
	}
	return strings.Join(nodes, ",")
}

// poolOfOne is PgBouncer's pool of one server connection for a target
// behind it, in its settings and in the driver's defaults; nil for a
// target on another server.
func poolOfOne(server *testdb.Server, params string) func(t testing.TB) (string, string) {
	if server != testdb.PgBouncer {
		return nil
	}
	return func(t testing.TB) (string, string) {
		dsn := testdb.PgBouncerSingle.DSN(t)
		return withParams(dsn, params), dsn
	}
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

// budgeted reports whether a pool's connections count against
// postgresBudget: the target's shared pool on the PostgreSQL server
// (PgBouncer's pool bounds its own server connections:
// scripts/pgbouncer.sh).
func budgeted(server *testdb.Server, o conformance.Options) bool {
	return o.Shared && server == testdb.Postgres
}

// openSQL opens a database/sql pool on dsn with the driver driverName, of
// at most o.Conns connections, and checks that it answers: through
// postgresBudget where budgeted says so, on each node of a cluster in
// turn (spread).
func openSQL(driverName string, server *testdb.Server, dsn string, o conformance.Options) (conformance.DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		db  *sql.DB
		err error
	)
	idle := o.Conns
	switch {
	case server != nil && budgeted(server, o):
		db, err = openBudgeted(driverName, dsn)
		idle = min(o.Conns, idleConns)
	case server != nil && server.Cluster:
		db, err = spread(driverName, testdb.Nodes(dsn))
	default:
		db, err = sql.Open(driverName, dsn)
	}
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	db.SetMaxOpenConns(o.Conns)
	db.SetMaxIdleConns(idle)
	if server != nil && budgeted(server, o) {
		db.SetConnMaxIdleTime(idleTime)
	}
	return conformance.SQL(db, driverName), nil
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

// openPgx opens a *pgxpool.Pool on dsn of at most o.Conns connections,
// through postgresBudget where budgeted says so, and checks that it
// answers.
func openPgx(server *testdb.Server, dsn string, o conformance.Options) (conformance.DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(o.Conns)
	if budgeted(server, o) {
		cfg.ConnConfig.DialFunc = budgetDial
		cfg.MaxConnIdleTime, cfg.HealthCheckPeriod = idleTime, idleTime
	}
	if o.Silent {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := db.Ping(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return pgxDB{db}, nil
}

// pgxDB is a *pgxpool.Pool as the suite's DB: idem runs on it through
// idempgx's Runner, as pgx's users run it.
type pgxDB struct{ db *pgxpool.Pool }

func (p pgxDB) Runner(opts *sql.TxOptions) idem.Runner { return idempgx.New(p.db, pgxOptions(opts)) }

func (p pgxDB) Close() { p.db.Close() }

// Outside is pgx's handles outside a transaction, as idempgx takes them.
func (p pgxDB) Outside(t testing.TB) map[string]any {
	conn, err := p.db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return map[string]any{
		"*pgxpool.Pool": p.db,
		"*pgxpool.Conn": conn,
		"*pgx.Conn":     conn.Conn(),
	}
}

// Waits counts the acquires that waited for a connection to be released:
// a *pgxpool.Pool counts those that found no idle connection, whether
// they waited for a release or opened a new one, and counts the new ones;
// the difference is the waits.
func (p pgxDB) Waits() int64 {
	st := p.db.Stat()
	return st.EmptyAcquireCount() - st.NewConnsCount()
}

// pgxOptions are database/sql's transaction options in pgx's terms.
func pgxOptions(opts *sql.TxOptions) pgx.TxOptions {
	if opts == nil {
		return pgx.TxOptions{}
	}
	return pgx.TxOptions{IsoLevel: pgxLevels[opts.Isolation]}
}

// pgxLevels are pgx's names of the isolation levels the suite asks for;
// the default level is the empty name.
var pgxLevels = map[sql.IsolationLevel]pgx.TxIsoLevel{
	sql.LevelReadCommitted:  pgx.ReadCommitted,
	sql.LevelRepeatableRead: pgx.RepeatableRead,
	sql.LevelSerializable:   pgx.Serializable,
}
