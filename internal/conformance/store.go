package conformance

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempgx"
)

// store is the *idem.Store a test runs, called through its target's
// driver: database/sql, or idempgx on a native target. Its methods are
// idem's, on the suite's handles (handles.go).
type store struct {
	idem *idem.Store
	pgx  *idempgx.Store // on a native target; nil on the others
}

// onDriver is s called through the target's driver.
func (e *env) onDriver(s *idem.Store) *store {
	e.t.Helper()
	if !e.native {
		return &store{idem: s}
	}
	ps, err := idempgx.New(s)
	if err != nil {
		e.t.Fatalf("idempgx: %v", err)
	}
	return &store{idem: s, pgx: ps}
}

func (s *store) Table() string { return s.idem.Table() }

func (s *store) Do(ctx context.Context, tx txn, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	if s.pgx != nil {
		return s.pgx.Do(ctx, pgxTxOf(tx), req, fn)
	}
	return s.idem.Do(ctx, sqlOf(tx), req, fn)
}

func (s *store) Begin(ctx context.Context, db pool, req idem.Request) (*claim, *idem.Result, error) {
	if s.pgx != nil {
		c, replay, err := s.pgx.Begin(ctx, pgxPoolOf(db), req)
		if c == nil {
			return nil, replay, err
		}
		return &claim{pgx: c}, nil, nil
	}
	c, replay, err := s.idem.Begin(ctx, sqlDBOf(db), req)
	if c == nil {
		return nil, replay, err
	}
	return &claim{idem: c}, nil, nil
}

func (s *store) Migrate(ctx context.Context, db handle) error {
	if s.pgx != nil {
		return s.pgx.Migrate(ctx, pgxOf(db))
	}
	return s.idem.Migrate(ctx, sqlOf(db))
}

func (s *store) Purge(ctx context.Context, db pool, batch int) (int64, error) {
	if s.pgx != nil {
		return s.pgx.Purge(ctx, pgxPoolOf(db), batch)
	}
	return s.idem.Purge(ctx, sqlDBOf(db), batch)
}

func (s *store) PurgeBatch(ctx context.Context, db pool, limit int) (int64, error) {
	if s.pgx != nil {
		return s.pgx.PurgeBatch(ctx, pgxPoolOf(db), limit)
	}
	return s.idem.PurgeBatch(ctx, sqlDBOf(db), limit)
}

func (s *store) Inspect(ctx context.Context, db handle, scope, key string) (*idem.Record, error) {
	if s.pgx != nil {
		return s.pgx.Inspect(ctx, pgxOf(db), scope, key)
	}
	return s.idem.Inspect(ctx, sqlOf(db), scope, key)
}

func (s *store) Stats(ctx context.Context, db handle) (idem.Stats, error) {
	if s.pgx != nil {
		return s.pgx.Stats(ctx, pgxOf(db))
	}
	return s.idem.Stats(ctx, sqlOf(db))
}

// claim is a claim from store.Begin, on the same driver.
type claim struct {
	idem *idem.Claim
	pgx  *idempgx.Claim // on a native target, instead of idem
}

func (c *claim) Token() int64 {
	if c.pgx != nil {
		return c.pgx.Token()
	}
	return c.idem.Token()
}

func (c *claim) RelayKey() string {
	if c.pgx != nil {
		return c.pgx.RelayKey()
	}
	return c.idem.RelayKey()
}

func (c *claim) Extend(ctx context.Context, db handle, d time.Duration) error {
	if c.pgx != nil {
		return c.pgx.Extend(ctx, pgxOf(db), d)
	}
	return c.idem.Extend(ctx, sqlOf(db), d)
}

func (c *claim) Complete(ctx context.Context, tx handle, resp idem.Response) error {
	if c.pgx != nil {
		return c.pgx.Complete(ctx, pgxOf(tx), resp)
	}
	return c.idem.Complete(ctx, sqlOf(tx), resp)
}

// completeOn is Complete on h, a handle of any type the driver's Complete
// takes.
func (c *claim) completeOn(h any) error {
	resp := idem.Response{StatusCode: 201}
	if c.pgx != nil {
		return c.pgx.Complete(ctx, h.(idempgx.DBTX), resp)
	}
	return c.idem.Complete(ctx, h.(idem.DBTX), resp)
}

func (c *claim) Release(ctx context.Context, db handle) error {
	if c.pgx != nil {
		return c.pgx.Release(ctx, pgxOf(db))
	}
	return c.idem.Release(ctx, sqlOf(db))
}

// The driver's own handle behind a suite handle, for idem or idempgx: nil
// for nil, and for a handle of the other driver, which idem then refuses.

func sqlOf(h handle) idem.DBTX {
	switch h := h.(type) {
	case *sqlPool:
		return h.db
	case sqlTx:
		return h.sqlStatements.db
	}
	return nil
}

func sqlDBOf(db pool) *sql.DB {
	if p, ok := db.(*sqlPool); ok {
		return p.db
	}
	return nil
}

func pgxOf(h handle) idempgx.DBTX {
	switch h := h.(type) {
	case *pgxPool:
		return h.db
	case pgxTx:
		return h.tx
	}
	return nil
}

func pgxTxOf(tx txn) pgx.Tx {
	if t, ok := tx.(pgxTx); ok {
		return t.tx
	}
	return nil
}

func pgxPoolOf(db pool) idempgx.TxBeginner {
	if p, ok := db.(*pgxPool); ok {
		return p.db
	}
	return nil
}
