package conformance

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idem"
)

// store is the *idem.Store a test runs, called as the users of its
// target's driver call it: through the methods that take database/sql's
// handles (Do, Begin, Extend, ...) on a target whose DB is SQL's, and
// through the methods named with On and the Runner's values (idem.Tx,
// idem.Conn, idem.Runner) on any other. Its methods take the suite's
// handles (handles.go); the Store's others (Table, Dialect, ...) are its
// own.
type store struct {
	*idem.Store
	onSQL bool // the target's DB is SQL's
}

// onDriver is s called through the target's driver.
func (e *env) onDriver(s *idem.Store) *store {
	_, onSQL := e.db.(*sqlPool)
	return &store{Store: s, onSQL: onSQL}
}

func (s *store) Do(ctx context.Context, tx txn, req idem.Request, fn func(ctx context.Context) (idem.Response, error)) (idem.Result, error) {
	if !s.onSQL {
		return s.DoOn(ctx, txOf(tx), req, fn)
	}
	return s.Store.Do(ctx, sqlOf(tx), req, fn)
}

func (s *store) Apply(ctx context.Context, tx txn, req idem.Request, resp idem.Response, fn func(ctx context.Context) error) (idem.Result, error) {
	if !s.onSQL {
		return s.ApplyOn(ctx, txOf(tx), req, resp, fn)
	}
	return s.Store.Apply(ctx, sqlOf(tx), req, resp, fn)
}

func (s *store) Begin(ctx context.Context, db pool, req idem.Request) (*claim, *idem.Result, error) {
	var (
		c      *idem.Claim
		replay *idem.Result
		err    error
	)
	if !s.onSQL {
		c, replay, err = s.BeginOn(ctx, runnerOf(db), req)
	} else {
		c, replay, err = s.Store.Begin(ctx, sqlDBOf(db), req)
	}
	if c == nil {
		return nil, replay, err
	}
	return &claim{Claim: c, onSQL: s.onSQL}, nil, nil
}

func (s *store) Migrate(ctx context.Context, db handle) error {
	if !s.onSQL {
		return s.MigrateOn(ctx, connOf(db))
	}
	return s.Store.Migrate(ctx, sqlOf(db))
}

func (s *store) Purge(ctx context.Context, db pool, batch int) (int64, error) {
	if !s.onSQL {
		return s.PurgeOn(ctx, runnerOf(db), batch)
	}
	return s.Store.Purge(ctx, sqlDBOf(db), batch)
}

func (s *store) PurgeBatch(ctx context.Context, db pool, limit int) (int64, error) {
	if !s.onSQL {
		return s.PurgeBatchOn(ctx, runnerOf(db), limit)
	}
	return s.Store.PurgeBatch(ctx, sqlDBOf(db), limit)
}

func (s *store) Inspect(ctx context.Context, db handle, scope, key string) (*idem.Record, error) {
	if !s.onSQL {
		return s.InspectOn(ctx, connOf(db), scope, key)
	}
	return s.Store.Inspect(ctx, sqlOf(db), scope, key)
}

func (s *store) InspectKey(ctx context.Context, db handle, key string, limit int) ([]idem.Record, error) {
	if !s.onSQL {
		return s.InspectKeyOn(ctx, connOf(db), key, limit)
	}
	return s.Store.InspectKey(ctx, sqlOf(db), key, limit)
}

func (s *store) Reseal(ctx context.Context, db pool, batch int) (int64, error) {
	if !s.onSQL {
		return s.ResealOn(ctx, runnerOf(db), batch)
	}
	return s.Store.Reseal(ctx, sqlDBOf(db), batch)
}

func (s *store) Stats(ctx context.Context, db handle) (idem.Stats, error) {
	if !s.onSQL {
		return s.StatsOn(ctx, connOf(db))
	}
	return s.Store.Stats(ctx, sqlOf(db))
}

// claim is a claim from store.Begin (or a middleware's), called through
// the same driver; Token and RelayKey are the Claim's own.
type claim struct {
	*idem.Claim
	onSQL bool
}

func (c *claim) Extend(ctx context.Context, db handle, d time.Duration) error {
	if !c.onSQL {
		return c.ExtendOn(ctx, connOf(db), d)
	}
	return c.Claim.Extend(ctx, sqlOf(db), d)
}

func (c *claim) Complete(ctx context.Context, tx handle, resp idem.Response) error {
	if !c.onSQL {
		return c.CompleteOn(ctx, txOf(tx), resp)
	}
	return c.Claim.Complete(ctx, sqlOf(tx), resp)
}

func (c *claim) Release(ctx context.Context, db handle) error {
	if !c.onSQL {
		return c.ReleaseOn(ctx, connOf(db))
	}
	return c.Claim.Release(ctx, sqlOf(db))
}

// The handle behind a suite handle, for idem's database/sql methods or
// those named with On: nil for nil, and for a handle of the other kind,
// which idem then refuses.

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

// txOf is h as idem's Tx: a transaction a Runner began.
func txOf(h handle) idem.Tx {
	if t, ok := h.(runnerTx); ok {
		return t.tx
	}
	return nil
}

// connOf is h as idem's Conn: a Runner, or a transaction it began.
func connOf(h handle) idem.Conn {
	switch h := h.(type) {
	case *runnerPool:
		return h.connStatements.db
	case runnerTx:
		return h.tx
	}
	return nil
}

// runnerOf is db's Runner, with the driver's default transaction options.
func runnerOf(db pool) idem.Runner {
	if p, ok := db.(*runnerPool); ok {
		return p.runner(nil)
	}
	return nil
}
