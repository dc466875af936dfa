// Package containers is the container fallback of package testdb: where
// a server that the tests need is neither set in its variable nor running
// at its usual address, and a Docker daemon answers, it starts one in a
// throwaway container (postgres:16, mysql:8.4, mariadb:10.11: a
// Server's Image) and removes it when the tests end.
//
// It is a module of its own, apart from idemtest, because it brings
// dockertest and Docker's client: a module whose tests use only testdb
// (contrib's, an adapter's) puts none of them in its users' go.sum. A
// package opts in from its TestMain:
//
//	func TestMain(m *testing.M) { containers.Main(m) }
//
// idem's integration_test does; contrib's modules do not, and skip (or
// fail under IDEM_TEST_REQUIRE=1) where a server is missing.
package containers
