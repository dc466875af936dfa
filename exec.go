package idem

import "context"

// conn runs idem's statements. It is the one interface between the claim
// algorithm and a database handle: sqlConn adapts database/sql's DBTX to
// it, and a native driver's transaction can be adapted the same way.
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

// sqlConn runs statements through a database/sql handle, each as its
// dialect has it sent (inline).
type sqlConn struct {
	db DBTX
	d  Dialect
}

func (c sqlConn) exec(ctx context.Context, q query) (int64, error) {
	q = c.d.inline(q)
	res, err := c.db.ExecContext(ctx, q.sql, q.args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqlConn) queryRow(ctx context.Context, q query, dest ...any) error {
	q = c.d.inline(q)
	return c.db.QueryRowContext(ctx, q.sql, q.args...).Scan(dest...)
}

func (c sqlConn) queryRows(ctx context.Context, q query, each func(scan func(dest ...any) error) error) error {
	q = c.d.inline(q)
	rows, err := c.db.QueryContext(ctx, q.sql, q.args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

var _ conn = sqlConn{}
