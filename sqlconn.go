package idem

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem/internal/driver"
)

// query is one statement, whole, with its arguments in order.
type query = driver.Query

// sqlConn is database/sql's [driver.Conn]: it runs the engine's statements
// through a DBTX, or a handle with only its ExecContext and QueryContext
// (ent's Tx, through contrib/idement), each as its dialect has it sent:
// with its arguments as literals where lit says so. A native driver's
// package adapts its own handles to driver.Conn the same way (idempgx),
// and reaches the engine through native.go.
type sqlConn struct {
	db  driver.ExecQuerier
	lit func(query) query // the dialect's literals for db; nil: parameters
}

// newSQLConn is the sqlConn of db for dialect d, which is asked once how
// db's driver should be sent statements.
func newSQLConn(db driver.ExecQuerier, d Dialect) sqlConn { return sqlConn{db, d.literals(db)} }

// sent is q as the driver should be sent it.
func (c sqlConn) sent(q query) query {
	if c.lit == nil {
		return q
	}
	return c.lit(q)
}

// rowQuerier is what a DBTX has beside a driver.ExecQuerier.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var _ driver.Conn = sqlConn{}

func (c sqlConn) Exec(ctx context.Context, q query) (int64, error) {
	q = c.sent(q)
	res, err := c.db.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqlConn) QueryRow(ctx context.Context, q query, dest ...any) error {
	q = c.sent(q)
	if r, ok := c.db.(rowQuerier); ok {
		return r.QueryRowContext(ctx, q.SQL, q.Args...).Scan(dest...)
	}
	rows, err := c.db.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

func (c sqlConn) QueryRows(ctx context.Context, q query, each func(scan func(dest ...any) error) error) error {
	q = c.sent(q)
	rows, err := c.db.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return driver.EachRow(rows, each)
}

// sqlTx is database/sql's [driver.TxRunner]: Begin and Purge run their own
// short transactions on db with RunTx.
func sqlTx(db *sql.DB, d Dialect) driver.TxRunner {
	return func(ctx context.Context, iso sql.IsolationLevel, fn func(c driver.Conn) error) error {
		return RunTx(ctx, db, &sql.TxOptions{Isolation: iso}, func(tx *sql.Tx) error {
			return fn(newSQLConn(tx, d))
		})
	}
}
