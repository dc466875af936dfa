package idempgx

import (
	"cmp"
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// This file is the Runner's pipelined transaction, the [idem.Pipeline]
// that idem.InPipelinedTx runs idemhttp's, idemgrpc's and the consumer
// middleware's handlers in, and RunTx its function. It takes a connection
// of the pool for itself, and sends its BEGIN in one pgx batch with the
// first of idem's statements (Do's claim), and the statement idem defers
// (Do's completion) in one with its COMMIT, where pgxpool's transaction
// sends each on its own: a Do with a fresh key costs two round trips
// fewer. The handler's pgx.Tx (TxFrom), and RunTx's function's, is the
// same transaction (lazyTx), whose statements go to pgx as they go
// through pgxpool's transaction, each after BEGIN, sent on its own if it
// has not gone yet, and after the deferred statement.

// acquirer takes a connection of a Runner's pool for one transaction and
// returns it, with the function that gives it back (nil for a *pgx.Conn,
// which is its own pool).
type acquirer func(ctx context.Context) (*pgx.Conn, func(), error)

// acquirerOf is db's acquirer, or nil for a Pool whose connections cannot
// be taken for a transaction (a type of the caller's): its transactions
// are pgx's own, begun with BeginTx.
func acquirerOf(db Pool) acquirer {
	switch p := db.(type) {
	case *pgxpool.Pool:
		return func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := p.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			return c.Conn(), c.Release, nil
		}
	case *pgx.Conn:
		return func(context.Context) (*pgx.Conn, func(), error) { return p, nil, nil }
	}
	return nil
}

// BeginPipeline returns a transaction at iso, with the options BeginTx
// gives it, that has sent nothing yet ([idem.Pipeline]): BEGIN goes with
// its first statement. It returns nil when r's pool is neither a
// *pgxpool.Pool nor a *pgx.Conn.
func (r *Runner) BeginPipeline(iso sql.IsolationLevel) idem.Pipeline {
	if r.acquire == nil {
		return nil
	}
	return pipeline{&lazyTx{acquire: r.acquire, opts: r.options(iso)}}
}

// lazyTx is a pipelined transaction: a pgx.Tx that begins when it first
// sends something, and sends the statements deferred to it (idem's
// Defer) ahead of anything else: with its COMMIT, in one batch. Like a
// pgx.Tx, it is not safe for concurrent use.
type lazyTx struct {
	acquire acquirer
	opts    pgx.TxOptions
	conn    *pgx.Conn // taken at the first statement
	release func()    // gives conn back; nil once given back, or for a *pgx.Conn
	tx      pgx.Tx    // pgx's transaction on conn, once BEGIN has gone
	ended   bool      // committed, rolled back, or failed to begin
	err     error     // why it failed to begin
	// deferred go ahead of the next statement or with the COMMIT, in
	// the order they were deferred.
	deferred []deferred
}

var (
	_ idem.Pipeliner = (*Runner)(nil)
	_ pgx.Tx         = (*lazyTx)(nil)
	_ idem.Pipeline  = pipeline{}
)

// deferred is a statement of idem.Pipeline's Defer, and what reads its
// result.
type deferred struct {
	q    idem.Query
	done func(error) error
}

// closedErr is what a statement of an ended t fails with: why it could
// not begin, or pgx's ErrTxClosed, as pgx's transaction does once it has
// been committed or rolled back.
func (t *lazyTx) closedErr() error {
	if t.err != nil {
		return t.err
	}
	return pgx.ErrTxClosed
}

// take takes the connection t runs on.
func (t *lazyTx) take(ctx context.Context) error {
	conn, release, err := t.acquire(ctx)
	if err != nil {
		t.fail(err)
		return err
	}
	t.conn, t.release = conn, release
	return nil
}

// fail ends t, which could not begin, for err.
func (t *lazyTx) fail(err error) {
	t.err = err
	t.end()
}

// end ends t and gives its connection back.
func (t *lazyTx) end() {
	t.ended, t.deferred = true, nil
	if t.release != nil {
		t.release()
		t.release = nil
	}
}

// ready begins t, with a BEGIN of its own, if it has not begun, and sends
// the statements deferred to it: what a statement of the caller's needs
// before it goes.
func (t *lazyTx) ready(ctx context.Context) error {
	switch {
	case t.ended:
		return t.closedErr()
	case t.tx == nil:
		if err := t.take(ctx); err != nil {
			return err
		}
		tx, err := t.conn.BeginTx(ctx, t.opts)
		if err != nil {
			t.fail(err)
			return err
		}
		t.tx = tx
	}
	return t.flush(ctx)
}

// flush sends the statements deferred to t, on their own.
func (t *lazyTx) flush(ctx context.Context) error {
	if len(t.deferred) == 0 {
		return nil
	}
	return t.sendDeferred(ctx, false)
}

// sendDeferred sends the statements deferred to t in one batch, with
// COMMIT (or the CommitQuery of t's options) after them when commit is
// set, and returns the error of the
// first whose done returns one; the statements after a failed one did not
// run, and their done is not called. A COMMIT that ran ends t, as pgx's
// Commit does: a COMMIT of a transaction that had failed reports that it
// rolled back, and one that failed on a connection left inside the
// transaction closes the connection. One that did not run, for a deferred
// statement that failed, is a rollback: t ends all the same.
func (t *lazyTx) sendDeferred(ctx context.Context, commit bool) error {
	ds := t.deferred
	t.deferred = nil
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(ds)+1)}
	for _, d := range ds {
		b.Queue(d.q.SQL, d.q.Args...)
	}
	if commit {
		b.Queue(cmp.Or(t.opts.CommitQuery, "commit"))
	}
	br := t.tx.SendBatch(ctx, b)
	var err error
	for _, d := range ds {
		_, qerr := br.Exec()
		if err = d.done(qerr); err != nil || qerr != nil {
			break
		}
	}
	ran := err == nil && commit
	if ran {
		var tag pgconn.CommandTag
		if tag, err = br.Exec(); err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case ran && err != nil && t.conn.PgConn().TxStatus() != 'I':
		_ = t.conn.Close(ctx)
	case commit && !ran:
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
	}
	if commit {
		t.end()
	}
	return err
}

// Commit commits t: with the statements deferred to it, in one batch, when
// there are any. A transaction that sent nothing has nothing to commit. A
// deferred statement that fails, or whose done returns an error, keeps
// the COMMIT from running, and t is rolled back: Commit ends t whatever
// its outcome, as pgx's does.
func (t *lazyTx) Commit(ctx context.Context) error {
	switch {
	case t.ended:
		return t.closedErr()
	case t.tx == nil:
		t.end()
		return nil
	case len(t.deferred) > 0:
		return t.sendDeferred(ctx, true)
	}
	err := t.tx.Commit(ctx)
	t.end()
	return err
}

// Rollback rolls t back, with the statements deferred to it, which have
// not been sent. A transaction that sent nothing has nothing to roll
// back.
func (t *lazyTx) Rollback(ctx context.Context) error {
	switch {
	case t.ended:
		return t.closedErr()
	case t.tx == nil:
		t.end()
		return nil
	}
	err := t.tx.Rollback(ctx)
	t.end()
	return err
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	if err := t.ready(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, rows)
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ready(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects begins t, if it has not begun, with no context: it has
// none. When t cannot begin, the LargeObjects fail as those of a
// transaction that has ended.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if err := t.ready(context.Background()); err != nil {
		b := &pgx.Batch{}
		b.BeginTx(t.opts)
		return pgx.FailedBatchResults(b, err).Tx().LargeObjects()
	}
	return t.tx.LargeObjects()
}

func (t *lazyTx) Prepare(ctx context.Context, name, query string) (*pgconn.StatementDescription, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, query)
}

func (t *lazyTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ready(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, query, args...)
}

// Query and QueryRow fail as pgx's do when t cannot begin: with rows, and
// a row, that return the error.
func (t *lazyTx) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	if err := t.ready(ctx); err != nil {
		return pgx.FailedBatchResults(&pgx.Batch{}, err).Query()
	}
	return t.tx.Query(ctx, query, args...)
}

func (t *lazyTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	if err := t.ready(ctx); err != nil {
		return pgx.FailedBatchResults(&pgx.Batch{}, err).QueryRow()
	}
	return t.tx.QueryRow(ctx, query, args...)
}

// Conn begins t, if it has not begun, with no context (it has none), and
// returns its connection: nil when none could be taken.
func (t *lazyTx) Conn() *pgx.Conn {
	_ = t.ready(context.Background())
	return t.conn
}

// pipeline is a lazyTx as an idem.Pipeline: idem's statements through it
// carry its BEGIN when they are its first.
type pipeline struct{ t *lazyTx }

func (p pipeline) Commit(ctx context.Context) error   { return p.t.Commit(ctx) }
func (p pipeline) Rollback(ctx context.Context) error { return p.t.Rollback(ctx) }

// Defer has q sent ahead of anything else p sends: with the COMMIT, in one
// batch, or on its own before another statement.
func (p pipeline) Defer(q idem.Query, done func(error) error) {
	p.t.deferred = append(p.t.deferred, deferred{q, done})
}

// Batch sends qs in one batch, with BEGIN first when p has not begun,
// after the statements deferred to it, sent on their own.
func (p pipeline) Batch(ctx context.Context, qs []idem.Query, read func(idem.Results) error) error {
	t := p.t
	if t.ended {
		return t.closedErr()
	}
	begins := t.tx == nil
	if begins {
		if err := t.take(ctx); err != nil {
			return err
		}
	} else if err := t.flush(ctx); err != nil {
		return err
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(qs)+1)}
	if begins {
		b.BeginTx(t.opts)
	}
	for _, q := range qs {
		b.Queue(q.SQL, q.Args...)
	}
	var br pgx.BatchResults
	if begins {
		br = t.conn.SendBatch(ctx, b)
		t.tx = br.Tx()
		if _, err := br.Exec(); err != nil { // BEGIN's
			_ = br.Close()
			t.fail(err)
			return err
		}
	} else {
		br = t.tx.SendBatch(ctx, b)
	}
	err := read(results{br})
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Exec sends q, with BEGIN when it is p's first statement.
func (p pipeline) Exec(ctx context.Context, q idem.Query) (int64, error) {
	switch t := p.t; {
	case t.ended:
		return 0, t.closedErr()
	case t.tx == nil:
		var n int64
		err := p.Batch(ctx, []idem.Query{q}, func(r idem.Results) (err error) {
			n, err = r.Exec()
			return err
		})
		return n, err
	}
	if err := p.t.flush(ctx); err != nil {
		return 0, err
	}
	return conn{p.t.tx}.Exec(ctx, q)
}

// QueryRow sends q, with BEGIN when it is p's first statement.
func (p pipeline) QueryRow(ctx context.Context, q idem.Query, dest ...any) error {
	switch t := p.t; {
	case t.ended:
		return t.closedErr()
	case t.tx == nil:
		return p.Batch(ctx, []idem.Query{q}, func(r idem.Results) error { return r.QueryRow(dest...) })
	}
	if err := p.t.flush(ctx); err != nil {
		return err
	}
	return conn{p.t.tx}.QueryRow(ctx, q, dest...)
}

// QueryRows sends q after BEGIN, on its own, when q is p's first
// statement: no call of idem's that runs in a pipelined transaction
// begins with one.
func (p pipeline) QueryRows(ctx context.Context, q idem.Query, each func(scan func(dest ...any) error) error) error {
	if err := p.t.ready(ctx); err != nil {
		return err
	}
	return conn{p.t.tx}.QueryRows(ctx, q, each)
}

// results are pgx's results of a batch as idem reads them.
type results struct{ br pgx.BatchResults }

func (r results) Exec() (int64, error) {
	tag, err := r.br.Exec()
	return tag.RowsAffected(), err
}

func (r results) QueryRow(dest ...any) error { return r.br.QueryRow().Scan(dest...) }
