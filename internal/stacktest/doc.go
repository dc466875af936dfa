// Package stacktest holds the checks that every stack a Go service keeps
// its transactions in must pass with idem, written once and run by the
// tests of each integration (the root module's and those under contrib/)
// on real servers. Its names say which stacks they are for: the ORM and
// query builder checks (ORM..., RunORM) are in orm.go, the HTTP router
// checks (HTTP..., RunHTTP, RunHTTPRetry) in http.go.
package stacktest
