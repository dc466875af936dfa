// Package driver is the seam between idem's engine (the claim algorithm and
// its statements, in package idem) and the database drivers it runs on.
// Package idem adapts database/sql to [Conn] itself; a native driver's
// package in this module (idempgx) adapts its own connections and
// transactions the same way, and reaches the engine through [Engine].
package driver

import "context"

// Query is one statement, whole, with its arguments in order.
type Query struct {
	SQL  string
	Args []any
}

// Conn runs idem's statements on one database handle.
type Conn interface {
	// Exec runs q and returns the number of rows it changed.
	Exec(ctx context.Context, q Query) (int64, error)
	// QueryRow runs q and scans its first row into dest; an error that
	// wraps sql.ErrNoRows when there is none.
	QueryRow(ctx context.Context, q Query, dest ...any) error
	// QueryRows runs q and calls each once per row, with the function
	// that scans that row.
	QueryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error
}
