package conformance

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
)

// A test reaches its target's database through the handles below, which
// keep database/sql's method names, so that it reads the same whether the
// target runs idem through database/sql (a *sql.DB and its *sql.Tx) or
// natively through pgx (a *pgxpool.Pool and its pgx.Tx). The store
// (store.go) hands idem the driver's own handle behind them (through
// idempgx's adapters on pgx), and the business rows a test writes go
// through the same transaction as idem's record.

// handle runs statements: a pool or a transaction.
type handle interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	Exec(query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) row
	QueryRow(query string, args ...any) row
}

// row is the one row of a query: a *sql.Row or a pgx.Row.
type row interface {
	Scan(dest ...any) error
}

// rowSet is the rows of a query: *sql.Rows, or pgx.Rows.
type rowSet interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// pool is a target's connection pool: a *sql.DB or a *pgxpool.Pool.
type pool interface {
	handle
	Query(query string, args ...any) (rowSet, error)
	BeginTx(ctx context.Context, opts *sql.TxOptions) (txn, error)
	// runTx is idem.RunTx on a database/sql pool, idempgx.RunTx on a
	// native one: see the package function runTx.
	runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx txn) error) error
	// outside returns the driver's handles that are not inside a
	// transaction, by name, as idem (or idempgx) takes them; they are
	// closed when t ends.
	outside(t *testing.T) map[string]any
	close()
}

// txn is an open transaction: a *sql.Tx (or another database/sql
// transaction) or a pgx.Tx.
type txn interface {
	handle
	Commit() error
	Rollback() error
	// watched returns the transaction with before(query) called ahead of
	// every statement run through what it returns, idem's included.
	watched(before func(query string)) txn
}

// runTx runs fn in a transaction on db and commits it, retrying as
// idem.RunTx (or, on a native target, idempgx.RunTx) does.
func runTx(ctx context.Context, db pool, opts *sql.TxOptions, fn func(tx txn) error) error {
	return db.runTx(ctx, opts, fn)
}

// sqlHandle is a database/sql handle: a *sql.DB, a *sql.Tx, a *sqlx.Tx, a
// transaction a test began by hand (connTx), or a watcher of one.
type sqlHandle interface {
	idem.DBTX
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// sqlStatements runs statements through a database/sql handle, which is
// what idem gets for it.
type sqlStatements struct{ db sqlHandle }

func (s sqlStatements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return s.db.ExecContext(ctx, query, args...)
}

func (s sqlStatements) Exec(query string, args ...any) (sql.Result, error) {
	return s.db.ExecContext(ctx, query, args...)
}

func (s sqlStatements) QueryRowContext(ctx context.Context, query string, args ...any) row {
	return s.db.QueryRowContext(ctx, query, args...)
}

func (s sqlStatements) QueryRow(query string, args ...any) row {
	return s.db.QueryRowContext(ctx, query, args...)
}

// sqlPool is a database/sql target's pool, opened with the named driver.
type sqlPool struct {
	sqlStatements
	db     *sql.DB
	driver string
}

func newSQLPool(db *sql.DB, driver string) *sqlPool { return &sqlPool{sqlStatements{db}, db, driver} }

func (p *sqlPool) Query(query string, args ...any) (rowSet, error) {
	rows, err := p.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (p *sqlPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (txn, error) {
	tx, err := p.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return sqlTxn(tx), nil
}

func (p *sqlPool) runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx txn) error) error {
	return idem.RunTx(ctx, p.db, opts, func(tx *sql.Tx) error { return fn(sqlTxn(tx)) })
}

func (p *sqlPool) close() { _ = p.db.Close() }

func (p *sqlPool) outside(t *testing.T) map[string]any {
	conn, err := p.db.Conn(ctx)
	must(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	xdb := sqlx.NewDb(p.db, p.driver)
	xconn, err := xdb.Connx(ctx)
	must(t, err)
	t.Cleanup(func() { _ = xconn.Close() })
	return map[string]any{
		"*sql.DB":                      p.db,
		"*sql.Conn":                    conn,
		"*sqlx.DB":                     xdb,
		"*sqlx.Conn":                   xconn,
		"a struct embedding *sql.DB":   struct{ *sql.DB }{p.db},
		"a prepared pool":              preparedPool{p.db},
		"a DBTX forwarding to *sql.DB": forwarding{p.db},
	}
}

// preparedPool has the shape of GORM's *gorm.PreparedStmtDB: it embeds
// the pool, and its BeginTx returns an interface, not a *sql.Tx.
type preparedPool struct{ idem.DBTX }

func (p preparedPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (idem.DBTX, error) {
	return p.DBTX.(*sql.DB).BeginTx(ctx, opts)
}

// forwarding forwards DBTX's methods and QueryRowContext, and nothing
// else, to a pool.
type forwarding struct{ db *sql.DB }

func (f forwarding) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return f.db.ExecContext(ctx, query, args...)
}

func (f forwarding) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return f.db.QueryContext(ctx, query, args...)
}

func (f forwarding) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return f.db.QueryRowContext(ctx, query, args...)
}

// sqlEnder is a database/sql transaction: a *sql.Tx, a *sqlx.Tx, or one a
// test began by hand (connTx).
type sqlEnder interface {
	sqlHandle
	Commit() error
	Rollback() error
}

// sqlTx is a database/sql transaction: its statements run through db
// (the transaction itself, or a watcher of it), and end commits or rolls
// it back.
type sqlTx struct {
	sqlStatements
	end sqlEnder
}

// sqlTxn is tx as a txn.
func sqlTxn(tx sqlEnder) txn { return sqlTx{sqlStatements{tx}, tx} }

func (t sqlTx) Commit() error   { return t.end.Commit() }
func (t sqlTx) Rollback() error { return t.end.Rollback() }

func (t sqlTx) watched(before func(string)) txn {
	return sqlTx{sqlStatements{sqlWatched{t.db.(sqlEnder), before}}, t.end}
}

// sqlWatched calls before ahead of each statement it runs through the
// transaction it wraps, and ends that transaction: a transaction of the
// caller's own type, as idem accepts one.
type sqlWatched struct {
	sqlEnder
	before func(query string)
}

func (w sqlWatched) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	w.before(query)
	return w.sqlEnder.ExecContext(ctx, query, args...)
}

func (w sqlWatched) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	w.before(query)
	return w.sqlEnder.QueryContext(ctx, query, args...)
}

func (w sqlWatched) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	w.before(query)
	return w.sqlEnder.QueryRowContext(ctx, query, args...)
}

// pgxStatements runs statements through a pgx handle, which is what
// idempgx gets for it.
type pgxStatements struct{ db idempgx.DBTX }

func (s pgxStatements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := s.db.Exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxResult(tag), nil
}

func (s pgxStatements) Exec(query string, args ...any) (sql.Result, error) {
	return s.ExecContext(ctx, query, args...)
}

func (s pgxStatements) QueryRowContext(ctx context.Context, query string, args ...any) row {
	return s.db.QueryRow(ctx, query, args...)
}

func (s pgxStatements) QueryRow(query string, args ...any) row {
	return s.db.QueryRow(ctx, query, args...)
}

// pgxResult is a pgx command tag as database/sql's result.
type pgxResult pgconn.CommandTag

func (r pgxResult) RowsAffected() (int64, error) { return pgconn.CommandTag(r).RowsAffected(), nil }

func (pgxResult) LastInsertId() (int64, error) {
	return 0, errors.New("pgx has no last insert id: use RETURNING")
}

// pgxRows is pgx's rows with database/sql's Close.
type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// pgxPool is a native target's pool.
type pgxPool struct {
	pgxStatements
	db *pgxpool.Pool
}

func newPgxPool(db *pgxpool.Pool) *pgxPool { return &pgxPool{pgxStatements{db}, db} }

func (p *pgxPool) Query(query string, args ...any) (rowSet, error) {
	rows, err := p.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

func (p *pgxPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (txn, error) {
	tx, err := p.db.BeginTx(ctx, pgxOptions(opts))
	if err != nil {
		return nil, err
	}
	return pgxTxn(tx), nil
}

func (p *pgxPool) runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx txn) error) error {
	return idempgx.RunTx(ctx, p.db, pgxOptions(opts), func(tx pgx.Tx) error { return fn(pgxTxn(tx)) })
}

func (p *pgxPool) close() { p.db.Close() }

func (p *pgxPool) outside(t *testing.T) map[string]any {
	conn, err := p.db.Acquire(ctx)
	must(t, err)
	t.Cleanup(conn.Release)
	return map[string]any{
		"*pgxpool.Pool": p.db,
		"*pgxpool.Conn": conn,
		"*pgx.Conn":     conn.Conn(),
	}
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

// pgxTx is a pgx transaction (or a watcher of one).
type pgxTx struct {
	pgxStatements
	tx pgx.Tx
}

func pgxTxn(tx pgx.Tx) txn { return pgxTx{pgxStatements{tx}, tx} }

func (t pgxTx) Commit() error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback() error { return t.tx.Rollback(ctx) }

func (t pgxTx) watched(before func(string)) txn { return pgxTxn(pgxWatched{t.tx, before}) }

// pgxWatched calls before ahead of each statement it runs through Tx.
type pgxWatched struct {
	pgx.Tx
	before func(query string)
}

func (w pgxWatched) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	w.before(query)
	return w.Tx.Exec(ctx, query, args...)
}

func (w pgxWatched) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	w.before(query)
	return w.Tx.Query(ctx, query, args...)
}

func (w pgxWatched) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	w.before(query)
	return w.Tx.QueryRow(ctx, query, args...)
}
