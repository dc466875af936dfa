package conformance

import (
	"database/sql"
	"testing"

	"github.com/idemkit/idem"
)

// Target is one database through one driver: what [Exercise] runs every
// test on. A target is data: its name, its dialect, how to reach its
// database and open a pool there, what that pool's driver offers beside
// idem's [idem.Runner], and the [Facts] of its database. No test asks
// which target it runs on; each reads what the Target and its Facts say,
// and a test that needs what a target does not offer skips, saying so.
type Target struct {
	// Name names the target's subtests: TestStormRunsOnce/Name.
	Name string
	// Dialect is the dialect of the Stores the tests make.
	Dialect idem.Dialect
	// DSN returns the data source name Open takes, or ends t, with
	// t.Skip or t.Fatal, when the database is missing (package testdb's
	// Server.DSN does both). An embedded database's DSN names a file of
	// the caller's.
	DSN func(t testing.TB) string
	// Open opens a pool of at most o.Conns connections on dsn (the
	// target's DSN, or one derived from it: pointed at a proxy, a node of
	// a cluster, a setting changed), checks that the database answers,
	// and returns it; the suite closes it.
	Open func(dsn string, o Options) (DB, error)
	// Cluster reports that DSN names the nodes of a cluster, their DSNs
	// comma-separated (testdb.Nodes splits them), and that Open spreads a
	// pool's connections over them in turn: the tests written for a
	// cluster open pools on each node.
	Cluster bool
	// PoolOfOne, where set, returns DSNs of the pooler in front of the
	// database (Facts.Pooled) whose pool holds one server connection:
	// dsn in the target's driver settings, and defaults in the driver's
	// default settings; or it ends t as DSN does. The tests of what a
	// pooled session keeps need it, and skip without it.
	PoolOfOne func(t testing.TB) (dsn, defaults string)
	// CachesStatements reports a driver that, in its default settings,
	// prepares each statement under a name and caches it per connection
	// (pgx), which a pooler without prepared-statement tracking breaks.
	CachesStatements bool
	// Measure is set on the targets that a measurement run on request
	// (TestUpgradeUnderLoad) measures through: one per server and driver
	// family.
	Measure bool
	// Facts are what the tests need to know of the database, embedded so
	// that a test reads them as its target's.
	Facts
}

// Options say what kind of pool [Target].Open opens.
type Options struct {
	// Conns bounds the pool's open connections.
	Conns int
	// Shared is set on the one pool per target that every test shares
	// (a test's own pools are small and short-lived): a target may count
	// its connections against a budget of the server's, and keep few of
	// them open unused, so that the suite's targets fit in the server's
	// connection limit together.
	Shared bool
	// Silent asks for a pool that sends nothing a statement does not
	// need: no ping when it hands out a connection. The tests that count
	// round trips through a proxy ask for it.
	Silent bool
}

// DB is a pool [Target].Open opened. Runner is all the suite needs: every
// test runs idem's calls through the Runner's [idem.Tx], [idem.Conn] and
// the Runner itself (the Store's methods named with On), and its own
// statements through the same values.
//
// A DB of [SQL] runs idem through database/sql instead, as its users
// call it (Do, Begin, Migrate, ... on the *sql.DB and its *sql.Tx), and
// runs the tests of what database/sql alone has (sqlx, a *sql.Conn). A
// DB may also offer what the suite looks for beside Runner, each an
// interface of one method: [Outsider], [WaitCounter].
type DB interface {
	// Runner is idem's Runner on the pool; the transactions of the
	// caller's work it begins (at sql.LevelDefault) have opts, nil for
	// the driver's defaults.
	Runner(opts *sql.TxOptions) idem.Runner
	// Close closes the pool.
	Close()
}

// Outsider is a [DB] that lists its driver's handles outside any
// transaction (its pool, a connection of it, and any wrapper of them its
// users hand to idem), by name: TestOnlyTransactionsAccepted checks that
// none of them is taken for a transaction. They are closed when t ends.
type Outsider interface {
	Outside(t testing.TB) map[string]any
}

// WaitCounter is a [DB] that counts how many times a request for one of
// its connections waited for another to be released: the tests that
// bound a pool's waits read it, and skip where a DB does not count them.
type WaitCounter interface {
	Waits() int64
}

// SQL is a [DB] of db, a database/sql pool opened with the driver named
// driverName (as sql.Open names it, and sqlx reads it). The suite runs
// idem through database/sql's methods on it.
func SQL(db *sql.DB, driverName string) DB { return newSQLPool(db, driverName) }

// Exercise runs the conformance suite on each target: every test of the
// suite as a subtest of t, TestStormRunsOnce for one, and in it a
// parallel subtest per target, TestStormRunsOnce/postgres-pgx. Each opens
// the target's shared pool on first use (Options.Shared, 40 connections)
// and makes tables of its own, which it drops.
//
// Exercise is meant to be called once per test binary, from a Test
// function. A test that needs what a target does not offer (a server
// session to kill, a pooler, a cluster's nodes, database/sql, a
// statement timeout) skips there, saying why; a target whose database is
// missing skips, or fails, as its DSN says.
func Exercise(t *testing.T, targets ...Target) {
	t.Helper()
	suiteTargets = targets
	t.Cleanup(closePools)
	for _, s := range suite {
		t.Run(s.name, s.test)
	}
}

// closePools closes the shared pools Exercise's targets opened.
func closePools() {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	for name, p := range pools {
		if p.db != nil {
			p.db.close()
		}
		delete(pools, name)
	}
}
