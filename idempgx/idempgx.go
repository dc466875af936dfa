package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/driver"
	"github.com/idemkit/idem/internal/engine"
)

// DBTX runs statements: pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it, as
// does the DBTX interface sqlc generates for pgx/v5.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TxBeginner begins transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// eng is package idem's engine, which runs every operation over pgx's
// handles (conn, txRunner).
var eng = engine.E

// Store is an [*idem.Store] run over pgx. It holds no connections and is
// safe for concurrent use.
type Store struct {
	s *idem.Store
}

// New returns a Store that runs s over pgx. s must be for [idem.Postgres].
func New(s *idem.Store) (*Store, error) {
	switch {
	case s == nil:
		return nil, errors.New("idempgx: New needs an *idem.Store, got nil")
	case s.Dialect() != idem.Postgres:
		return nil, fmt.Errorf("idempgx: New needs a Store for idem.Postgres, got one for %s", s.Dialect().Name())
	}
	return &Store{s: s}, nil
}

// Idem returns the [*idem.Store] s runs: the same table, lease, retention
// and Observer, for the database/sql side of a service.
func (s *Store) Idem() *idem.Store { return s.s }

// Do is [idem.Store.Do] inside the caller's pgx transaction tx: it runs fn
// at most once per (Scope, Key) among all transactions that commit, and
// writes the record through tx, so that it commits or rolls back with the
// caller's own rows. Its results and errors are Do's.
func (s *Store) Do(ctx context.Context, tx pgx.Tx, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	if tx == nil {
		return idem.Result{}, errors.New("idempgx: Do needs an open pgx.Tx, got nil")
	}
	return eng.Do(ctx, s.s, conn{tx}, req, fn)
}

// Begin is [idem.Store.Begin] on db: it commits a PROCESSING claim in a
// short transaction of its own, retried as [RunTx] retries, and returns
// exactly one of a claim, a replay and an error.
func (s *Store) Begin(ctx context.Context, db TxBeginner, req idem.Request) (*Claim, *idem.Result, error) {
	if db == nil {
		return nil, nil, errors.New("idempgx: Begin needs a *pgxpool.Pool or *pgx.Conn, got nil")
	}
	c, replay, err := eng.Begin(ctx, s.s, txRunner(db), req)
	if c == nil {
		return nil, replay, err
	}
	return &Claim{c: c}, nil, nil
}

// Migrate is [idem.Store.Migrate] on db.
func (s *Store) Migrate(ctx context.Context, db DBTX) error {
	if db == nil {
		return errors.New("idempgx: Migrate needs a database handle, got nil")
	}
	return eng.Migrate(ctx, s.s, conn{db})
}

// Purge is [idem.Store.Purge] on db: each batch's DELETE in a short READ
// COMMITTED transaction of its own. To run batches from several goroutines
// at once, pass a *pgxpool.Pool: a *pgx.Conn is not safe for concurrent use.
func (s *Store) Purge(ctx context.Context, db TxBeginner, batch int) (int64, error) {
	if db == nil {
		return 0, errors.New("idempgx: Purge needs a *pgxpool.Pool or *pgx.Conn, got nil")
	}
	return eng.Purge(ctx, s.s, txRunner(db), batch)
}

// PurgeBatch is [idem.Store.PurgeBatch] on db.
func (s *Store) PurgeBatch(ctx context.Context, db TxBeginner, limit int) (int64, error) {
	if db == nil {
		return 0, errors.New("idempgx: PurgeBatch needs a *pgxpool.Pool or *pgx.Conn, got nil")
	}
	return eng.PurgeBatch(ctx, s.s, txRunner(db), limit)
}

// Inspect is [idem.Store.Inspect] on db.
func (s *Store) Inspect(ctx context.Context, db DBTX, scope, key string) (*idem.Record, error) {
	if db == nil {
		return nil, errors.New("idempgx: Inspect needs a database handle, got nil")
	}
	return eng.Inspect(ctx, s.s, conn{db}, scope, key)
}

// InspectKey is [idem.Store.InspectKey] on db: the records of key in every
// scope, at most limit, read with a scan of the whole table.
func (s *Store) InspectKey(ctx context.Context, db DBTX, key string, limit int) ([]idem.Record, error) {
	if db == nil {
		return nil, errors.New("idempgx: InspectKey needs a database handle, got nil")
	}
	return eng.InspectKey(ctx, s.s, conn{db}, key, limit)
}

// Stats is [idem.Store.Stats] on db.
func (s *Store) Stats(ctx context.Context, db DBTX) (idem.Stats, error) {
	if db == nil {
		return idem.Stats{}, errors.New("idempgx: Stats needs a database handle, got nil")
	}
	return eng.Stats(ctx, s.s, conn{db})
}

// Claim is an [*idem.Claim] whose methods run over pgx: the right to run
// one operation, committed by [Store.Begin], fenced on its token.
type Claim struct {
	c *idem.Claim
}

// Token is the claim's fencing token ([idem.Claim.Token]).
func (c *Claim) Token() int64 { return c.c.Token() }

// RelayKey is the key to pass on to the downstream provider
// ([idem.Claim.RelayKey]).
func (c *Claim) RelayKey() string { return c.c.RelayKey() }

// Extend is [idem.Claim.Extend] on db (a pool works).
func (c *Claim) Extend(ctx context.Context, db DBTX, d time.Duration) error {
	if err := c.check(db, "Extend"); err != nil {
		return err
	}
	return eng.Extend(ctx, c.c, conn{db}, d)
}

// Complete is [idem.Claim.Complete] in tx, the transaction that writes
// the operation's business rows: a pgx.Tx. A *pgxpool.Pool, *pgxpool.Conn
// or *pgx.Conn is refused before any statement, since each statement
// through it would commit on its own.
func (c *Claim) Complete(ctx context.Context, tx DBTX, resp idem.Response) error {
	if err := c.check(tx, "Complete"); err != nil {
		return err
	}
	if why := driver.NotTx(tx); why != "" {
		return fmt.Errorf("idempgx: Complete needs an open transaction, %s", why)
	}
	return eng.Complete(ctx, c.c, conn{tx}, resp)
}

// Release is [idem.Claim.Release] on db (a pool works).
func (c *Claim) Release(ctx context.Context, db DBTX) error {
	if err := c.check(db, "Release"); err != nil {
		return err
	}
	return eng.Release(ctx, c.c, conn{db})
}

func (c *Claim) check(db DBTX, method string) error {
	switch {
	case c == nil || c.c == nil:
		return fmt.Errorf("idempgx: %s on a nil Claim; use the claim Begin returned", method)
	case db == nil:
		return fmt.Errorf("idempgx: %s needs a database handle, got nil", method)
	}
	return nil
}
