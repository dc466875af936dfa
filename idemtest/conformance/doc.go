// Package conformance is idem's conformance suite: 119 behaviour tests
// (claims, replays, storms of duplicates, fencing, retention and key
// memory, sealed responses, migrations and upgrades from every earlier
// schema, purges under load, faults injected mid-transaction, pipelined
// transactions, idemhttp's middleware, ...) that any target, a database
// through a driver, runs with one call:
//
//	func TestConformance(t *testing.T) {
//		conformance.Exercise(t, conformance.Target{
//			Name:    "postgres-mydriver",
//			Dialect: idem.Postgres,
//			DSN:     func(t testing.TB) string { return testdb.Postgres.DSN(t) },
//			Open:    openMyDriver, // a DB whose Runner is the driver's adapter
//			Facts:   conformance.PostgresFacts(),
//		})
//	}
//
// idem runs it on each of its own targets (module integration_test,
// targets_test.go: lib/pq, pgx's database/sql driver and pgx itself on
// PostgreSQL and behind PgBouncer, go-sql-driver/mysql on MySQL, MariaDB,
// TiDB and a Galera cluster, modernc.org/sqlite), and on an adapter
// written outside the root module (ExampleExercise,
// TestThirdPartyAdapter), as a third party's adapter or dialect runs it.
//
// A [Target] is data: its name, its dialect, its DSN, an Open that opens
// a pool on it ([DB]), and the [Facts] of its database. A test reaches
// idem through the DB's [idem.Runner]: the Store's methods named with On,
// on the Runner, the [idem.Tx] it begins and the [idem.Conn] both are; a
// DB of [SQL] runs idem through database/sql's own methods instead, as
// its users call it. No test asks which target it runs on: it reads the
// Target and its Facts, and what a target does not offer (a server
// session to kill, a statement timeout, a pooler, a cluster's nodes,
// database/sql's handles, pipelined transactions) skips the tests that
// need it, saying so. [PostgresFacts], [MySQLFacts], [TiDBFacts],
// [SQLiteFacts] and [GaleraFacts] are the facts of the databases idem
// has a dialect for; a new database is a new Facts value.
//
// Each test is a subtest of Exercise's t, and in it a parallel subtest
// per target (TestStormRunsOnce/postgres-pgx), on tables of its own,
// which it drops. A target's shared pool holds up to 40 connections
// ([Options].Shared, which a target may count against a budget of its
// server's: integration_test's PostgreSQL targets share 36); a test
// opens small pools of its own beside it. A target on a cluster
// ([Target].Cluster) runs the tests written for a cluster by default
// when its facts say why the rest is on request (Facts.SuiteOnRequest),
// and the whole suite with IDEM_TEST_CLUSTER_SUITE=1. IDEM_SOAK runs the
// fault history longer (docs/reliability.md).
//
// The package is a module of its own, so that the drivers' packages it
// reads errors and DSNs with (pgx's pgconn, go-sql-driver/mysql) and sqlx
// reach none of idemtest's or contrib's users.
package conformance
