package idem

import (
	"context"

	"github.com/idemkit/idem/internal/driver"
)

// query is one statement, whole, with its arguments in order.
type query = driver.Query

// conn runs idem's statements. It is the one interface between the claim
// algorithm and a database handle: sqlConn adapts database/sql's DBTX to
// it (tx.go), and a native driver's [driver.Conn] is adapted by nativeConn.
type conn interface {
	// exec runs q and returns the number of rows it changed.
	exec(ctx context.Context, q query) (int64, error)
	// queryRow runs q and scans its first row into dest; sql.ErrNoRows
	// when there is none.
	queryRow(ctx context.Context, q query, dest ...any) error
	// queryRows runs q and calls each once per row, with the function
	// that scans that row.
	queryRows(ctx context.Context, q query, each func(scan func(dest ...any) error) error) error
}
