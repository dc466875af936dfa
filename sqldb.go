package idem

import (
	"context"
	"database/sql"
	"fmt"
)

// This file is database/sql's adapter to the seam (conn.go): the methods
// of Store and Claim that take a DBTX or a *sql.DB run their operation
// through it, and NewSQLRunner hands a *sql.DB to the layers that take a
// Runner.

// sqlConn is database/sql's [Conn]: it runs statements through a DBTX, a
// *sql.DB included.
type sqlConn struct{ db DBTX }

var (
	_ Conn   = sqlConn{}
	_ Tx     = sqlTx{}
	_ Runner = (*SQLRunner)(nil)
)

func (c sqlConn) Exec(ctx context.Context, q Query) (int64, error) {
	res, err := c.db.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// rowQuerier is what *sql.DB, *sql.Tx and *sql.Conn have beside a DBTX's
// methods: their QueryRowContext reads one row with no more work than
// QueryContext.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (c sqlConn) QueryRow(ctx context.Context, q Query, dest ...any) error {
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

func (c sqlConn) QueryRows(ctx context.Context, q Query, each func(scan func(dest ...any) error) error) error {
	rows, err := c.db.QueryContext(ctx, q.SQL, q.Args...)
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

// sqlHandle returns the database/sql handle c runs on, for the dialect
// that sends statements to some drivers with their arguments written in
// (Dialect.literals).
func (c sqlConn) sqlHandle() DBTX { return c.db }

// sqlTx is a DBTX that is a transaction (txOf has checked that it is one)
// as a [Tx]. Commit and Rollback call its own, with or without a context.
type sqlTx struct{ sqlConn }

func (t sqlTx) Commit(ctx context.Context) error {
	switch tx := t.db.(type) {
	case interface{ Commit() error }:
		return tx.Commit()
	case interface{ Commit(context.Context) error }:
		return tx.Commit(ctx)
	}
	return fmt.Errorf("idem: %T has no Commit method that idem can call", t.db)
}

func (t sqlTx) Rollback(ctx context.Context) error {
	switch tx := t.db.(type) {
	case interface{ Rollback() error }:
		return tx.Rollback()
	case interface{ Rollback(context.Context) error }:
		return tx.Rollback(ctx)
	}
	return fmt.Errorf("idem: %T has no Rollback method that idem can call", t.db)
}

// SQLRunner is a *sql.DB as a [Runner]: its statements run on the pool,
// and it begins *sql.Tx transactions, with the options it was made with
// for the caller's work. idemhttp, idemgrpc and the consumer middleware
// make one of their Config's DB and TxOptions; pass one yourself where a
// layer takes a Runner.
type SQLRunner struct {
	sqlConn
	db   *sql.DB
	opts *sql.TxOptions
}

// NewSQLRunner returns the [Runner] of db, which must not be nil, whose
// transactions of the caller's work are begun with opts (nil: the
// database's defaults).
func NewSQLRunner(db *sql.DB, opts *sql.TxOptions) *SQLRunner {
	return &SQLRunner{sqlConn: sqlConn{db}, db: db, opts: opts}
}

// BeginTx begins a transaction on the pool: with the Runner's options for
// sql.LevelDefault, at iso otherwise.
func (r *SQLRunner) BeginTx(ctx context.Context, iso sql.IsolationLevel) (Tx, error) {
	opts := r.opts
	if iso != sql.LevelDefault {
		opts = &sql.TxOptions{Isolation: iso}
	}
	tx, err := r.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return sqlTx{sqlConn{tx}}, nil
}

// Unwrap returns the *sql.Tx of tx, a transaction r began, or nil for a
// Tx of another Runner's.
func (r *SQLRunner) Unwrap(tx Tx) *sql.Tx {
	t, _ := tx.(sqlTx)
	sqlTx, _ := t.db.(*sql.Tx)
	return sqlTx
}
