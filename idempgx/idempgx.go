package idempgx

import (
	"context"
	"database/sql"
	"errors"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemserve"
)

// DBTX runs statements: pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it, as
// does the DBTX interface sqlc generates for pgx/v5.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pool is a pool that runs statements and begins transactions:
// *pgxpool.Pool, and *pgx.Conn for a single connection (which is not safe
// for concurrent use).
type Pool interface {
	DBTX
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

var (
	_ DBTX        = pgx.Tx(nil)
	_ Pool        = (*pgx.Conn)(nil)
	_ idem.Conn   = conn{}
	_ idem.Tx     = tx{}
	_ idem.Runner = (*Runner)(nil)
)

// Conn is db as an [idem.Conn], for the calls that run on any handle:
// [idem.Claim.ExtendOn], [idem.Claim.ReleaseOn], [idem.Store.MigrateOn],
// InspectOn, InspectKeyOn, StatsOn, and [idem.Store.WaitReplicatedOn]
// after the COMMIT of a transaction of the caller's (RunTx's). db may be
// a pool.
func Conn(db DBTX) idem.Conn {
	if isNil(db) {
		return nil
	}
	return conn{db}
}

// Tx is the caller's pgx transaction as an [idem.Tx], for
// [idem.Store.DoOn] and [idem.Claim.CompleteOn], which write the record
// through it so that it commits or rolls back with the caller's rows.
// idem never commits or rolls it back.
//
// The transaction of RunTx's function, or of a handler's TxFrom, is one
// that idempgx begins itself: Tx of it is its [idem.Pipeline], through
// which DoOn sends its claim with BEGIN and its completion with COMMIT.
func Tx(t pgx.Tx) idem.Tx {
	if isNil(t) {
		return nil
	}
	if t, ok := t.(*lazyTx); ok {
		return pipeline{t}
	}
	return tx{conn{t}}
}

// isNil reports whether h is nil, untyped or a nil pointer of any type (a
// caller's type around a pgx.Tx), so that Conn and Tx return nil for it
// and idem refuses it, before any statement, as it refuses a nil handle.
func isNil(h any) bool {
	if h == nil {
		return true
	}
	v := reflect.ValueOf(h)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Runner is a pgx pool as an [idem.Runner]: [idem.Store.BeginOn] and
// [idem.Store.PurgeOn] run their short transactions on it, and idemhttp,
// idemgrpc and the consumer middleware run their handlers' transactions
// on it, which the handlers reach with [TxFrom].
//
// On a *pgxpool.Pool or a *pgx.Conn it is an [idem.Pipeliner] too: the
// transactions those layers and RunTx run their work in send BEGIN in one
// round trip with the claim of [idem.Store.DoOn], and its completion in
// one with COMMIT ([Runner.BeginPipeline]).
type Runner struct {
	conn
	db      Pool
	opts    pgx.TxOptions
	acquire acquirer // nil: db cannot pipeline (pipeline.go)
}

// New returns the [Runner] of db, which must not be nil, whose
// transactions of the caller's work are begun with opts.
func New(db Pool, opts pgx.TxOptions) *Runner {
	return &Runner{conn: conn{db}, db: db, opts: opts, acquire: acquirerOf(db)}
}

// BeginTx begins a transaction on the pool: with the Runner's options for
// sql.LevelDefault, at iso and with none of them otherwise.
func (r *Runner) BeginTx(ctx context.Context, iso sql.IsolationLevel) (idem.Tx, error) {
	t, err := r.db.BeginTx(ctx, r.options(iso))
	if err != nil {
		return nil, err
	}
	return tx{conn{t}}, nil
}

// options are the options of a transaction at iso: the Runner's for
// sql.LevelDefault, and none but iso otherwise.
func (r *Runner) options(iso sql.IsolationLevel) pgx.TxOptions {
	if iso == sql.LevelDefault {
		return r.opts
	}
	return pgx.TxOptions{IsoLevel: isoLevels[iso]}
}

// Unwrap returns the pgx.Tx of t, a transaction r began, or nil for a Tx
// of another Runner's.
func (r *Runner) Unwrap(t idem.Tx) pgx.Tx {
	switch t := t.(type) {
	case pipeline:
		return t.t
	case tx:
		pt, _ := t.db.(pgx.Tx)
		return pt
	}
	return nil
}

// isoLevels are pgx's names of database/sql's isolation levels.
var isoLevels = map[sql.IsolationLevel]pgx.TxIsoLevel{
	sql.LevelReadUncommitted: pgx.ReadUncommitted,
	sql.LevelReadCommitted:   pgx.ReadCommitted,
	sql.LevelRepeatableRead:  pgx.RepeatableRead,
	sql.LevelSerializable:    pgx.Serializable,
}

// RunTx runs fn in a transaction on db begun with opts and commits it. When
// fn, the begin or the commit fails with an error for which
// [idem.IsRetryable] is true (40001, 40P01, 55P03, or idem's own report
// that the key changed hands), the transaction is rolled back and run
// again, as [idem.RunTx] runs it: up to 10 attempts in all, after a
// jittered exponential backoff. fn must not commit or roll back tx
// itself. A panic in fn rolls back and is passed on.
//
// The transaction is pipelined: it begins with its first statement, in
// the same round trip, and a [idem.Store.DoOn] in it sends its claim with
// BEGIN and its completion with COMMIT, after DoOn has returned. A
// completion that fails then fails the commit (nothing commits, and
// RunTx runs fn again when the claim was taken over): the result of a
// DoOn counts once RunTx has returned nil.
func RunTx(ctx context.Context, db Pool, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	if db == nil || fn == nil {
		return errors.New("idempgx: RunTx needs a *pgxpool.Pool or *pgx.Conn and a function")
	}
	r := New(db, opts)
	return idem.InPipelinedTx(ctx, r, sql.LevelDefault, func(t idem.Tx) error { return fn(r.Unwrap(t)) })
}

// TxFrom returns the pgx transaction the handler writes its rows through,
// behind idemhttp's middleware, idemgrpc's interceptor or the consumer
// middleware when their Runner is one of this package's; nil outside
// them, for a call they pass through, and behind one on database/sql
// (whose transaction is idemhttp.TxFrom's). The handler must not commit
// or roll it back: the layer does. In claim mode the first call begins
// it, so call it only once the slow work is done; it returns nil if it
// could not begin, and the layer then rolls back and answers an internal
// error in place of the handler's answer.
func TxFrom(ctx context.Context) pgx.Tx {
	t, _ := idemserve.TxFrom[pgx.Tx](ctx)
	return t
}

// conn runs idem's statements through a pgx handle. pgx's no-rows error
// wraps sql.ErrNoRows, which is what idem looks for.
type conn struct{ db DBTX }

func (c conn) Exec(ctx context.Context, q idem.Query) (int64, error) {
	tag, err := c.db.Exec(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (c conn) QueryRow(ctx context.Context, q idem.Query, dest ...any) error {
	return c.db.QueryRow(ctx, q.SQL, q.Args...).Scan(dest...)
}

func (c conn) QueryRows(ctx context.Context, q idem.Query, each func(scan func(dest ...any) error) error) error {
	rows, err := c.db.Query(ctx, q.SQL, q.Args...)
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

// tx is a pgx.Tx as an idem.Tx.
type tx struct{ conn }

func (t tx) Commit(ctx context.Context) error   { return t.db.(pgx.Tx).Commit(ctx) }
func (t tx) Rollback(ctx context.Context) error { return t.db.(pgx.Tx).Rollback(ctx) }
