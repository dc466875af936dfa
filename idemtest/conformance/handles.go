package conformance

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem"
)

// A test reaches its target's database through the handles below, which
// keep database/sql's method names, so that it reads the same whether the
// target runs idem through database/sql (a *sql.DB and its *sql.Tx: a DB
// of SQL) or through its Runner (idem.Runner, and the idem.Tx it begins:
// idempgx's on a *pgxpool.Pool, or a third party's). The store (store.go)
// hands idem the handle behind them, and the business rows a test writes
// go through the same transaction as idem's record.

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

// pool is a target's connection pool: a DB of SQL, or a DB's Runner.
type pool interface {
	handle
	// QueryRows runs query and calls each once per row, as idem.Conn's
	// QueryRows does.
	QueryRows(query string, args []any, each func(scan func(dest ...any) error) error) error
	BeginTx(ctx context.Context, opts *sql.TxOptions) (txn, error)
	// runTx is idem.RunTx on a database/sql pool, idem.InPipelinedTx on
	// a Runner's (which is idempgx.RunTx on pgx's): see the package
	// function runTx.
	runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx txn) error) error
	// outside returns the driver's handles that are not inside a
	// transaction, by name, as idem (or the driver's adapter) takes them;
	// they are closed when t ends. None where the DB lists none
	// (Outsider).
	outside(t *testing.T) map[string]any
	// waits counts the waits for a connection (WaitCounter), or skips
	// the test where the DB does not count them.
	waits(t *testing.T) int64
	// runner is idem's Runner on the pool (DB.Runner).
	runner(opts *sql.TxOptions) idem.Runner
	close()
}

// poolOf is the suite's pool of db.
func poolOf(db DB) pool {
	if p, ok := db.(*sqlPool); ok {
		return p
	}
	return &runnerPool{connStatements{db.Runner(nil)}, db}
}

// txn is an open transaction: a *sql.Tx (or another database/sql
// transaction) or an idem.Tx.
type txn interface {
	handle
	Commit() error
	Rollback() error
	// watched returns the transaction with before(query) called ahead of
	// every statement run through what it returns, idem's included.
	watched(before func(query string)) txn
}

// runTx runs fn in a transaction on db and commits it, retrying as
// idem.RunTx (or, through a Runner, idem.InPipelinedTx) does.
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

func (p *sqlPool) QueryRows(query string, args []any, each func(scan func(dest ...any) error) error) error {
	rows, err := p.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			_ = rows.Close()
			return err
		}
	}
	return errors.Join(rows.Err(), rows.Close())
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

// Runner and Close make a sqlPool the DB that SQL returns.

func (p *sqlPool) Runner(opts *sql.TxOptions) idem.Runner { return p.runner(opts) }

func (p *sqlPool) runner(opts *sql.TxOptions) idem.Runner { return idem.NewSQLRunner(p.db, opts) }

func (p *sqlPool) Close() { p.close() }

func (p *sqlPool) waits(*testing.T) int64 { return p.db.Stats().WaitCount }

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

// connStatements runs statements through an idem.Conn: a Runner, or a
// transaction it began.
type connStatements struct{ db idem.Conn }

func (s connStatements) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	n, err := s.db.Exec(ctx, idem.Query{SQL: query, Args: args})
	if err != nil {
		return nil, err
	}
	return changed(n), nil
}

func (s connStatements) Exec(query string, args ...any) (sql.Result, error) {
	return s.ExecContext(ctx, query, args...)
}

func (s connStatements) QueryRowContext(ctx context.Context, query string, args ...any) row {
	return connRow{ctx, s.db, idem.Query{SQL: query, Args: args}}
}

func (s connStatements) QueryRow(query string, args ...any) row {
	return s.QueryRowContext(ctx, query, args...)
}

// changed is the count of rows a statement changed as database/sql's
// result.
type changed int64

func (n changed) RowsAffected() (int64, error) { return int64(n), nil }

func (changed) LastInsertId() (int64, error) {
	return 0, errors.New("an idem.Conn returns no last insert id: use RETURNING")
}

// connRow is a query's one row, read when it is scanned.
type connRow struct {
	ctx context.Context
	db  idem.Conn
	q   idem.Query
}

func (r connRow) Scan(dest ...any) error { return r.db.QueryRow(r.ctx, r.q, dest...) }

// runnerPool is the pool of a target whose DB is not database/sql's: its
// statements, and idem's, run through the DB's Runner.
type runnerPool struct {
	connStatements
	db DB
}

func (p *runnerPool) QueryRows(query string, args []any, each func(scan func(dest ...any) error) error) error {
	return p.connStatements.db.QueryRows(ctx, idem.Query{SQL: query, Args: args}, each)
}

func (p *runnerPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (txn, error) {
	tx, err := p.db.Runner(opts).BeginTx(ctx, sql.LevelDefault)
	if err != nil {
		return nil, err
	}
	return runnerTxn(tx), nil
}

func (p *runnerPool) runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx txn) error) error {
	return idem.InPipelinedTx(ctx, p.db.Runner(opts), sql.LevelDefault, func(tx idem.Tx) error { return fn(runnerTxn(tx)) })
}

func (p *runnerPool) close() { p.db.Close() }

func (p *runnerPool) outside(t *testing.T) map[string]any {
	if o, ok := p.db.(Outsider); ok {
		return o.Outside(t)
	}
	return nil
}

func (p *runnerPool) waits(t *testing.T) int64 {
	t.Helper()
	w, ok := p.db.(WaitCounter)
	if !ok {
		t.Skip("the target's DB does not count the waits for its connections (WaitCounter)")
	}
	return w.Waits()
}

// runner is the pool's Runner with opts.
func (p *runnerPool) runner(opts *sql.TxOptions) idem.Runner { return p.db.Runner(opts) }

// runnerTx is a transaction a Runner began (or a watcher of one).
type runnerTx struct {
	connStatements
	tx idem.Tx
}

func runnerTxn(tx idem.Tx) txn { return runnerTx{connStatements{tx}, tx} }

func (t runnerTx) Commit() error   { return t.tx.Commit(ctx) }
func (t runnerTx) Rollback() error { return t.tx.Rollback(ctx) }

func (t runnerTx) watched(before func(string)) txn { return runnerTxn(txWatched{t.tx, before}) }

// txWatched calls before ahead of each statement it runs through Tx.
type txWatched struct {
	idem.Tx
	before func(query string)
}

func (w txWatched) Exec(ctx context.Context, q idem.Query) (int64, error) {
	w.before(q.SQL)
	return w.Tx.Exec(ctx, q)
}

func (w txWatched) QueryRow(ctx context.Context, q idem.Query, dest ...any) error {
	w.before(q.SQL)
	return w.Tx.QueryRow(ctx, q, dest...)
}

func (w txWatched) QueryRows(ctx context.Context, q idem.Query, each func(scan func(dest ...any) error) error) error {
	w.before(q.SQL)
	return w.Tx.QueryRows(ctx, q, each)
}
