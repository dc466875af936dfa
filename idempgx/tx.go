package idempgx

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/driver"
)

// RunTx runs fn in a transaction on db begun with opts and commits it. When
// fn, the begin or the commit fails with an error for which
// [idem.IsRetryable] is true (40001, 40P01, 55P03, or idem's own report
// that the key changed hands), the transaction is rolled back and run
// again, up to 10 attempts in all, after a jittered exponential backoff,
// exactly as [idem.RunTx] does. fn must not commit or roll back tx itself.
// A panic in fn rolls back and is passed on.
func RunTx(ctx context.Context, db TxBeginner, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	if db == nil || fn == nil {
		return errors.New("idempgx: RunTx needs a *pgxpool.Pool or *pgx.Conn and a function")
	}
	return idem.Retry(ctx, func() error {
		tx, err := db.BeginTx(ctx, opts)
		return driver.Attempt(ctx, tx, err, fn)
	})
}

// txRunner runs the engine's own short transactions (Begin's, Purge's)
// on db with RunTx.
func txRunner(db TxBeginner) driver.TxRunner {
	return func(ctx context.Context, iso sql.IsolationLevel, fn func(c driver.Conn) error) error {
		return RunTx(ctx, db, pgx.TxOptions{IsoLevel: isoLevels[iso]}, func(tx pgx.Tx) error {
			return fn(conn{tx})
		})
	}
}

// isoLevels are pgx's names of database/sql's isolation levels; the
// default level is the empty name.
var isoLevels = map[sql.IsolationLevel]pgx.TxIsoLevel{
	sql.LevelReadUncommitted: pgx.ReadUncommitted,
	sql.LevelReadCommitted:   pgx.ReadCommitted,
	sql.LevelRepeatableRead:  pgx.RepeatableRead,
	sql.LevelSerializable:    pgx.Serializable,
}

// conn runs the engine's statements through a pgx handle. pgx's no-rows
// error wraps sql.ErrNoRows, which is what the engine looks for.
type conn struct{ db DBTX }

func (c conn) Exec(ctx context.Context, q driver.Query) (int64, error) {
	tag, err := c.db.Exec(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (c conn) QueryRow(ctx context.Context, q driver.Query, dest ...any) error {
	return c.db.QueryRow(ctx, q.SQL, q.Args...).Scan(dest...)
}

func (c conn) QueryRows(ctx context.Context, q driver.Query, each func(scan func(dest ...any) error) error) error {
	rows, err := c.db.Query(ctx, q.SQL, q.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return driver.EachRow(rows, each)
}

var (
	_ driver.Conn = conn{}
	_ DBTX        = pgx.Tx(nil)
	_ DBTX        = (*pgx.Conn)(nil)
	_ TxBeginner  = (*pgx.Conn)(nil)
)
